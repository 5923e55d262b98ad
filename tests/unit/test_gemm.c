/* test_gemm.c - kiln_sgemm_ex against a triple loop in double: odd, tiny and empty shapes, every
 * transpose combination, alpha/beta and epilogue variants, padded strides, each kernel level this
 * CPU has, pools of 1, 2 and 3 threads, and two threads sharing one pool; the prepacked-B path
 * must match the plain one bitwise. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/gemm.h"
#define UNIT_SEED 0x9e3779b97f4a7c15ull
#include "unit.h"

/* uniform in +-[0.1, 1): never zero */
static float rnd_val(void)
{
    float v = 0.1f + 0.9f * (float)(unit_rnd() >> 40) / (float)(1 << 24);
    return unit_rnd() & 1 ? v : -v;
}

typedef struct {
    int64_t M, N, K;
    bool ta, tb;
    float alpha, beta;
    const float *bias, *row_bias, *res; /* res [M][N + 1] */
    kiln_gemm_act act;
    float lo, hi; /* KILN_GEMM_ACT_CLIP */
    int64_t lda, ldb, ldc;
} gemm_case;

static const float SENTINEL = 12345.0f;

/* The double-precision reference of a case: want[M][N] and the magnitude bound mag[M][N]. */
static void reference(const gemm_case *t, const float *A, const float *B, const float *C0, double *want,
                      double *mag)
{
    for (int64_t i = 0; i < t->M; i++) {
        for (int64_t j = 0; j < t->N; j++) {
            double acc = 0, m = 0;
            for (int64_t p = 0; p < t->K; p++) {
                double a = t->ta ? A[p * t->lda + i] : A[i * t->lda + p];
                double b = t->tb ? B[j * t->ldb + p] : B[p * t->ldb + j];
                acc += a * b;
                m += fabs(a * b);
            }
            double c0 = C0[i * t->ldc + j];
            double w = t->alpha * acc + (t->beta != 0.0f ? t->beta * c0 : 0.0);
            m = fabs(t->alpha) * m + fabs(t->beta * c0);
            if (t->bias) {
                w += t->bias[j];
                m += fabs(t->bias[j]);
            }
            if (t->row_bias) {
                w += t->row_bias[i];
                m += fabs(t->row_bias[i]);
            }
            if (t->res) {
                w += t->res[i * (t->N + 1) + j];
                m += fabs(t->res[i * (t->N + 1) + j]);
            }
            if (t->act == KILN_GEMM_ACT_RELU && w < 0) w = 0;
            if (t->act == KILN_GEMM_ACT_CLIP) w = w < t->lo ? t->lo : w > t->hi ? t->hi : w;
            want[i * t->N + j] = w;
            mag[i * t->N + j] = m;
        }
    }
}

/* A pack function for kiln_gemm_packed_a_create_from, reading a stored op(A). */
typedef struct {
    const float *A;
    int64_t lda;
    bool ta;
} implicit_a;

static void pack_rows_of_a(void *ctx, float *dst, int64_t p0, int64_t kc, int64_t i0, int64_t m, int w)
{
    const implicit_a *s = ctx;
    for (int64_t r0 = 0; r0 < m; r0 += w, dst += kc * w)
        for (int64_t p = 0; p < kc; p++)
            for (int r = 0; r < w; r++) {
                int64_t i = i0 + r0 + r, k = p0 + p;
                dst[p * w + r] = r0 + r >= m ? 0.0f : s->ta ? s->A[k * s->lda + i] : s->A[i * s->lda + k];
            }
}

/* Runs one case with ctx and compares C (and the padding of C) with the reference. */
static bool check_case(const kiln_gemm_ctx *ctx, const gemm_case *t, const float *A, const float *B,
                       const float *C0, const double *want, const double *mag)
{
    int64_t M = t->M, N = t->N, K = t->K;
    size_t c_len = (size_t)(M * t->ldc);
    float *C = malloc((c_len ? c_len : 1) * sizeof(float));
    if (!C) return false;
    memcpy(C, C0, c_len * sizeof(float));
    if (t->beta == 0.0f) /* beta == 0 must not read C */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * t->ldc + j] = NAN;
    kiln_gemm_epilogue ep = {.bias = t->bias, .row_bias = t->row_bias, .residual = t->res, .ldr = N + 1,
                             .act = t->act, .lo = t->lo, .hi = t->hi};
    kiln_status st = kiln_sgemm_ex(ctx, t->ta, t->tb, M, N, K, t->alpha, A, t->lda, B, t->ldb, t->beta, C, t->ldc,
                                   &ep);
    bool ok = st == KILN_OK;
    /* the same product with op(B) prepacked (on the 2-thread pool only, to save time): bitwise equal */
    kiln_gemm_packed_b *pb = NULL;
    bool try_packed = kiln_threadpool_size(ctx->pool) == 2;
    float *C2 = malloc((c_len ? c_len : 1) * sizeof(float));
    ok = ok && C2 && (!try_packed || kiln_gemm_packed_b_create(ctx, t->tb, K, N, B, t->ldb, &pb) == KILN_OK);
    if (ok && try_packed) {
        memcpy(C2, C0, c_len * sizeof(float));
        if (t->beta == 0.0f)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) C2[i * t->ldc + j] = NAN;
        ok = kiln_sgemm_packed(ctx, t->ta, M, t->alpha, A, t->lda, pb, t->beta, C2, t->ldc, &ep) == KILN_OK &&
             memcmp(C, C2, c_len * sizeof(float)) == 0;
        if (!ok) fprintf(stderr, "prepacked B differs\n");
    }
    if (ok && try_packed && t->alpha == 1.0f && t->beta == 0.0f) { /* A packed by a function: bitwise equal too */
        for (size_t i = 0; i < c_len; i++) C2[i] = (int64_t)(i % (size_t)t->ldc) >= N ? SENTINEL : NAN;
        implicit_a src = {A, t->lda, t->ta};
        kiln_gemm_packed_a *pa = NULL;
        ok = kiln_gemm_packed_a_create_from(ctx, M, K, pack_rows_of_a, &src, &pa) == KILN_OK &&
             kiln_sgemm_packed_ab(ctx, pa, pb, C2, t->ldc, &ep) == KILN_OK && memcmp(C, C2, c_len * sizeof(float)) == 0;
        kiln_gemm_packed_a_free(pa);
        if (!ok) fprintf(stderr, "A packed from a pack function differs\n");
    }
    kiln_gemm_packed_b_free(pb);
    free(C2);
    for (int64_t i = 0; i < M && ok; i++) {
        for (int64_t j = 0; j < t->ldc && ok; j++) {
            float got = C[i * t->ldc + j];
            if (j >= N) { /* padding untouched */
                ok = got == SENTINEL;
                continue;
            }
            double w = want[i * N + j], m = mag[i * N + j];
            ok = fabs(got - w) <= 1.2e-7 * (double)(K + 4) * m + 1e-6; /* float rounding bound */
            if (!ok)
                fprintf(stderr, "mismatch at [%lld, %lld]: got %.8g want %.8g\n", (long long)i, (long long)j, got, w);
        }
    }
    if (!ok)
        fprintf(stderr, "case M=%lld N=%lld K=%lld ta=%d tb=%d alpha=%g beta=%g bias=%d act=%d lda=%lld ldb=%lld "
                        "ldc=%lld level=%s threads=%d status=%d\n",
                (long long)M, (long long)N, (long long)K, t->ta, t->tb, t->alpha, t->beta, t->bias != NULL,
                (int)t->act, (long long)t->lda, (long long)t->ldb, (long long)t->ldc,
                kiln_gemm_level_name(ctx->level), kiln_threadpool_size(ctx->pool), (int)st);
    free(C);
    return ok;
}

static const float ALPHAS[] = {1.0f, 1.0f, 0.5f, -2.0f, 0.0f, 1.0f};
static const float BETAS[] = {0.0f, 1.0f, -1.5f, 0.25f, 0.5f, 0.0f};

/* One shape: random operands with padded strides, then every level x pool x transposition. */
static void check_shape(kiln_gemm_ctx *ctxs, int n_ctx, int64_t M, int64_t N, int64_t K, int variant)
{
    int64_t pad = (int64_t)(unit_rnd() % 4);
    int64_t ra = M > K ? M : K, rb = N > K ? N : K; /* rows and row length of A/B, either way */
    int64_t ld = ra + pad, ldbv = rb + pad;
    float *A = malloc((size_t)(ra * ld + 1) * sizeof(float));
    float *B = malloc((size_t)(rb * ldbv + 1) * sizeof(float));
    int64_t ldc = N + (int64_t)(unit_rnd() % 3);
    float *C0 = malloc((size_t)(M * ldc + 1) * sizeof(float));
    float *bias = malloc((size_t)(N + 1) * sizeof(float)), *row_bias = malloc((size_t)(M + 1) * sizeof(float));
    float *res = malloc((size_t)(M * (N + 1) + 1) * sizeof(float));
    for (int64_t i = 0; i < ra * ld; i++) A[i] = rnd_val();
    for (int64_t i = 0; i < rb * ldbv; i++) B[i] = rnd_val();
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) C0[i * ldc + j] = j < N ? rnd_val() : SENTINEL;
    for (int64_t j = 0; j < N; j++) bias[j] = rnd_val();
    for (int64_t i = 0; i < M; i++) row_bias[i] = rnd_val();
    for (int64_t i = 0; i < M * (N + 1); i++) res[i] = rnd_val();
    gemm_case t = {.M = M, .N = N, .K = K, .alpha = ALPHAS[variant % 6], .beta = BETAS[variant % 6],
                   .bias = variant % 4 >= 2 ? bias : NULL, .row_bias = variant % 8 >= 4 ? row_bias : NULL,
                   .res = variant % 16 >= 8 ? res : NULL,
                   .act = variant % 3 == 1 ? KILN_GEMM_ACT_RELU : variant % 3 == 2 ? KILN_GEMM_ACT_CLIP : KILN_GEMM_ACT_NONE,
                   .lo = -0.3f, .hi = 0.4f, .ldc = ldc};
    double *want = malloc(sizeof(double) * (size_t)(M * N + 1)), *mag = malloc(sizeof(double) * (size_t)(M * N + 1));
    for (int tr = 0; tr < 4; tr++) {
        t.ta = tr & 1;
        t.tb = tr >> 1;
        /* minimal-plus-pad leading dims for this transposition */
        t.lda = (t.ta ? M : K) + pad;
        t.ldb = (t.tb ? K : N) + pad;
        if (t.lda > ld) t.lda = ld;
        if (t.ldb > ldbv) t.ldb = ldbv;
        reference(&t, A, B, C0, want, mag);
        for (int c = 0; c < n_ctx; c++) CHECK(check_case(&ctxs[c], &t, A, B, C0, want, mag));
    }
    free(want);
    free(mag);
    free(A);
    free(B);
    free(C0);
    free(bias);
    free(row_bias);
    free(res);
}

typedef struct {
    kiln_gemm_ctx ctx;
    bool ok;
} shared_ctx;

static void *shared_main(void *arg)
{
    shared_ctx *s = arg;
    s->ok = true;
    enum { M = 67, N = 45, K = 129 };
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *C = malloc(sizeof(float) * M * N), *R = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) A[i] = (float)((i * 7) % 13) - 6.0f;
    for (int i = 0; i < K * N; i++) B[i] = (float)((i * 5) % 11) - 5.0f;
    kiln_gemm_ctx one = {.pool = NULL, .level = s->ctx.level};
    s->ok = kiln_sgemm_ex(&one, false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, R, N, NULL) == KILN_OK;
    for (int it = 0; it < 50; it++) {
        s->ok = kiln_sgemm_ex(&s->ctx, false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N, NULL) == KILN_OK && s->ok;
        s->ok = memcmp(C, R, sizeof(float) * M * N) == 0 && s->ok; /* integers: exact */
    }
    free(A);
    free(B);
    free(C);
    free(R);
    return NULL;
}

int main(void)
{
    static const int64_t small[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33};
    static const int64_t all[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 65, 100, 127, 129, 255};
    enum { N_SMALL = 10, N_ALL = 16 };

    kiln_threadpool *pools[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) CHECK(kiln_threadpool_create(i + 1, &pools[i]) == KILN_OK);
    kiln_gemm_ctx ctxs[9];
    int n_ctx = 0;
    kiln_gemm_level levels[] = {KILN_GEMM_LEVEL_BASELINE, KILN_GEMM_LEVEL_AVX2, KILN_GEMM_LEVEL_AVX512};
    for (int l = 0; l < 3; l++) {
        if (!kiln_gemm_level_supported(levels[l])) {
            printf("level %s not supported by this CPU: skipped\n", kiln_gemm_level_name(levels[l]));
            continue;
        }
        for (int p = 0; p < 3; p++) ctxs[n_ctx++] = (kiln_gemm_ctx){.pool = pools[p], .level = levels[l]};
    }
    printf("detected level: %s\n", kiln_gemm_level_name(kiln_gemm_level_detect()));

    /* every small shape, then random shapes with at least one large dim */
    int variant = 0;
    for (int a = 0; a < N_SMALL; a++)
        for (int b = 0; b < N_SMALL; b++)
            for (int c = 0; c < N_SMALL; c++) check_shape(ctxs, n_ctx, small[a], small[b], small[c], variant++);
    for (int i = 0; i < 60; i++) {
        int64_t M = all[unit_rnd() % N_ALL], N = all[unit_rnd() % N_ALL], K = all[10 + unit_rnd() % 6];
        int perm = (int)(unit_rnd() % 3); /* put the large dim anywhere */
        if (perm == 1) { int64_t x = M; M = K; K = x; }
        if (perm == 2) { int64_t x = N; N = K; K = x; }
        check_shape(ctxs, n_ctx, M, N, K, variant++);
    }
    /* the last 15 or 16 rows in one call (AVX-512: 14-row panels, M = 14k + 1 or 2), every epilogue */
    static const int64_t ms[] = {29, 30, 44}, ns[] = {1, 17, 33, 100}, ks[] = {1, 16, 129};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++) check_shape(ctxs, n_ctx, ms[a], ns[b], ks[c], variant++);
    check_shape(ctxs, n_ctx, 255, 255, 255, 1);
    check_shape(ctxs, n_ctx, 200, 1100, 300, 3); /* more than one MC, KC and NC block */
    check_shape(ctxs, n_ctx, 45, 70, 2100, 4);   /* three KC blocks at every level, the last short */

    /* invalid arguments leave C alone */
    float c1 = 7.0f, a1 = 1.0f;
    kiln_gemm_ctx def = {0};
    CHECK(kiln_sgemm_ex(&def, false, false, -1, 1, 1, 1.0f, &a1, 1, &a1, 1, 0.0f, &c1, 1, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_sgemm_ex(&def, false, false, 1, 2, 1, 1.0f, &a1, 1, &a1, 1, 0.0f, &c1, 1, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_sgemm_ex(&def, false, false, 1, 1, 2, 1.0f, &a1, 1, &a1, 1, 0.0f, &c1, 1, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(c1 == 7.0f);
    kiln_gemm_packed_b *pb = NULL;
    CHECK(kiln_gemm_packed_b_create(&def, false, 2, 1, &a1, 0, &pb) == KILN_ERR_INVALID_ARG && !pb);
    CHECK(kiln_gemm_packed_b_create(&def, false, 1, 1, &a1, 1, &pb) == KILN_OK && pb);
    CHECK(kiln_gemm_packed_b_bytes(pb) > 0 && kiln_gemm_packed_b_bytes(NULL) == 0);
    CHECK(kiln_sgemm_packed(&def, false, 1, 1.0f, &a1, 0, pb, 0.0f, &c1, 1, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_sgemm_packed(&def, false, 1, 3.0f, &a1, 1, pb, 0.0f, &c1, 1, NULL) == KILN_OK && c1 == 3.0f);
    kiln_gemm_packed_a *pa = NULL, *pa2 = NULL;
    CHECK(kiln_gemm_packed_a_create_from(&def, 1, 1, NULL, NULL, &pa) == KILN_ERR_INVALID_ARG && !pa);
    CHECK(kiln_gemm_packed_a_create_from(&def, -1, 1, pack_rows_of_a, NULL, &pa) == KILN_ERR_INVALID_ARG && !pa);
    float a2[2] = {1.0f, 1.0f};
    implicit_a one = {&a1, 1, false}, two = {a2, 2, false};
    CHECK(kiln_gemm_packed_a_create_from(&def, 1, 1, pack_rows_of_a, &one, &pa) == KILN_OK);
    CHECK(kiln_gemm_packed_a_create_from(&def, 1, 2, pack_rows_of_a, &two, &pa2) == KILN_OK);
    CHECK(kiln_sgemm_packed_ab(&def, pa, NULL, &c1, 1, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(kiln_sgemm_packed_ab(&def, pa2, pb, &c1, 1, NULL) == KILN_ERR_INVALID_ARG); /* K differs */
    CHECK(kiln_sgemm_packed_ab(&def, pa, pb, &c1, 0, NULL) == KILN_ERR_INVALID_ARG);
    CHECK(c1 == 3.0f);
    CHECK(kiln_sgemm_packed_ab(&def, pa, pb, &c1, 1, NULL) == KILN_OK && c1 == 1.0f);
    kiln_gemm_packed_a_free(pa);
    kiln_gemm_packed_a_free(pa2);
    kiln_gemm_packed_b_free(pb);
    kiln_gemm_packed_b_free(NULL);
    c1 = 7.0f;
    CHECK(kiln_sgemm(NULL, false, false, 1, 1, 1, 2.0f, &a1, 1, &a1, 1, 1.0f, &c1, 1) == KILN_OK && c1 == 9.0f);

    /* packing is invertible: unpack gives back the original bits (weights whose originals were
     * released are rebuilt this way for a fallback), at every level, odd sizes and more than
     * one KC block included */
    for (int l = 0; l < 3; l++) {
        if (!kiln_gemm_level_supported(levels[l])) continue;
        kiln_gemm_ctx lc = {.level = levels[l]};
        for (int i = 0; i < 24; i++) {
            int64_t R = all[unit_rnd() % N_ALL] + (i == 0 ? 300 : 0), K = all[unit_rnd() % N_ALL] + (i < 3 ? 1100 : 0);
            int64_t n = R * K;
            float *orig = malloc((size_t)(n ? n : 1) * sizeof *orig), *back = malloc((size_t)(n ? n : 1) * sizeof *back);
            CHECK(orig && back);
            for (int64_t e = 0; e < n; e++) orig[e] = rnd_val();
            for (int trans = 0; trans < 2; trans++) {
                /* B is [K, R], or [R, K] transposed */
                kiln_gemm_packed_b *p = NULL;
                CHECK(kiln_gemm_packed_b_create(&lc, trans, K, R, orig, trans ? K : R, &p) == KILN_OK);
                memset(back, 0, (size_t)n * sizeof *back);
                kiln_gemm_packed_b_unpack(p, back);
                CHECK(!memcmp(orig, back, (size_t)n * sizeof *back));
                kiln_gemm_packed_b_free(p);
            }
            kiln_gemm_packed_a *pa = NULL;
            CHECK(kiln_gemm_packed_a_create(&lc, R, K, orig, K, &pa) == KILN_OK);
            memset(back, 0, (size_t)n * sizeof *back);
            kiln_gemm_packed_a_unpack(pa, back);
            CHECK(!memcmp(orig, back, (size_t)n * sizeof *back));
            kiln_gemm_packed_a_free(pa);
            free(orig);
            free(back);
        }
    }

    /* two threads sharing the 2-thread pool */
    shared_ctx sh[2] = {{.ctx = {.pool = pools[1], .level = KILN_GEMM_LEVEL_AUTO}},
                        {.ctx = {.pool = pools[1], .level = KILN_GEMM_LEVEL_BASELINE}}};
    pthread_t th[2];
    for (int t = 0; t < 2; t++) CHECK(pthread_create(&th[t], NULL, shared_main, &sh[t]) == 0);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    CHECK(sh[0].ok && sh[1].ok);

    for (int i = 0; i < 3; i++) kiln_threadpool_free(pools[i]);
    return unit_report("test_gemm");
}
