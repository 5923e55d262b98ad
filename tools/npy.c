/* npy.c - .npy files <-> kiln tensors. */
#include "npy.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    kiln_dtype dt;
    const char *descr;
} descrs[] = {
    {KILN_DTYPE_BOOL, "|b1"},          {KILN_DTYPE_INT8, "|i1"},           {KILN_DTYPE_UINT8, "|u1"},
    {KILN_DTYPE_INT16, "<i2"},         {KILN_DTYPE_UINT16, "<u2"},         {KILN_DTYPE_INT32, "<i4"},
    {KILN_DTYPE_UINT32, "<u4"},        {KILN_DTYPE_INT64, "<i8"},          {KILN_DTYPE_UINT64, "<u8"},
    {KILN_DTYPE_FLOAT16, "<f2"},       {KILN_DTYPE_FLOAT32, "<f4"},        {KILN_DTYPE_FLOAT64, "<f8"},
    {KILN_DTYPE_COMPLEX64, "<c8"},     {KILN_DTYPE_COMPLEX128, "<c16"},    {KILN_DTYPE_BFLOAT16, "bfloat16"},
    {KILN_DTYPE_FLOAT8E4M3FN, "float8_e4m3fn"}, {KILN_DTYPE_FLOAT8E4M3FNUZ, "float8_e4m3fnuz"},
    {KILN_DTYPE_FLOAT8E5M2, "float8_e5m2"},     {KILN_DTYPE_FLOAT8E5M2FNUZ, "float8_e5m2fnuz"},
    {KILN_DTYPE_FLOAT8E8M0, "float8_e8m0fnu"},  {KILN_DTYPE_FLOAT4E2M1, "float4_e2m1fn"},
    {KILN_DTYPE_INT4, "int4"},         {KILN_DTYPE_UINT4, "uint4"},        {KILN_DTYPE_INT2, "int2"},
    {KILN_DTYPE_UINT2, "uint2"},
};

/* alternative spellings numpy writes for the same types */
static kiln_dtype dtype_of_descr(const char *d)
{
    for (size_t i = 0; i < sizeof descrs / sizeof descrs[0]; i++)
        if (!strcmp(descrs[i].descr, d)) return descrs[i].dt;
    if (!strcmp(d, "<b1") || !strcmp(d, "?")) return KILN_DTYPE_BOOL;
    if (!strcmp(d, "<i1")) return KILN_DTYPE_INT8;
    if (!strcmp(d, "<u1")) return KILN_DTYPE_UINT8;
    return KILN_DTYPE_UNDEFINED;
}

/* finds 'key': in the header dict and returns a pointer just past the colon */
static const char *dict_value(const char *h, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(h, pat);
    if (!p) return NULL;
    p = strchr(p + strlen(pat), ':');
    if (!p) return NULL;
    p++;
    while (isspace((unsigned char)*p)) p++;
    return p;
}

static size_t utf8_encode(uint32_t c, char *o)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xc0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3f)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3f)); o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f)); o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* decodes one UTF-8 code point; returns bytes consumed (1 for invalid bytes, taken as-is) */
static size_t utf8_decode(const unsigned char *s, uint32_t *c)
{
    if (s[0] < 0x80) { *c = s[0]; return 1; }
    if ((s[0] & 0xe0) == 0xc0 && (s[1] & 0xc0) == 0x80) { *c = ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f); return 2; }
    if ((s[0] & 0xf0) == 0xe0 && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80) {
        *c = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
        return 3;
    }
    if ((s[0] & 0xf8) == 0xf0 && (s[1] & 0xc0) == 0x80 && (s[2] & 0xc0) == 0x80 && (s[3] & 0xc0) == 0x80) {
        *c = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) | ((uint32_t)(s[2] & 0x3f) << 6) |
             (s[3] & 0x3f);
        return 4;
    }
    *c = s[0];
    return 1;
}

int npy_read(const char *path, kiln_dtype hint, kiln_value **out, char *why, size_t why_size)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, why_size, "cannot open %s", path);
        return 1;
    }
    unsigned char pre[12];
    int rc = 1;
    char *header = NULL;
    void *data = NULL;
    char **strs = NULL;
    int64_t n = 0;
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6)) {
        snprintf(why, why_size, "%s is not a .npy file", path);
        goto out;
    }
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) goto trunc;
        hlen = pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 8, 1, 4, f) != 4) goto trunc;
        hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    } else {
        snprintf(why, why_size, "%s: unsupported .npy version %d", path, pre[6]);
        goto out;
    }
    if (hlen > (1u << 20)) {
        snprintf(why, why_size, "%s: header too large", path);
        goto out;
    }
    header = malloc(hlen + 1);
    if (!header || fread(header, 1, hlen, f) != hlen) goto trunc;
    header[hlen] = '\0';
    const char *p = dict_value(header, "descr");
    char descr[64] = "";
    if (!p || *p != '\'' || sscanf(p + 1, "%63[^']", descr) != 1) {
        snprintf(why, why_size, "%s: no descr in header", path);
        goto out;
    }
    p = dict_value(header, "fortran_order");
    if (p && !strncmp(p, "True", 4)) {
        snprintf(why, why_size, "%s: Fortran-ordered arrays are not supported", path);
        goto out;
    }
    p = dict_value(header, "shape");
    if (!p || *p != '(') {
        snprintf(why, why_size, "%s: no shape in header", path);
        goto out;
    }
    int64_t dims[KILN_MAX_RANK];
    int rank = 0;
    p++;
    n = 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        long long d = strtoll(p, &end, 10);
        if (end == p || d < 0 || rank == KILN_MAX_RANK) {
            snprintf(why, why_size, "%s: bad shape in header", path);
            goto out;
        }
        if (d && n > INT64_MAX / d) {
            snprintf(why, why_size, "%s: shape overflows", path);
            goto out;
        }
        dims[rank++] = d;
        n *= d;
        p = end;
    }
    bool unicode = (descr[0] == '<' || descr[0] == '|') && descr[1] == 'U';
    kiln_dtype dt = unicode ? KILN_DTYPE_STRING : dtype_of_descr(descr);
    bool raw1 = !strcmp(descr + 1, "V1") || !strcmp(descr, "<f1"), raw2 = !strcmp(descr + 1, "V2");
    if (dt == KILN_DTYPE_UNDEFINED && hint != KILN_DTYPE_STRING && ((raw1 && kiln_dtype_size(hint) == 1) ||
                                                                  (raw2 && kiln_dtype_size(hint) == 2)))
        dt = hint;
    if (dt == KILN_DTYPE_UNDEFINED) {
        snprintf(why, why_size, "%s: unsupported dtype '%s'", path, descr);
        goto out;
    }
    if (unicode) {
        long width = strtol(descr + 2, NULL, 10);
        if (width < 0 || width > (1 << 20)) goto trunc;
        uint32_t *u = malloc((size_t)width * 4 + 4);
        strs = calloc((size_t)n + 1, sizeof *strs);
        if (!u || !strs) {
            free(u);
            goto trunc;
        }
        for (int64_t i = 0; i < n; i++) {
            if (fread(u, 4, (size_t)width, f) != (size_t)width) {
                free(u);
                goto trunc;
            }
            char *s = malloc((size_t)width * 4 + 1);
            if (!s) {
                free(u);
                goto trunc;
            }
            size_t at = 0;
            for (long k = 0; k < width && u[k]; k++) at += utf8_encode(u[k], s + at);
            s[at] = '\0';
            strs[i] = s;
        }
        free(u);
        rc = kiln_value_create_tensor(dt, rank, dims, strs, (size_t)n * sizeof(char *), out) != KILN_OK;
        if (rc) snprintf(why, why_size, "%s: cannot create tensor", path);
        goto out;
    }
    size_t nbytes = (size_t)n * kiln_dtype_size(dt);
    data = malloc(nbytes ? nbytes : 1);
    if (!data || fread(data, 1, nbytes, f) != nbytes) goto trunc;
    rc = kiln_value_create_tensor(dt, rank, dims, data, nbytes, out) != KILN_OK;
    if (rc) snprintf(why, why_size, "%s: cannot create tensor", path);
    goto out;
trunc:
    snprintf(why, why_size, "%s: truncated or unreadable", path);
    rc = 1;
out:
    if (strs)
        for (int64_t i = 0; i < n; i++) free(strs[i]);
    free(strs);
    free(data);
    free(header);
    fclose(f);
    return rc;
}

int npy_write(const char *path, const kiln_value *v, char *why, size_t why_size)
{
    if (kiln_value_kind_of(v) != KILN_VALUE_TENSOR) {
        snprintf(why, why_size, "only tensors can be written as .npy");
        return 1;
    }
    kiln_dtype dt = kiln_value_dtype(v);
    int64_t n = kiln_value_numel(v);
    char descr[32] = "";
    size_t width = 0;
    if (dt == KILN_DTYPE_STRING) {
        char *const *s = kiln_value_data(v);
        for (int64_t i = 0; i < n; i++) {
            size_t len = 0;
            uint32_t c;
            for (const unsigned char *p = (const unsigned char *)s[i]; *p; p += utf8_decode(p, &c)) len++;
            if (len > width) width = len;
        }
        if (!width) width = 1;
        snprintf(descr, sizeof descr, "<U%zu", width);
    } else {
        for (size_t i = 0; i < sizeof descrs / sizeof descrs[0]; i++)
            if (descrs[i].dt == dt) snprintf(descr, sizeof descr, "%s", descrs[i].descr);
    }
    if (!*descr) {
        snprintf(why, why_size, "dtype %s cannot be written as .npy", kiln_dtype_name(dt));
        return 1;
    }
    char dict[512];
    int at = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int k = 0; k < kiln_value_rank(v); k++)
        at += snprintf(dict + at, sizeof dict - (size_t)at, "%lld,%s", (long long)kiln_value_dims(v)[k],
                       k + 1 < kiln_value_rank(v) ? " " : "");
    at += snprintf(dict + at, sizeof dict - (size_t)at, "), }");
    /* pad with spaces so that magic + length + header ends on a 64-byte boundary, newline last */
    size_t total = 10 + (size_t)at + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)at + pad + 1;
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(why, why_size, "cannot write %s", path);
        return 1;
    }
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)at, f) == (size_t)at;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    if (dt == KILN_DTYPE_STRING) {
        char *const *s = kiln_value_data(v);
        uint32_t *u = calloc(width, 4);
        ok = ok && u;
        for (int64_t i = 0; ok && i < n; i++) {
            memset(u, 0, width * 4);
            size_t k = 0;
            for (const unsigned char *p = (const unsigned char *)s[i]; *p && k < width; k++) p += utf8_decode(p, &u[k]);
            ok = fwrite(u, 4, width, f) == width;
        }
        free(u);
    } else if (kiln_value_nbytes(v)) {
        ok = ok && fwrite(kiln_value_data(v), 1, kiln_value_nbytes(v), f) == kiln_value_nbytes(v);
    }
    if (fclose(f) || !ok) {
        snprintf(why, why_size, "error writing %s", path);
        return 1;
    }
    return 0;
}
