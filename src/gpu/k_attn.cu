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

extern "C" gpuError_t kiln_gpu_onnx_attn_run(gpuStream_t s, const kiln_gpu_onnx_attn *a)
{
    int64_t rows = a->B * a->Hq * a->Sq;
    if (rows <= 0) return gpuSuccess;
    if (a->Hkv <= 0 || a->Hq % a->Hkv || a->Dk <= 0 || a->Dv <= 0 || a->Dk > KILN_GPU_ONNX_ATTN_MAX_HEAD ||
        a->Dv > KILN_GPU_ONNX_ATTN_MAX_HEAD || a->T < 0)
        return kiln_gpu_bad_arg();
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
