/* test_qgemm.c - kiln_qgemm against kiln_qgemm_reference (one int32 multiply-add at a time),
 * bit for bit: every instruction-set level this build has, forced one by one (a level the CPU
 * lacks is skipped, saying so), u8/s8 operands in all four combinations, per-tensor and
 * per-column zero points, odd and empty shapes, padded strides, B packed once or per call,
 * pools of 1 and 2 threads, the tile epilogue, zero points bound to a packed B, and the packed
 * B's unpacking. */
#include <stdlib.h>
#include <string.h>

#include "core/scratch.h"
#include "cpu/qgemm.h"
#define UNIT_SEED 0x2545f4914f6cdd1dull
#include "unit.h"

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(unit_rnd() >> 24);
}

/* the epilogue: adds 7 * (i0 + j0) + 1 to each element of its block, counting calls */
typedef struct tile_check {
    int calls;
} tile_check;

static void tile_fn(void *ctx, int32_t *c, int64_t ldc, int64_t i0, int64_t m, int64_t j0, int64_t n)
{
    tile_check *t = ctx;
    __atomic_add_fetch(&t->calls, 1, __ATOMIC_RELAXED);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] += (int32_t)(7 * (i0 + i) + j0 + j + 1);
}

static int cases_run;

static void one_case(kiln_qgemm_level level, kiln_threadpool *pool, kiln_scratch *scratch, int64_t M, int64_t N,
                     int64_t K, bool a_signed, bool b_signed, bool per_col, bool prepack, int64_t pad, bool tile)
{
    int64_t lda = K + pad, ldb = N + pad, ldc = N + pad;
    uint8_t *A = malloc((size_t)(M * lda) + 1), *B = malloc((size_t)(K * ldb) + 1);
    int32_t *zp = malloc((size_t)(N + 1) * sizeof *zp);
    int32_t *C = malloc((size_t)(M * ldc + 1) * sizeof *C), *R = malloc((size_t)(M * ldc + 1) * sizeof *R);
    fill(A, (size_t)(M * lda));
    fill(B, (size_t)(K * ldb));
    for (int64_t j = 0; j <= N; j++) zp[j] = b_signed ? (int8_t)(unit_rnd() >> 24) : (uint8_t)(unit_rnd() >> 24);
    int32_t a_zp = a_signed ? (int8_t)(unit_rnd() >> 24) : (uint8_t)(unit_rnd() >> 24);
    for (int64_t i = 0; i < M * ldc + 1; i++) C[i] = R[i] = (int32_t)0x5a5a5a5a;
    kiln_qgemm_ctx ctx = {.pool = pool, .scratch = scratch, .level = level};
    kiln_qgemm_packed_b *pb = NULL;
    if (prepack) {
        CHECK(kiln_qgemm_packed_b_create(&ctx, K, N, B, ldb, b_signed, &pb) == KILN_OK);
        if (!pb) goto out;
        /* the packing is lossless */
        uint8_t *U = malloc((size_t)(K * N) + 1);
        kiln_qgemm_packed_b_unpack(pb, U);
        bool same = true;
        for (int64_t p = 0; p < K; p++) same = same && !memcmp(U + p * N, B + p * ldb, (size_t)N);
        CHECK(same);
        free(U);
    }
    tile_check tc = {0}, tr = {0};
    kiln_qgemm_args args = {.M = M, .N = N, .K = K, .A = A, .lda = lda, .a_signed = a_signed, .a_zp = a_zp,
                            .B = B, .ldb = ldb, .b_signed = b_signed, .pb = pb, .b_zp = zp,
                            .n_bzp = per_col ? N : 1, .C = C, .ldc = ldc,
                            .tile = tile ? tile_fn : NULL, .tile_ctx = &tc};
    CHECK(kiln_qgemm(&ctx, &args) == KILN_OK);
    kiln_qgemm_args ref = args;
    ref.pb = NULL, ref.C = R, ref.tile_ctx = &tr;
    kiln_qgemm_reference(&ref);
    bool same = !memcmp(C, R, (size_t)(M * ldc + 1) * sizeof *C);
    if (!same)
        fprintf(stderr, "%s M=%lld N=%lld K=%lld a%s b%s %s %s pad=%lld tile=%d: differs\n", kiln_qgemm_level_name(level),
                (long long)M, (long long)N, (long long)K, a_signed ? "s8" : "u8", b_signed ? "s8" : "u8",
                per_col ? "per-column" : "per-tensor", prepack ? "prepacked" : "packed per call", (long long)pad, tile);
    CHECK(same);
    if (tile && M && N) CHECK(tc.calls >= 1);
    if (pb) { /* the same zero points bound to the packed B: the same results */
        CHECK(kiln_qgemm_packed_b_bind_zp(pb, zp, per_col ? N : 1) == KILN_OK);
        for (int64_t i = 0; i < M * ldc + 1; i++) C[i] = (int32_t)0x5a5a5a5a;
        kiln_qgemm_args bound = args;
        bound.b_zp = NULL, bound.n_bzp = 0, bound.b_zp_bound = true;
        CHECK(kiln_qgemm(&ctx, &bound) == KILN_OK);
        CHECK(!memcmp(C, R, (size_t)(M * ldc + 1) * sizeof *C));
    }
    cases_run++;
out:
    kiln_qgemm_packed_b_free(pb);
    free(A), free(B), free(zp), free(C), free(R);
}

int main(void)
{
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 130};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    kiln_threadpool *pool = NULL;
    CHECK(kiln_threadpool_create(2, &pool) == KILN_OK);
    kiln_scratch *scratch = kiln_scratch_create();
    printf("detected level: %s\n", kiln_qgemm_level_name(kiln_qgemm_level_detect()));
    for (int lv = KILN_QGEMM_LEVEL_BASELINE; lv < KILN_QGEMM_LEVEL_COUNT; lv++) {
        if (!kiln_qgemm_level_supported((kiln_qgemm_level)lv)) {
            printf("skipping %s: this CPU lacks it\n", kiln_qgemm_level_name((kiln_qgemm_level)lv));
            continue;
        }
        int before = cases_run;
        for (int t = 0; t < 120; t++) {
            int64_t M = sizes[unit_rnd() % ns], N = sizes[unit_rnd() % ns], K = sizes[unit_rnd() % ns];
            unsigned f = (unsigned)unit_rnd();
            one_case((kiln_qgemm_level)lv, f & 1 ? pool : NULL, f & 2 ? scratch : NULL, M, N, K, f & 4, f & 8, f & 16,
                     f & 32, f & 64 ? 3 : 0, f & 128);
        }
        /* large enough to be split over the pool's threads; K deep enough to wrap nothing but
         * exercise long accumulations; extreme values (all 255 against all -128) */
        static const int64_t big[][3] = {{128, 768, 768}, {77, 3072, 130}, {300, 65, 1031}, {1, 1000, 2048}};
        for (int b = 0; b < 4; b++)
            for (unsigned f = 0; f < 4; f++)
                one_case((kiln_qgemm_level)lv, pool, scratch, big[b][0], big[b][1], big[b][2], f & 1, f & 2, b & 1,
                         b != 2, 0, b == 3);
        /* empty shapes: M, N or K zero */
        one_case((kiln_qgemm_level)lv, pool, scratch, 0, 17, 5, false, true, false, true, 0, false);
        one_case((kiln_qgemm_level)lv, pool, scratch, 5, 0, 5, false, true, false, false, 0, false);
        one_case((kiln_qgemm_level)lv, pool, scratch, 5, 17, 0, true, false, true, true, 0, true);
        printf("%s: %d cases\n", kiln_qgemm_level_name((kiln_qgemm_level)lv), cases_run - before);
    }
    /* extremes: A all 255 (u8), B all -128 (s8), zero points at the far ends */
    {
        int64_t M = 9, N = 33, K = 4099;
        uint8_t *A = malloc((size_t)(M * K)), *B = malloc((size_t)(K * N));
        memset(A, 255, (size_t)(M * K));
        memset(B, 0x80, (size_t)(K * N));
        int32_t zp = 127, *C = calloc((size_t)(M * N), sizeof *C);
        for (int lv = KILN_QGEMM_LEVEL_BASELINE; lv < KILN_QGEMM_LEVEL_COUNT; lv++) {
            if (!kiln_qgemm_level_supported((kiln_qgemm_level)lv)) continue;
            kiln_qgemm_ctx ctx = {.level = (kiln_qgemm_level)lv};
            kiln_qgemm_args a = {.M = M, .N = N, .K = K, .A = A, .lda = K, .a_zp = 0, .B = B, .ldb = N,
                                 .b_signed = true, .b_zp = &zp, .n_bzp = 1, .C = C, .ldc = N};
            CHECK(kiln_qgemm(&ctx, &a) == KILN_OK);
            bool ok = true;
            for (int64_t i = 0; i < M * N; i++) ok = ok && C[i] == (int32_t)(255 * -255 * K);
            CHECK(ok);
        }
        free(A), free(B), free(C);
    }
    /* bad arguments are errors */
    {
        uint8_t a[4] = {1, 2, 3, 4};
        int32_t c[4];
        kiln_qgemm_args bad = {.M = 2, .N = 2, .K = 2, .A = a, .lda = 1, .B = a, .ldb = 2, .C = c, .ldc = 2};
        CHECK(kiln_qgemm(NULL, &bad) == KILN_ERR_INVALID_ARG);
        bad.lda = 2, bad.n_bzp = 3, bad.b_zp = c;
        CHECK(kiln_qgemm(NULL, &bad) == KILN_ERR_INVALID_ARG);
        bad.M = -1;
        CHECK(kiln_qgemm(NULL, &bad) == KILN_ERR_INVALID_ARG);
    }
    kiln_scratch_free(scratch);
    kiln_threadpool_free(pool);
    return unit_report("test_qgemm");
}
