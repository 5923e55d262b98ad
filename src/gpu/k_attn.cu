/* k_attn.cu - the attn family's GPU kernels (launchers in k_attn.h). ONNX Attention gives a
 * block to each (batch row, query head, query row): the scaled query row and the float output
 * accumulators live in shared memory; the keys come in tiles of ATTN_TILE, the warps take a
 * tile's keys in turn (a dot product per warp), then an online softmax (fp32: running max and
 * sum) rescales the accumulators and the threads take the value dims. Shared memory does not
 * grow with the number of keys. RotaryEmbedding and TensorScatter are one thread per element.
 * Half precision computes in float and rounds where the reference holds a value in the
 * tensor's type. */
#include <math.h>

#include "gpu/k_attn.h"
#include "gpu/kcommon.cuh"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define THREADS 256
#define ATTN_BLOCK 128
#define ATTN_TILE 64

__device__ __forceinline__ int64_t load_int(const void *p, bool is64, int64_t i)
{
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* ---- Attention ---- */

/* The additive bias of key j for query row i of (b, h): the mask's value, then -inf for keys
 * the causal frontier, the window or the valid length exclude (ops/attention.c's order). */
template <typename T>
__device__ __forceinline__ float onnx_bias(const kiln_gpu_onnx_attn &a, int64_t b, int64_t h, int64_t i, int64_t j,
                                           int64_t offset, int64_t valid)
{
    float m = 0.0f;
    if (a.mask_kind != KILN_GPU_ONNX_MASK_NONE) {
        if (j >= a.mask_T) {
            m = -INFINITY;
        } else {
            int64_t off = b * a.m_sb + h * a.m_sh + i * a.m_ss + j;
            if (a.mask_kind == KILN_GPU_ONNX_MASK_BOOL) m = ((const uint8_t *)a.mask)[off] ? 0.0f : -INFINITY;
            else m = kiln_round_to<T>(kiln_to_f<T>(((const T *)a.mask)[off]));
        }
    }
    int64_t at = i + offset;
    if (a.causal && j > at) m = -INFINITY;
    if (a.left >= 0 && at - j > a.left) m = -INFINITY;
    if (a.right >= 0 && j - at > a.right) m = -INFINITY;
    if (j >= valid) m = -INFINITY;
    return m;
}

/* Score of key row kr before the bias (the warp's lanes over the head dims; every lane gets it). */
template <typename T>
__device__ __forceinline__ float onnx_score(const kiln_gpu_onnx_attn &a, const float *qs, const T *kr, int lane)
{
    float dot = 0.0f;
    for (int64_t d = lane; d < a.Dk; d += 32) dot += qs[d] * kiln_round_to<T>(kiln_to_f<T>(kr[d]) * a.qscale);
    dot = kiln_warp_sum(dot);
    float x = kiln_round_to<T>(dot);
    if (a.softcap > 0.0f) x = kiln_round_to<T>(a.softcap * tanhf(x / a.softcap));
    return x;
}

template <typename T> __global__ void onnx_attn_kernel(kiln_gpu_onnx_attn a)
{
    extern __shared__ float sm[];
    float *qs = sm, *acc = sm + a.Dk, *sc = acc + a.Dv; /* [Dk], [Dv], [ATTN_TILE] */
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    int64_t rows = a.B * a.Hq * a.Sq, group = a.Hq / a.Hkv;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t i = row % a.Sq, bh = row / a.Sq, h = bh % a.Hq, b = bh / a.Hq, hk = h / group;
        int64_t offset = a.past, valid = a.T;
        if (a.nonpad) {
            valid = load_int(a.nonpad, a.nonpad_64, b);
            offset = valid - a.Sq;
        }
        const T *qp = (const T *)a.q.p + b * a.q.sb + h * a.q.sn + i * a.q.ss;
        const T *kp = (const T *)a.k.p + b * a.k.sb + hk * a.k.sn;
        const T *vp = (const T *)a.v.p + b * a.v.sb + hk * a.v.sn;
        T *qk = a.qk ? (T *)a.qk + row * a.T : NULL;
        __syncthreads(); /* the previous row is done with shared memory */
        for (int64_t d = threadIdx.x; d < a.Dk; d += blockDim.x) qs[d] = kiln_round_to<T>(kiln_to_f<T>(qp[d]) * a.qscale);
        for (int64_t d = threadIdx.x; d < a.Dv; d += blockDim.x) acc[d] = 0.0f;
        float mx = -INFINITY, l = 0.0f; /* the same in every thread */
        __syncthreads();
        for (int64_t t0 = 0; t0 < a.T; t0 += ATTN_TILE) {
            int n = a.T - t0 < ATTN_TILE ? (int)(a.T - t0) : ATTN_TILE;
            for (int jj = warp; jj < n; jj += nw) {
                int64_t j = t0 + jj;
                float raw = onnx_score<T>(a, qs, kp + j * a.k.ss, lane);
                if (lane == 0) {
                    float x = kiln_round_to<T>(raw + onnx_bias<T>(a, b, h, i, j, offset, valid));
                    if (qk && a.qk_mode <= 1) qk[j] = kiln_from_f<T>(raw);
                    if (qk && a.qk_mode == 2) qk[j] = kiln_from_f<T>(x);
                    sc[jj] = x;
                }
            }
            __syncthreads();
            float tm = -INFINITY;
            for (int jj = 0; jj < n; jj++) tm = fmaxf(tm, sc[jj]);
            float nm = fmaxf(mx, tm);
            /* nm -inf: every key so far masked, nothing accumulated yet */
            float alpha = nm == -INFINITY ? 1.0f : expf(mx - nm);
            __syncthreads(); /* every thread has read the scores */
            for (int jj = threadIdx.x; jj < n; jj += blockDim.x) sc[jj] = nm == -INFINITY ? 0.0f : expf(sc[jj] - nm);
            __syncthreads();
            float ps = 0.0f;
            for (int jj = 0; jj < n; jj++) ps += sc[jj];
            l = l * alpha + ps;
            mx = nm;
            const T *vt = vp + t0 * a.v.ss;
            for (int64_t d = threadIdx.x; d < a.Dv; d += blockDim.x) {
                float s = acc[d] * alpha;
                for (int jj = 0; jj < n; jj++) s += sc[jj] * kiln_to_f<T>(vt[jj * a.v.ss + d]);
                acc[d] = s;
            }
            __syncthreads(); /* sc is rewritten by the next tile */
        }
        T *y = (T *)a.y + b * a.y_sb + h * a.y_sh + i * a.y_ss;
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t d = threadIdx.x; d < a.Dv; d += blockDim.x) y[d] = kiln_from_f<T>(acc[d] * inv);
        if (qk && a.qk_mode == 3) /* the probabilities: the scores again, against the final max and sum */
            for (int64_t j = warp; j < a.T; j += nw) {
                float raw = onnx_score<T>(a, qs, kp + j * a.k.ss, lane);
                if (lane == 0) {
                    float x = kiln_round_to<T>(raw + onnx_bias<T>(a, b, h, i, j, offset, valid));
                    qk[j] = kiln_from_f<T>(l > 0.0f && mx != -INFINITY ? expf(x - mx) * inv : 0.0f);
                }
            }
    }
}

/* ---- Attention on tensor cores (float16, bfloat16; sm_80 and later) ----
 *
 * A block of FA_WARPS warps takes FA_BM query rows of one (b, h), each warp 16 of them; key
 * tiles of FA_BN rows of K and V go through shared memory. Per tile a warp computes its 16 x
 * FA_BN scores with mma.m16n8k16 (Q's fragments held in registers for the whole row, K's read
 * as the col-major B operand straight from its rows), scales them and adds the bias in float,
 * keeps an online softmax (running max and sum per row, the four lanes of a row agreeing by
 * shuffles) and multiplies the probabilities, rounded to the dtype in the A-operand registers
 * the scores' accumulators map onto, by V's rows (ldmatrix.trans gives the B operand). */
#if !defined(KILN_HIP)
#define FA_BM 64
#define FA_BN 64
#define FA_WARPS 4

/* mma.m16n8k16 with float accumulators, and two floats rounded into one register of T pairs. */
template <typename T> struct fa_ops;
#define FA_OPS(T, PTX, PAIR, CONVERT)                                                                            \
    template <> struct fa_ops<T> {                                                                               \
        static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) \
        {                                                                                                        \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, " \
                         "{%8,%9}, {%0,%1,%2,%3};"                                                               \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                        \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                        \
        }                                                                                                        \
        static __device__ __forceinline__ uint32_t pack(float lo, float hi)                                      \
        {                                                                                                        \
            PAIR h = CONVERT(lo, hi);                                                                            \
            return *(uint32_t *)&h;                                                                              \
        }                                                                                                        \
    };
FA_OPS(kiln_gpu_half, "f16", __half2, __floats2half2_rn)
FA_OPS(kiln_gpu_bf16, "bf16", __nv_bfloat162, __floats2bfloat162_rn)
#undef FA_OPS

/* The bias of key j for query row i of (b, h) (onnx_bias without window or nonpad); -inf past
 * the keys, 0 for a row past the queries (computed, never stored). */
template <typename T>
__device__ __forceinline__ float fa_bias(const kiln_gpu_onnx_attn &a, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (j >= a.T) return -INFINITY;
    if (i >= a.Sq) return 0.0f;
    float m = 0.0f;
    if (a.mask_kind != KILN_GPU_ONNX_MASK_NONE) {
        if (j >= a.mask_T) return -INFINITY;
        int64_t off = b * a.m_sb + h * a.m_sh + i * a.m_ss + j;
        if (a.mask_kind == KILN_GPU_ONNX_MASK_BOOL) m = ((const uint8_t *)a.mask)[off] ? 0.0f : -INFINITY;
        else m = kiln_to_f<T>(((const T *)a.mask)[off]);
    }
    if (a.causal && j > i + a.past) m = -INFINITY;
    return m;
}

/* FA_BM x (D + 8) elements of a tile in shared memory, rows r < n of src (row stride ld) and
 * zeros past them, 16 bytes at a time. */
template <int D>
__device__ __forceinline__ void fa_tile(uint16_t *dst, const uint16_t *src, int64_t ld, int64_t n)
{
    constexpr int CH = D / 8, LD = D + 8;
    for (int e = threadIdx.x; e < FA_BM * CH; e += FA_WARPS * 32) {
        const int r = e / CH, cc = e % CH;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < n) v = *(const uint4 *)(src + r * ld + cc * 8);
        *(uint4 *)(dst + r * LD + cc * 8) = v;
    }
}

/* grid (ceil(Sq / FA_BM), Hq, B), FA_WARPS * 32 threads */
template <typename T, int D>
__global__ void __launch_bounds__(FA_WARPS * 32) flash_attn_kernel(kiln_gpu_onnx_attn a)
{
    static_assert(FA_BM == 16 * FA_WARPS && FA_BN == FA_BM, "a warp takes 16 rows; K and V tiles share fa_tile");
    constexpr int LD = D + 8; /* padded rows: the fragment reads hit 32 banks */
    __shared__ __align__(16) uint16_t Qs[FA_BM * LD], Ks[FA_BN * LD], Vs[FA_BN * LD];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
    const int64_t i0 = (int64_t)blockIdx.x * FA_BM, h = blockIdx.y, b = blockIdx.z, hk = h / (a.Hq / a.Hkv);
    const uint16_t *qp = (const uint16_t *)a.q.p + b * a.q.sb + h * a.q.sn + i0 * a.q.ss;
    const uint16_t *kp = (const uint16_t *)a.k.p + b * a.k.sb + hk * a.k.sn;
    const uint16_t *vp = (const uint16_t *)a.v.p + b * a.v.sb + hk * a.v.sn;
    fa_tile<D>(Qs, qp, a.q.ss, a.Sq - i0);
    __syncthreads();
    const int r0 = warp * 16;
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        qf[kc][0] = *(const uint32_t *)&Qs[(r0 + g) * LD + kc * 16 + 2 * q];
        qf[kc][1] = *(const uint32_t *)&Qs[(r0 + g + 8) * LD + kc * 16 + 2 * q];
        qf[kc][2] = *(const uint32_t *)&Qs[(r0 + g) * LD + kc * 16 + 8 + 2 * q];
        qf[kc][3] = *(const uint32_t *)&Qs[(r0 + g + 8) * LD + kc * 16 + 8 + 2 * q];
    }
    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int64_t row[2] = {i0 + r0 + g, i0 + r0 + g + 8}; /* the thread's two query rows */
    for (int64_t t0 = 0; t0 < a.T; t0 += FA_BN) {
        __syncthreads(); /* every warp is done with the previous tile */
        fa_tile<D>(Ks, kp + t0 * a.k.ss, a.k.ss, a.T - t0);
        fa_tile<D>(Vs, vp + t0 * a.v.ss, a.v.ss, a.T - t0);
        __syncthreads();
        float sc[FA_BN / 8][4];
#pragma unroll
        for (int j = 0; j < FA_BN / 8; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++)
                fa_ops<T>::mma(sc[j], qf[kc], *(const uint32_t *)&Ks[(8 * j + g) * LD + kc * 16 + 2 * q],
                               *(const uint32_t *)&Ks[(8 * j + g) * LD + kc * 16 + 8 + 2 * q]);
        }
        /* scores: scale, bias; the rows' maxima */
        float nm[2] = {mx[0], mx[1]};
#pragma unroll
        for (int j = 0; j < FA_BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1;
                const int64_t key = t0 + 8 * j + 2 * q + (e & 1);
                sc[j][e] = sc[j][e] * a.scale + fa_bias<T>(a, b, h, row[rr], key);
                nm[rr] = fmaxf(nm[rr], sc[j][e]);
            }
        float alpha[2], ps[2] = {0.0f, 0.0f};
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            nm[rr] = fmaxf(nm[rr], __shfl_xor_sync(KILN_FULL_MASK, nm[rr], 1));
            nm[rr] = fmaxf(nm[rr], __shfl_xor_sync(KILN_FULL_MASK, nm[rr], 2));
            /* nm -inf: every key so far masked, nothing accumulated yet */
            alpha[rr] = nm[rr] == -INFINITY ? 1.0f : __expf(mx[rr] - nm[rr]);
        }
#pragma unroll
        for (int j = 0; j < FA_BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1;
                sc[j][e] = nm[rr] == -INFINITY ? 0.0f : __expf(sc[j][e] - nm[rr]);
                ps[rr] += sc[j][e];
            }
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            ps[rr] += __shfl_xor_sync(KILN_FULL_MASK, ps[rr], 1);
            ps[rr] += __shfl_xor_sync(KILN_FULL_MASK, ps[rr], 2);
            l[rr] = l[rr] * alpha[rr] + ps[rr];
            mx[rr] = nm[rr];
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] *= alpha[0], o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1], o[dt][3] *= alpha[1];
        }
        /* o += P V: keys kc * 16 .. + 15 of the tile; the probabilities of score tiles 2 kc and
         * 2 kc + 1 are the A operand's registers as they lie */
#pragma unroll
        for (int kc = 0; kc < FA_BN / 16; kc++) {
            const uint32_t pa[4] = {fa_ops<T>::pack(sc[2 * kc][0], sc[2 * kc][1]),
                                    fa_ops<T>::pack(sc[2 * kc][2], sc[2 * kc][3]),
                                    fa_ops<T>::pack(sc[2 * kc + 1][0], sc[2 * kc + 1][1]),
                                    fa_ops<T>::pack(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};
#pragma unroll
            for (int dt = 0; dt < D / 8; dt++) {
                uint32_t b0, b1;
                const uint32_t at =
                    (uint32_t)__cvta_generic_to_shared(&Vs[(kc * 16 + (lane & 15)) * LD + dt * 8]);
                asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                             : "=r"(b0), "=r"(b1)
                             : "r"(at));
                fa_ops<T>::mma(o[dt], pa, b0, b1);
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        if (row[rr] >= a.Sq) continue;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        uint16_t *y = (uint16_t *)a.y + b * a.y_sb + h * a.y_sh + row[rr] * a.y_ss;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++)
            *(uint32_t *)(y + dt * 8 + 2 * q) = fa_ops<T>::pack(o[dt][2 * rr] * inv, o[dt][2 * rr + 1] * inv);
    }
}
#endif

extern "C" bool kiln_gpu_onnx_attn_flash_takes(const kiln_gpu_onnx_attn *a)
{
#if defined(KILN_HIP)
    (void)a;
    return false;
#else
    const kiln_gpu_attn_view *v[3] = {&a->q, &a->k, &a->v};
    bool aligned = ((uintptr_t)a->y & 15) == 0 && a->y_sb % 8 == 0 && a->y_sh % 8 == 0 && a->y_ss % 8 == 0;
    for (int k = 0; k < 3; k++)
        aligned = aligned && ((uintptr_t)v[k]->p & 15) == 0 && v[k]->sb % 8 == 0 && v[k]->sn % 8 == 0 && v[k]->ss % 8 == 0;
    return aligned && (a->dtype == KILN_DTYPE_FLOAT16 || a->dtype == KILN_DTYPE_BFLOAT16) && a->Dk == a->Dv &&
           (a->Dk == 32 || a->Dk == 64) && a->Sq >= 16 && !a->qk && a->softcap <= 0.0f && a->left < 0 && a->right < 0 &&
           !a->nonpad && a->Hkv > 0 && a->Hq % a->Hkv == 0 && a->Hq <= 65535 && a->B <= 65535 &&
           (a->Sq + FA_BM - 1) / FA_BM <= INT32_MAX;
#endif
}

extern "C" gpuError_t kiln_gpu_onnx_attn_run(gpuStream_t s, const kiln_gpu_onnx_attn *a)
{
    int64_t rows = a->B * a->Hq * a->Sq;
    if (rows <= 0) return gpuSuccess;
    if (a->Hkv <= 0 || a->Hq % a->Hkv || a->Dk <= 0 || a->Dv <= 0 || a->Dk > KILN_GPU_ONNX_ATTN_MAX_HEAD ||
        a->Dv > KILN_GPU_ONNX_ATTN_MAX_HEAD || a->T < 0)
        return kiln_gpu_bad_arg();
#if !defined(KILN_HIP)
    if (a->flash && kiln_gpu_onnx_attn_flash_takes(a)) {
        dim3 grid((unsigned)((a->Sq + FA_BM - 1) / FA_BM), (unsigned)a->Hq, (unsigned)a->B);
#define FLASH(T, D) flash_attn_kernel<T, D><<<grid, FA_WARPS * 32, 0, s>>>(*a)
        bool h = a->dtype == KILN_DTYPE_FLOAT16;
        if (a->Dk == 64) h ? FLASH(kiln_gpu_half, 64) : FLASH(kiln_gpu_bf16, 64);
        else h ? FLASH(kiln_gpu_half, 32) : FLASH(kiln_gpu_bf16, 32);
#undef FLASH
        return gpuGetLastError();
    }
#endif
    size_t smem = (size_t)(a->Dk + a->Dv + ATTN_TILE) * sizeof(float);
    unsigned nb = rows < INT32_MAX ? (unsigned)rows : (unsigned)INT32_MAX;
    if (a->dtype == KILN_DTYPE_FLOAT32) onnx_attn_kernel<float><<<nb, ATTN_BLOCK, smem, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_FLOAT16) onnx_attn_kernel<kiln_gpu_half><<<nb, ATTN_BLOCK, smem, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_BFLOAT16) onnx_attn_kernel<kiln_gpu_bf16><<<nb, ATTN_BLOCK, smem, s>>>(*a);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

/* ---- RotaryEmbedding ---- */

template <typename T> __global__ void onnx_rotary_kernel(kiln_gpu_onnx_rotary a)
{
    const T *x = (const T *)a.x, *cs = (const T *)a.cos, *sn = (const T *)a.sin;
    T *y = (T *)a.y;
    int64_t half = a.rd / 2;
    KILN_GRID_LOOP(e, a.B * a.S * a.H * a.D) {
        int64_t d = e % a.D, r = e / a.D, s, b;
        if (a.rank3) { /* [B, S, H, D] */
            s = (r / a.H) % a.S;
            b = r / (a.H * a.S);
        } else { /* [B, H, S, D] */
            s = r % a.S;
            b = r / (a.S * a.H);
        }
        if (d >= a.rd) {
            y[e] = x[e];
            continue;
        }
        int64_t row;
        if (a.pos) {
            int64_t p = load_int(a.pos, a.pos_64, b * a.S + s);
            if (p < 0 || p >= a.rows) {
                if (a.bad) atomicCAS(a.bad, 0, a.bad_code);
                continue;
            }
            row = p * half;
        } else {
            row = (b * a.S + s) * half;
        }
        int64_t k = a.interleaved ? d / 2 : (d < half ? d : d - half);
        bool first = a.interleaved ? (d & 1) == 0 : d < half;
        int64_t base = e - d, i1 = a.interleaved ? 2 * k : k, i2 = a.interleaved ? 2 * k + 1 : k + half;
        float c = kiln_to_f<T>(cs[row + k]), si = kiln_to_f<T>(sn[row + k]);
        float x1 = kiln_to_f<T>(x[base + i1]), x2 = kiln_to_f<T>(x[base + i2]);
        float v = first ? kiln_round_to<T>(c * x1) - kiln_round_to<T>(si * x2) : kiln_round_to<T>(si * x1) + kiln_round_to<T>(c * x2);
        y[e] = kiln_from_f<T>(v);
    }
}

extern "C" gpuError_t kiln_gpu_onnx_rotary_run(gpuStream_t s, const kiln_gpu_onnx_rotary *a)
{
    int64_t n = a->B * a->S * a->H * a->D;
    if (n <= 0) return gpuSuccess;
    if (a->rd < 0 || a->rd > a->D || a->rd % 2) return kiln_gpu_bad_arg();
    unsigned nb = kiln_gpu_blocks(n, THREADS);
    if (a->dtype == KILN_DTYPE_FLOAT32) onnx_rotary_kernel<float><<<nb, THREADS, 0, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_FLOAT16) onnx_rotary_kernel<kiln_gpu_half><<<nb, THREADS, 0, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_BFLOAT16) onnx_rotary_kernel<kiln_gpu_bf16><<<nb, THREADS, 0, s>>>(*a);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

/* ---- TensorScatter ---- */

template <typename E> __global__ void tensor_scatter_kernel(kiln_gpu_tensor_scatter a)
{
    const E *u = (const E *)a.u;
    E *y = (E *)a.y;
    KILN_GRID_LOOP(e, a.prefix * a.len * a.inner) {
        int64_t in = e % a.inner, r = e / a.inner, s = r % a.len, p = r / a.len;
        int64_t pos = (a.w ? load_int(a.w, a.w_64, p / a.per_batch) : 0) + s;
        if (a.circular) {
            pos = (pos % a.max_len + a.max_len) % a.max_len;
        } else if (pos < 0 || pos >= a.max_len) {
            if (a.bad) atomicCAS(a.bad, 0, a.bad_code);
            continue;
        }
        y[(p * a.max_len + pos) * a.inner + in] = u[e];
    }
}

extern "C" gpuError_t kiln_gpu_tensor_scatter_run(gpuStream_t s, const kiln_gpu_tensor_scatter *a)
{
    int64_t n = a->prefix * a->len * a->inner;
    if (n <= 0) return gpuSuccess;
    if (a->max_len <= 0 || a->per_batch <= 0) return kiln_gpu_bad_arg();
    unsigned nb = kiln_gpu_blocks(n, THREADS);
    switch (a->esize) {
    case 1: tensor_scatter_kernel<uint8_t><<<nb, THREADS, 0, s>>>(*a); break;
    case 2: tensor_scatter_kernel<uint16_t><<<nb, THREADS, 0, s>>>(*a); break;
    case 4: tensor_scatter_kernel<uint32_t><<<nb, THREADS, 0, s>>>(*a); break;
    case 8: tensor_scatter_kernel<uint64_t><<<nb, THREADS, 0, s>>>(*a); break;
    default: return kiln_gpu_bad_arg();
    }
    return gpuGetLastError();
}
