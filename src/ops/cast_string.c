/* cast_string.c - string operators: StringNormalizer, StringSplit, StringConcat, RegexFullMatch
 * (POSIX extended regexes, with RE2's common escapes translated) and TfIdfVectorizer. Case
 * mapping and character classes are ASCII-only. */
#include <ctype.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ops/cast_internal.h"
#include "ops/semantics.h"
#include "ops/util.h"

static const char *str_at(const kiln_value *v, int64_t i)
{
    return ((char *const *)v->data)[i];
}

static kiln_status require_string(kiln_infer_ctx *c, int i)
{
    const kiln_type *t = kiln_infer_in(c, i);
    if (!t) return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d is missing", i);
    if (t->dtype && t->dtype != KILN_DTYPE_STRING)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "input %d must be a string tensor, is %s", i,
                               kiln_dtype_name(t->dtype));
    return KILN_OK;
}

/* ---- StringNormalizer: drops stopwords, then changes case; X is [C] or [1, C] ---- */

kiln_status kiln_cast_strnorm_infer(kiln_infer_ctx *c)
{
    KILN_TRY(require_string(c, 0));
    const char *action = kiln_attr_string(kiln_infer_node(c), "case_change_action", "NONE");
    if (strcmp(action, "NONE") && strcmp(action, "LOWER") && strcmp(action, "UPPER"))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "case_change_action '%s' is not NONE, LOWER or UPPER", action);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_STRING);
    if (x->rank == 2) KILN_TRY(kiln_infer_require_equal(c, x->dims[0], kiln_dim_const(1), "X dim 0"));
    else if (x->rank != 1)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be [C] or [1, C], has rank %d", x->rank);
    kiln_dim dims[2] = {kiln_dim_const(1), kiln_infer_fresh(c, "strnorm")};
    return x->rank == 1 ? kiln_infer_set_out(c, 0, KILN_DTYPE_STRING, 1, &dims[1])
                        : kiln_infer_set_out(c, 0, KILN_DTYPE_STRING, 2, dims);
}

static bool is_stopword(const kiln_node *n, const char *s, bool case_sensitive)
{
    const kiln_attr *a = kiln_node_attr_typed(n, "stopwords", KILN_ATTR_STRINGS);
    for (int k = 0; a && k < a->n; k++)
        if (case_sensitive ? !strcmp(a->strings[k], s) : !strcasecmp(a->strings[k], s)) return true;
    return false;
}

kiln_status kiln_cast_strnorm_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    bool case_sensitive = kiln_attr_int(n, "is_case_sensitive", 0) != 0;
    const char *action = kiln_attr_string(n, "case_change_action", "NONE");
    bool lower = !strcmp(action, "LOWER"), upper = !strcmp(action, "UPPER");
    /* like ONNX's reference, empty strings are dropped too; an empty result holds one "" */
    int64_t kept = 0;
    for (int64_t i = 0; i < X->numel; i++)
        if (*str_at(X, i) && !is_stopword(n, str_at(X, i), case_sensitive)) kept++;
    int64_t dims[2] = {1, kept ? kept : 1};
    kiln_value *Y;
    KILN_TRY(kiln_run_alloc_out(c, 0, KILN_DTYPE_STRING, X->rank, X->rank == 1 ? &dims[1] : dims, &Y));
    int64_t j = 0;
    for (int64_t i = 0; i < X->numel; i++) {
        const char *s = str_at(X, i);
        if (!*s || is_stopword(n, s, case_sensitive)) continue;
        size_t len = strlen(s);
        KILN_TRY(kiln_tensor_set_string(Y, j, s, len, kiln_run_err(c)));
        char *d = ((char **)Y->data)[j++];
        for (size_t k = 0; k < len; k++)
            d[k] = (char)(lower ? tolower((unsigned char)d[k]) : upper ? toupper((unsigned char)d[k]) : d[k]);
    }
    return KILN_OK;
}

/* ---- StringSplit ---- */

kiln_status kiln_cast_strsplit_infer(kiln_infer_ctx *c)
{
    KILN_TRY(require_string(c, 0));
    const kiln_type *x = kiln_infer_in(c, 0);
    if (kiln_attr_int(kiln_infer_node(c), "maxsplit", 0) < 0)
        return kiln_infer_fail(c, KILN_ERR_MODEL, "maxsplit must be positive");
    if (x->rank < 0) {
        KILN_TRY(kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_STRING));
        return kiln_infer_set_out_unknown(c, 1, KILN_DTYPE_INT64);
    }
    if (x->rank >= KILN_MAX_RANK) return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "X rank %d too large", x->rank);
    kiln_dim dims[KILN_MAX_RANK];
    memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
    dims[x->rank] = kiln_infer_fresh(c, "splits");
    KILN_TRY(kiln_infer_set_out(c, 0, KILN_DTYPE_STRING, x->rank + 1, dims));
    return kiln_infer_set_out(c, 1, KILN_DTYPE_INT64, x->rank, x->dims);
}

/* Python's whitespace, ASCII part */
static bool py_space(char ch)
{
    return ch == ' ' || (ch >= '\t' && ch <= '\r') || (ch >= 0x1c && ch <= 0x1f);
}

typedef struct span {
    const char *p;
    size_t len;
} span;

/* Python's str.split(delim or None, maxsplit; maxsplit < 0: unlimited): returns the number of
 * parts and, when `parts` is not NULL, stores them there. */
static int64_t split_str(const char *s, const char *delim, int64_t maxsplit, span *parts)
{
    int64_t n = 0;
    size_t dl = delim ? strlen(delim) : 0;
    if (dl) {
        const char *p = s;
        for (;;) {
            const char *q = (maxsplit < 0 || n < maxsplit) ? strstr(p, delim) : NULL;
            size_t len = q ? (size_t)(q - p) : strlen(p);
            if (parts) parts[n] = (span){p, len};
            n++;
            if (!q) return n;
            p = q + dl;
        }
    }
    const char *p = s;
    for (;;) {
        while (*p && py_space(*p)) p++;
        if (!*p) return n;
        const char *q = p;
        if (maxsplit >= 0 && n == maxsplit) q += strlen(q); /* the rest, trailing space kept */
        else
            while (*q && !py_space(*q)) q++;
        if (parts) parts[n] = (span){p, (size_t)(q - p)};
        n++;
        p = q;
    }
}

kiln_status kiln_cast_strsplit_run(kiln_run_ctx *c)
{
    const kiln_node *n = kiln_run_node(c);
    const kiln_value *X = kiln_run_in(c, 0);
    const char *delim = kiln_attr_string(n, "delimiter", "");
    int64_t maxsplit = kiln_node_attr(n, "maxsplit") ? kiln_attr_int(n, "maxsplit", 0) : -1;
    int64_t widest = 0;
    for (int64_t i = 0; i < X->numel; i++) {
        int64_t k = split_str(str_at(X, i), delim, maxsplit, NULL);
        if (k > widest) widest = k;
    }
    int64_t dims[KILN_MAX_RANK];
    memcpy(dims, X->dims, (size_t)X->rank * sizeof *dims);
    dims[X->rank] = widest;
    kiln_value *Y, *Z = kiln_run_out(c, 1);
    KILN_TRY(kiln_run_alloc_out(c, 0, KILN_DTYPE_STRING, X->rank + 1, dims, &Y));
    span *parts = calloc((size_t)widest + 1, sizeof *parts);
    if (!parts) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
    kiln_status st = KILN_OK;
    for (int64_t i = 0; i < X->numel && !st; i++) {
        int64_t k = split_str(str_at(X, i), delim, maxsplit, parts);
        if (Z) ((int64_t *)Z->data)[i] = k;
        for (int64_t j = 0; j < k && !st; j++)
            st = kiln_tensor_set_string(Y, i * widest + j, parts[j].p, parts[j].len, kiln_run_err(c));
    }
    free(parts);
    return st;
}

/* ---- StringConcat: broadcasting concatenation ---- */

kiln_status kiln_cast_strconcat_infer(kiln_infer_ctx *c)
{
    KILN_TRY(require_string(c, 0));
    KILN_TRY(require_string(c, 1));
    KILN_TRY(kiln_infer_max_inputs(c, 2));
    return kiln_infer_elementwise(c, KILN_DTYPE_STRING);
}

kiln_status kiln_cast_strconcat_run(kiln_run_ctx *c)
{
    const kiln_value *A = kiln_run_in(c, 0), *B = kiln_run_in(c, 1);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t st[4][KILN_MAX_RANK];
    kiln_bcast_strides(Y->rank, Y->dims, A->rank, A->dims, st[0]);
    kiln_bcast_strides(Y->rank, Y->dims, B->rank, B->dims, st[1]);
    kiln_iter it;
    kiln_iter_init(&it, Y->rank, Y->dims, 2, st);
    for (int64_t i = 0; i < Y->numel; i++, kiln_iter_next(&it)) {
        const char *a = str_at(A, it.off[0]), *b = str_at(B, it.off[1]);
        size_t la = strlen(a), lb = strlen(b);
        char *ab = malloc(la + lb + 1);
        if (!ab) return kiln_run_fail(c, KILN_ERR_NOMEM, "out of memory");
        memcpy(ab, a, la);
        memcpy(ab + la, b, lb);
        kiln_status rc = kiln_tensor_set_string(Y, i, ab, la + lb, kiln_run_err(c));
        free(ab);
        if (rc) return rc;
    }
    return KILN_OK;
}

/* ---- RegexFullMatch ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s)
{
    size_t len = strlen(s);
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->n + len + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, len + 1);
    b->n += len;
}

/* Class escapes of RE2 as POSIX bracket contents (`in`) or whole expressions (`out`). */
static const struct {
    char esc;
    const char *in, *out;
} class_escapes[] = {
    {'d', "0-9", "[0-9]"},
    {'w', "[:alnum:]_", "[[:alnum:]_]"},
    {'s', "[:space:]", "[[:space:]]"},
    {'D', NULL, "[^0-9]"},
    {'W', NULL, "[^[:alnum:]_]"},
    {'S', NULL, "[^[:space:]]"},
};

static const char *escape_char(char e)
{
    switch (e) {
    case 'n': return "\n";
    case 't': return "\t";
    case 'r': return "\r";
    case 'f': return "\f";
    case 'v': return "\v";
    default: return NULL;
    }
}

/* Translates an RE2 pattern into a POSIX extended regex: \d \w \s (and negations), \n \t ...,
 * escapes inside brackets and (?: groups. \b and \B pass through (glibc supports them).
 * Returns false with *why for constructs POSIX cannot express (lazy quantifiers, flags,
 * lookarounds, negated classes inside brackets). */
static bool re2_to_posix(const char *re, sbuf *out, const char **why)
{
    char one[2] = {0, 0};
    for (const char *p = re; *p; p++) {
        if (*p == '(' && p[1] == '?') {
            if (p[2] != ':') return *why = "(? groups other than (?: are not supported", false;
            sb_put(out, "(");
            p += 2;
            continue;
        }
        if ((*p == '*' || *p == '+' || *p == '?' || *p == '}') && p[1] == '?')
            return *why = "lazy quantifiers are not supported", false;
        if (*p == '\\' && p[1]) {
            p++;
            const char *lit = escape_char(*p);
            bool done = false;
            for (size_t k = 0; k < sizeof class_escapes / sizeof class_escapes[0] && !done; k++)
                if (class_escapes[k].esc == *p) sb_put(out, class_escapes[k].out), done = true;
            if (done) continue;
            if (lit) sb_put(out, lit);
            else if (isalnum((unsigned char)*p) && *p != 'b' && *p != 'B')
                return *why = "unsupported escape", false;
            else if (*p == 'b' || *p == 'B' || strchr(".[]{}()\\*+?^$|", *p)) {
                one[0] = *p;
                sb_put(out, "\\");
                sb_put(out, one);
            } else {
                one[0] = *p;
                sb_put(out, one);
            }
            continue;
        }
        if (*p != '[') {
            one[0] = *p;
            sb_put(out, one);
            continue;
        }
        /* bracket: collect items, then emit with ']' first and '-' last as POSIX needs */
        p++;
        bool neg = *p == '^', dash = false, close = false;
        if (neg) p++;
        sbuf items = {0};
        for (bool first = true; *p && (*p != ']' || first); p++, first = false) {
            if (*p == ']') close = true;
            else if (*p == '[' && p[1] == ':') {
                const char *e = strstr(p + 2, ":]");
                if (!e) break;
                char cls[32];
                size_t len = (size_t)(e + 2 - p);
                if (len >= sizeof cls) break;
                memcpy(cls, p, len);
                cls[len] = '\0';
                sb_put(&items, cls);
                p = e + 1;
            } else if (*p == '\\' && p[1]) {
                p++;
                const char *lit = escape_char(*p);
                const char *cls = NULL;
                for (size_t k = 0; k < sizeof class_escapes / sizeof class_escapes[0]; k++)
                    if (class_escapes[k].esc == *p) {
                        cls = class_escapes[k].in;
                        if (!cls) {
                            free(items.p);
                            return *why = "negated class escapes inside brackets are not supported", false;
                        }
                    }
                if (cls) sb_put(&items, cls);
                else if (lit) sb_put(&items, lit);
                else if (*p == '-') dash = true;
                else if (*p == ']') close = true;
                else one[0] = *p, sb_put(&items, one);
            } else if (*p == '-' && (first || p[1] == ']')) {
                dash = true;
            } else {
                one[0] = *p;
                sb_put(&items, one);
            }
        }
        if (*p != ']') {
            free(items.p);
            return *why = "unterminated bracket expression", false;
        }
        sb_put(out, neg ? "[^" : "[");
        if (close) sb_put(out, "]");
        if (items.p) sb_put(out, items.p);
        if (dash) sb_put(out, "-");
        sb_put(out, "]");
        bool oom = items.oom;
        free(items.p);
        if (oom) out->oom = true;
    }
    if (!out->p) sb_put(out, "");
    return true;
}

/* Compiles the node's pattern; *why receives a reason on failure. */
static bool regex_compile(const kiln_node *n, regex_t *re, const char **why)
{
    sbuf posix = {0};
    bool ok = re2_to_posix(kiln_attr_string(n, "pattern", ""), &posix, why);
    if (ok && posix.oom) ok = false, *why = "out of memory";
    if (ok && regcomp(re, posix.p, REG_EXTENDED) != 0) ok = false, *why = "invalid pattern";
    free(posix.p);
    return ok;
}

kiln_status kiln_cast_regex_infer(kiln_infer_ctx *c)
{
    KILN_TRY(require_string(c, 0));
    regex_t re;
    const char *why = NULL;
    if (!regex_compile(kiln_infer_node(c), &re, &why))
        return kiln_infer_fail(c, KILN_ERR_UNSUPPORTED, "pattern '%s': %s",
                               kiln_attr_string(kiln_infer_node(c), "pattern", ""), why);
    regfree(&re);
    return kiln_cast_infer_like(c, 0, 0, KILN_DTYPE_BOOL);
}

kiln_status kiln_cast_regex_run(kiln_run_ctx *c)
{
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    regex_t re;
    const char *why = NULL;
    if (!regex_compile(kiln_run_node(c), &re, &why)) return kiln_run_fail(c, KILN_ERR_UNSUPPORTED, "%s", why);
    for (int64_t i = 0; i < X->numel; i++) {
        /* POSIX matching is leftmost-longest: a full match, if any, is the match found */
        regmatch_t m;
        const char *s = str_at(X, i);
        ((uint8_t *)Y->data)[i] = regexec(&re, s, 1, &m, 0) == 0 && m.rm_so == 0 && (size_t)m.rm_eo == strlen(s);
    }
    regfree(&re);
    return KILN_OK;
}

/* ---- TfIdfVectorizer ---- */

typedef struct tfidf {
    int64_t min_n, max_n, max_skip, out_size;
    const int64_t *counts, *indexes, *pool_i;
    const char *const *pool_s;
    int n_counts, n_indexes, n_pool, n_weights;
    const float *weights;
} tfidf;

static kiln_status tfidf_of(const kiln_node *n, tfidf *t, const char **why)
{
    memset(t, 0, sizeof *t);
    t->min_n = kiln_attr_int(n, "min_gram_length", 0);
    t->max_n = kiln_attr_int(n, "max_gram_length", 0);
    t->max_skip = kiln_attr_int(n, "max_skip_count", 0);
    t->counts = kiln_attr_ints(n, "ngram_counts", &t->n_counts);
    t->indexes = kiln_attr_ints(n, "ngram_indexes", &t->n_indexes);
    t->pool_i = kiln_attr_ints(n, "pool_int64s", &t->n_pool);
    const kiln_attr *ps = kiln_node_attr_typed(n, "pool_strings", KILN_ATTR_STRINGS);
    if (ps && ps->n) t->pool_s = ps->strings, t->n_pool = ps->n;
    t->weights = kiln_attr_floats(n, "weights", &t->n_weights);
    const char *mode = kiln_attr_string(n, "mode", "");
    if (strcmp(mode, "TF") && strcmp(mode, "IDF") && strcmp(mode, "TFIDF")) return *why = "mode must be TF, IDF or TFIDF", KILN_ERR_MODEL;
    if (t->min_n < 1 || t->max_n < t->min_n || t->max_skip < 0)
        return *why = "need 1 <= min_gram_length <= max_gram_length and max_skip_count >= 0", KILN_ERR_MODEL;
    for (int k = 0; k < t->n_counts; k++)
        if (t->counts[k] < 0 || t->counts[k] > t->n_pool || (k && t->counts[k] < t->counts[k - 1]))
            return *why = "ngram_counts must be increasing offsets into the pool", KILN_ERR_MODEL;
    for (int k = 0; k < t->n_indexes; k++) {
        if (t->indexes[k] < 0 || t->indexes[k] == INT64_MAX)
            return *why = "ngram_indexes must be non-negative and finite", KILN_ERR_MODEL;
        if (t->indexes[k] + 1 > t->out_size) t->out_size = t->indexes[k] + 1;
    }
    if (t->n_weights && t->n_weights < t->out_size) return *why = "weights shorter than the output", KILN_ERR_MODEL;
    return KILN_OK;
}

kiln_status kiln_cast_tfidf_infer(kiln_infer_ctx *c)
{
    tfidf t;
    const char *why = NULL;
    kiln_status st = tfidf_of(kiln_infer_node(c), &t, &why);
    if (st) return kiln_infer_fail(c, st, "%s", why);
    const kiln_type *x = kiln_infer_in(c, 0);
    if (!x) return kiln_infer_fail(c, KILN_ERR_MODEL, "input X is missing");
    if (x->dtype && (t.pool_s ? x->dtype != KILN_DTYPE_STRING
                              : x->dtype != KILN_DTYPE_INT32 && x->dtype != KILN_DTYPE_INT64))
        return kiln_infer_fail(c, KILN_ERR_MODEL, "X of type %s does not match the pool", kiln_dtype_name(x->dtype));
    if (x->rank < 0) return kiln_infer_set_out_unknown(c, 0, KILN_DTYPE_FLOAT32);
    if (x->rank != 1 && x->rank != 2)
        return kiln_infer_fail(c, KILN_ERR_SHAPE, "X must be [C] or [N, C], has rank %d", x->rank);
    kiln_dim dims[2] = {x->dims[0], kiln_dim_const(t.out_size)};
    return x->rank == 1 ? kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 1, &dims[1])
                        : kiln_infer_set_out(c, 0, KILN_DTYPE_FLOAT32, 2, dims);
}

/* Whether X[row, start + k * skip] for k < len equals pool[off .. off + len). */
static bool gram_match(const tfidf *t, const kiln_value *X, int64_t base, int64_t skip, int64_t len, int64_t off)
{
    for (int64_t k = 0; k < len; k++) {
        int64_t i = base + k * skip;
        if (t->pool_s ? strcmp(str_at(X, i), t->pool_s[off + k]) != 0
                      : kiln_load_i64(X->dtype, X->data, i) != t->pool_i[off + k])
            return false;
    }
    return true;
}

/* Output slot of the first pool n-gram of length len equal to the one at base, or -1. Pool
 * n-grams are numbered in pool order across all lengths; number k maps to ngram_indexes[k]. */
static int64_t gram_find(const tfidf *t, const kiln_value *X, int64_t base, int64_t skip, int64_t len)
{
    int64_t id = 0;
    for (int g = 0; g < t->n_counts; g++) {
        int64_t n = g + 1, lo = t->counts[g], hi = g + 1 < t->n_counts ? t->counts[g + 1] : t->n_pool;
        for (int64_t off = lo; off + n <= hi; off += n, id++)
            if (n == len && gram_match(t, X, base, skip, len, off)) return id < t->n_indexes ? t->indexes[id] : -1;
    }
    return -1;
}

kiln_status kiln_cast_tfidf_run(kiln_run_ctx *c)
{
    tfidf t;
    const char *why = NULL;
    tfidf_of(kiln_run_node(c), &t, &why);
    const kiln_value *X = kiln_run_in(c, 0);
    kiln_value *Y = kiln_run_out(c, 0);
    int64_t rows = X->rank == 2 ? X->dims[0] : 1, C = X->dims[X->rank - 1];
    if (t.out_size == 0) return KILN_OK; /* empty Y: no data pointer to index */
    float *out = Y->data;
    const char *mode = kiln_attr_string(kiln_run_node(c), "mode", "");
    for (int64_t r = 0; r < rows; r++) {
        float *f = out + r * t.out_size;
        /* unigrams count once; longer n-grams once per skip distance */
        for (int64_t skip = 1; skip <= t.max_skip + 1; skip++)
            for (int64_t start = 0; start < C; start++)
                for (int64_t len = skip == 1 ? t.min_n : (t.min_n > 2 ? t.min_n : 2); len <= t.max_n; len++) {
                    if (start + (len - 1) * skip >= C) break;
                    int64_t slot = gram_find(&t, X, r * C + start, skip, len);
                    if (slot >= 0) f[slot] += 1;
                }
        for (int64_t k = 0; k < t.out_size; k++) {
            float w = t.n_weights ? t.weights[k] : 1.0f;
            if (!strcmp(mode, "IDF")) f[k] = f[k] > 0 ? w : 0;
            else if (!strcmp(mode, "TFIDF")) f[k] *= w;
        }
    }
    return KILN_OK;
}
