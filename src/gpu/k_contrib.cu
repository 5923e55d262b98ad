/* k_contrib.cu - the contrib family's GPU kernels (launchers in k_contrib.h). Element-wise ops
 * (the Gelu family, BiasAdd, the FusedGemm / FusedConv epilogue) are grid-stride loops; the
 * layer normalizations give a block to each row and take the mean, then the variance of the
 * deviations, in fp32 (the reference's two passes); the attention core gives a block to each
 * (batch, head, query row): the query row and the row's scores live in shared memory, the warps
 * take the keys in turn, then the threads take the value dims. Half precision computes in
 * float and rounds where the reference holds a value in the tensor's type. */
#include <math.h>

#include "gpu/k_contrib.h"
#include "gpu/kcommon.cuh"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define THREADS 256
#define ROW_BLOCK 256
#define ATTN_BLOCK 128

/* The sum (is_max false) or max of v over the block, for every thread; red holds 32 floats.
 * Every thread of the block calls it. */
__device__ float block_reduce(float v, float *red, bool is_max)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
    v = is_max ? kiln_warp_max(v) : kiln_warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = is_max ? -INFINITY : 0.0f;
    for (int k = 0; k < nw; k++) r = is_max ? fmaxf(r, red[k]) : r + red[k];
    return r;
}

/* ---- the Gelu family, BiasAdd ---- */

template <typename T, int KIND>
__global__ void gelu_kernel(const T *x, const T *bias, T *y, int64_t n, int64_t h, float alpha)
{
    KILN_GRID_LOOP(i, n) {
        float v = kiln_to_f<T>(x[i]);
        if (bias) v = kiln_round_to<T>(v + kiln_to_f<T>(bias[i % h]));
        float r;
        if (KIND == KILN_GPU_GELU_ERF) r = 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
        else if (KIND == KILN_GPU_GELU_TANH) r = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        else r = v / (1.0f + expf(-alpha * v));
        y[i] = kiln_from_f<T>(r);
    }
}

template <typename T>
static gpuError_t gelu_go(gpuStream_t s, int kind, const void *x, const void *bias, void *y, int64_t n, int64_t h,
                          float alpha)
{
    unsigned nb = kiln_gpu_blocks(n, THREADS);
    const T *xp = (const T *)x, *bp = (const T *)bias;
    T *yp = (T *)y;
    if (kind == KILN_GPU_GELU_ERF) gelu_kernel<T, KILN_GPU_GELU_ERF><<<nb, THREADS, 0, s>>>(xp, bp, yp, n, h, alpha);
    else if (kind == KILN_GPU_GELU_TANH) gelu_kernel<T, KILN_GPU_GELU_TANH><<<nb, THREADS, 0, s>>>(xp, bp, yp, n, h, alpha);
    else if (kind == KILN_GPU_GELU_QUICK) gelu_kernel<T, KILN_GPU_GELU_QUICK><<<nb, THREADS, 0, s>>>(xp, bp, yp, n, h, alpha);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

extern "C" gpuError_t kiln_gpu_contrib_gelu(gpuStream_t s, int dtype, int kind, const void *x, const void *bias, void *y,
                                            int64_t n, int64_t h, float alpha)
{
    if (n <= 0) return gpuSuccess;
    if (h <= 0) h = 1;
    if (dtype == KILN_DTYPE_FLOAT32) return gelu_go<float>(s, kind, x, bias, y, n, h, alpha);
    if (dtype == KILN_DTYPE_FLOAT16) return gelu_go<kiln_gpu_half>(s, kind, x, bias, y, n, h, alpha);
    return kiln_gpu_bad_arg();
}

template <typename T>
__global__ void bias_add_kernel(const T *x, const T *bias, const T *skip, T *y, int64_t n, int64_t C)
{
    KILN_GRID_LOOP(i, n) y[i] = kiln_from_f<T>(kiln_to_f<T>(x[i]) + kiln_to_f<T>(bias[i % C]) + kiln_to_f<T>(skip[i]));
}

extern "C" gpuError_t kiln_gpu_contrib_bias_add(gpuStream_t s, int dtype, const void *x, const void *bias, const void *skip,
                                                void *y, int64_t n, int64_t C)
{
    if (n <= 0 || C <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, THREADS);
#define BA(T) bias_add_kernel<T><<<nb, THREADS, 0, s>>>((const T *)x, (const T *)bias, (const T *)skip, (T *)y, n, C)
    if (dtype == KILN_DTYPE_FLOAT32) BA(float);
    else if (dtype == KILN_DTYPE_FLOAT16) BA(kiln_gpu_half);
    else return kiln_gpu_bad_arg();
#undef BA
    return gpuGetLastError();
}

/* ---- layer normalizations ---- */

/* Normalizes one row of h values that src(j) produces (rounded to T by the caller): y = (v -
 * mean) * inv * gamma (+ beta); the row's values are computed three times (sum, deviations,
 * output) rather than held. */
template <typename T, typename Src>
__device__ void ln_row(const Src &src, int64_t h, const T *gamma, const T *beta, T *y, T *sum, float *mean, float *inv,
                       float eps, float *red)
{
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        float v = src(j);
        if (sum) sum[j] = kiln_from_f<T>(v);
        acc += v;
    }
    float m = block_reduce(acc, red, false) / (float)h;
    float dev = 0.0f;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        float d = src(j) - m;
        dev += d * d;
    }
    float iv = 1.0f / sqrtf(block_reduce(dev, red, false) / (float)h + eps);
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
        float r = (src(j) - m) * iv * kiln_to_f<T>(gamma[j]);
        if (beta) r += kiln_to_f<T>(beta[j]);
        y[j] = kiln_from_f<T>(r);
    }
    if (threadIdx.x == 0) {
        if (mean) *mean = m;
        if (inv) *inv = iv;
    }
}

template <typename T> struct skip_src {
    const T *x, *skip, *bias;
    int64_t row0, skip_n;
    __device__ float operator()(int64_t j) const
    {
        float v = kiln_to_f<T>(x[j]) + kiln_to_f<T>(skip[(row0 + j) % skip_n]);
        if (bias) v += kiln_to_f<T>(bias[j]);
        return kiln_round_to<T>(v);
    }
};

template <typename T>
__global__ void skip_ln_kernel(const T *x, const T *skip, int64_t skip_n, const T *bias, const T *gamma, const T *beta, T *y,
                               T *sum, float *mean, float *inv, int64_t rows, int64_t h, float eps)
{
    __shared__ float red[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        skip_src<T> src = {x + r * h, skip, bias, r * h, skip_n};
        ln_row<T>(src, h, gamma, beta, y + r * h, sum ? sum + r * h : NULL, mean ? mean + r : NULL, inv ? inv + r : NULL, eps,
                  red);
    }
}

extern "C" gpuError_t kiln_gpu_contrib_skip_ln(gpuStream_t s, int dtype, const void *x, const void *skip, int64_t skip_n,
                                               const void *bias, const void *gamma, const void *beta, void *y, void *sum,
                                               float *mean, float *inv, int64_t rows, int64_t h, float eps)
{
    if (rows <= 0 || h <= 0 || skip_n <= 0) return gpuSuccess;
    unsigned nb = rows < INT32_MAX ? (unsigned)rows : (unsigned)INT32_MAX;
#define SLN(T)                                                                                                       \
    skip_ln_kernel<T><<<nb, ROW_BLOCK, 0, s>>>((const T *)x, (const T *)skip, skip_n, (const T *)bias, (const T *)gamma, \
                                               (const T *)beta, (T *)y, (T *)sum, mean, inv, rows, h, eps)
    if (dtype == KILN_DTYPE_FLOAT32) SLN(float);
    else if (dtype == KILN_DTYPE_FLOAT16) SLN(kiln_gpu_half);
    else return kiln_gpu_bad_arg();
#undef SLN
    return gpuGetLastError();
}

__device__ __forceinline__ int64_t load_index(const void *p, bool is64, int64_t i)
{
    return is64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

template <typename T> struct embed_src {
    const T *w, *p, *g; /* the token's rows of the tables, NULL when its id is out of range */
    __device__ float operator()(int64_t j) const
    {
        float v = 0.0f;
        if (w) v += kiln_to_f<T>(w[j]);
        if (p) v += kiln_to_f<T>(p[j]);
        if (g) v += kiln_to_f<T>(g[j]);
        return kiln_round_to<T>(v);
    }
};

template <typename T> __global__ void embed_ln_kernel(kiln_gpu_embed a)
{
    __shared__ float red[32];
    int64_t H = a.H;
    for (int64_t t = blockIdx.x; t < a.B * a.S; t += gridDim.x) {
        int64_t w = load_index(a.ids, a.ids_64, t);
        int64_t p = a.pos ? load_index(a.pos, a.pos_64, a.pos_one_batch ? t % a.S : t) : t % a.S;
        int64_t g = a.seg ? load_index(a.seg, a.seg_64, t) : -1;
        embed_src<T> src;
        src.w = w >= 0 && w < a.V ? (const T *)a.word + w * H : NULL;
        src.p = p >= 0 && p < a.P ? (const T *)a.pos_emb + p * H : NULL;
        src.g = a.seg && g >= 0 && g < a.G ? (const T *)a.seg_emb + g * H : NULL;
        ln_row<T>(src, H, (const T *)a.gamma, (const T *)a.beta, (T *)a.y + t * H, a.sum ? (T *)a.sum + t * H : NULL, NULL,
                  NULL, a.eps, red);
    }
}

extern "C" gpuError_t kiln_gpu_contrib_embed_ln(gpuStream_t s, const kiln_gpu_embed *a)
{
    int64_t rows = a->B * a->S;
    if (rows <= 0 || a->H <= 0) return gpuSuccess;
    unsigned nb = rows < INT32_MAX ? (unsigned)rows : (unsigned)INT32_MAX;
    if (a->dtype == KILN_DTYPE_FLOAT32) embed_ln_kernel<float><<<nb, ROW_BLOCK, 0, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_FLOAT16) embed_ln_kernel<kiln_gpu_half><<<nb, ROW_BLOCK, 0, s>>>(*a);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

__global__ void mask_index_kernel(const void *mask, bool mask_64, int32_t *mi, int64_t B, int64_t S)
{
    __shared__ float red[32];
    for (int64_t b = blockIdx.x; b < B; b += gridDim.x) {
        float n = 0.0f; /* counts of up to 2^24 per thread are exact */
        for (int64_t j = threadIdx.x; mask && j < S; j += blockDim.x) n += load_index(mask, mask_64, b * S + j) == 1;
        float tot = block_reduce(n, red, false);
        if (threadIdx.x == 0) mi[b] = (int32_t)tot;
    }
}

extern "C" gpuError_t kiln_gpu_contrib_mask_index(gpuStream_t s, const void *mask, bool mask_64, int32_t *mi, int64_t B,
                                                  int64_t S)
{
    if (B <= 0) return gpuSuccess;
    unsigned nb = B < 65535 ? (unsigned)B : 65535u;
    mask_index_kernel<<<nb, ROW_BLOCK, 0, s>>>(mask, mask_64, mi, B, S);
    return gpuGetLastError();
}

/* ---- the FusedGemm / FusedConv epilogue ---- */

__device__ __forceinline__ float act_f(int kind, float x, float a, float b, float g)
{
    switch (kind) {
    case KILN_GPU_ACT_RELU: return x < 0.0f ? 0.0f : x;
    case KILN_GPU_ACT_TANH: return tanhf(x);
    case KILN_GPU_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case KILN_GPU_ACT_SOFTSIGN: return x / (1.0f + fabsf(x));
    case KILN_GPU_ACT_SOFTPLUS: return x > 30.0f ? x : log1pf(expf(x));
    case KILN_GPU_ACT_LEAKY_RELU: return x < 0.0f ? a * x : x;
    case KILN_GPU_ACT_HARD_SIGMOID: return fminf(fmaxf(a * x + b, 0.0f), 1.0f);
    case KILN_GPU_ACT_ELU: return x < 0.0f ? a * expm1f(x) : x;
    case KILN_GPU_ACT_SELU: return g * (x <= 0.0f ? a * expm1f(x) : x);
    case KILN_GPU_ACT_THRESHOLDED_RELU: return x > a ? x : 0.0f;
    case KILN_GPU_ACT_SCALED_TANH: return a * tanhf(b * x);
    case KILN_GPU_ACT_PARAMETRIC_SOFTPLUS: {
        float t = b * x;
        return a * (t > 30.0f ? t : log1pf(expf(t)));
    }
    case KILN_GPU_ACT_CLIP: return isnan(x) ? x : fminf(fmaxf(x, a), b);
    default: return x;
    }
}

template <typename T> __global__ void act_kernel(T *y, const T *z, int64_t n, int kind, float a, float b, float g)
{
    KILN_GRID_LOOP(i, n) {
        float v = kiln_to_f<T>(y[i]);
        if (z) v += kiln_to_f<T>(z[i]);
        y[i] = kiln_from_f<T>(act_f(kind, v, a, b, g));
    }
}

extern "C" gpuError_t kiln_gpu_contrib_act(gpuStream_t s, int dtype, void *y, const void *z, int64_t n, int kind, float alpha,
                                           float beta, float gamma)
{
    if (n <= 0 || (kind == KILN_GPU_ACT_NONE && !z)) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, THREADS);
    if (dtype == KILN_DTYPE_FLOAT32)
        act_kernel<float><<<nb, THREADS, 0, s>>>((float *)y, (const float *)z, n, kind, alpha, beta, gamma);
    else if (dtype == KILN_DTYPE_FLOAT16)
        act_kernel<kiln_gpu_half><<<nb, THREADS, 0, s>>>((kiln_gpu_half *)y, (const kiln_gpu_half *)z, n, kind, alpha, beta,
                                                         gamma);
    else if (dtype == KILN_DTYPE_BFLOAT16)
        act_kernel<kiln_gpu_bf16><<<nb, THREADS, 0, s>>>((kiln_gpu_bf16 *)y, (const kiln_gpu_bf16 *)z, n, kind, alpha, beta,
                                                         gamma);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

/* ---- attention ---- */

/* Element d of head n, row s of a view, bias added and rounded as the reference holds it. */
template <typename T>
__device__ __forceinline__ float view_load(const kiln_gpu_attn_view &v, int64_t hd, int64_t b, int64_t n, int64_t s, int64_t d)
{
    float x = kiln_to_f<T>(((const T *)v.p)[b * v.sb + n * v.sn + s * v.ss + d]);
    if (v.bias) x = kiln_round_to<T>(x + kiln_to_f<T>(((const T *)v.bias)[n * hd + d]));
    return x;
}

template <typename T>
__global__ void kv_kernel(T *dst, const T *past, kiln_gpu_attn_view src, int64_t B, int64_t N, int64_t P, int64_t L,
                          int64_t hd)
{
    int64_t T_ = P + L;
    KILN_GRID_LOOP(i, B * N * T_ * hd) {
        int64_t d = i % hd, r = i / hd, t = r % T_, bn = r / T_;
        if (t < P) dst[i] = past[(bn * P + t) * hd + d];
        else dst[i] = kiln_from_f<T>(view_load<T>(src, hd, bn / N, bn % N, t - P, d));
    }
}

extern "C" gpuError_t kiln_gpu_contrib_kv(gpuStream_t s, int dtype, void *dst, const void *past, kiln_gpu_attn_view src,
                                          int64_t B, int64_t N, int64_t P, int64_t L, int64_t hd)
{
    int64_t n = B * N * (P + L) * hd;
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, THREADS);
    if (dtype == KILN_DTYPE_FLOAT32)
        kv_kernel<float><<<nb, THREADS, 0, s>>>((float *)dst, (const float *)past, src, B, N, P, L, hd);
    else if (dtype == KILN_DTYPE_FLOAT16)
        kv_kernel<kiln_gpu_half><<<nb, THREADS, 0, s>>>((kiln_gpu_half *)dst, (const kiln_gpu_half *)past, src, B, N, P, L, hd);
    else if (dtype == KILN_DTYPE_BFLOAT16)
        kv_kernel<kiln_gpu_bf16><<<nb, THREADS, 0, s>>>((kiln_gpu_bf16 *)dst, (const kiln_gpu_bf16 *)past, src, B, N, P, L, hd);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}

/* The additive mask of key t for query s of batch row b (kiln_contrib_attn_mask_fill's rules). */
__device__ __forceinline__ float mask_add(const kiln_gpu_attn &a, int64_t b, int64_t s, int64_t t)
{
    float m = 0.0f;
    if (a.mask) {
        bool keep;
        const int32_t *mi = a.mask;
        if (a.mask_rank == 1) {
            keep = t < mi[b];
            if (a.mask_d0 == 2 * a.B) keep = keep && t >= mi[a.B + b];
        } else if (a.mask_rank == 2) {
            keep = mi[b * a.T + t] > 0;
        } else if (a.mask_rank == 3) {
            keep = mi[(b * a.S + s) * a.T + t] > 0;
        } else {
            keep = mi[(b * a.mask_M + a.P + s) * a.mask_M + t] > 0;
        }
        if (!keep) m = a.filter;
    }
    if (a.causal && s < a.S - 1 && t > a.P + s) m += a.filter;
    return m;
}

template <typename T> __global__ void attn_kernel(kiln_gpu_attn a)
{
    extern __shared__ float sm[];
    float *qs = sm, *sc = sm + a.H, *red = sc + a.T;
    int64_t row = blockIdx.x; /* ((b * N) + n) * S + s */
    int64_t s = row % a.S, bn = row / a.S, n = bn % a.N, b = bn / a.N;
    for (int64_t d = threadIdx.x; d < a.H; d += blockDim.x) qs[d] = view_load<T>(a.q, a.H, b, n, s, d);
    __syncthreads();
    const T *kp = (const T *)a.k + bn * a.T * a.H, *vp = (const T *)a.v + bn * a.T * a.Hv;
    const T *ab = a.ab ? (const T *)a.ab + b * a.ab_b + n * a.ab_n + s * a.T : NULL;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int64_t t = warp; t < a.T; t += nw) {
        float acc = 0.0f;
        for (int64_t d = lane; d < a.H; d += 32) acc += qs[d] * kiln_to_f<T>(kp[t * a.H + d]);
        acc = kiln_warp_sum(acc);
        if (lane == 0) {
            float x = acc * a.scale + mask_add(a, b, s, t);
            if (ab) x += kiln_to_f<T>(ab[t]);
            if (a.qk) ((T *)a.qk)[row * a.T + t] = kiln_from_f<T>(x);
            sc[t] = x;
        }
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t t = threadIdx.x; t < a.T; t += blockDim.x) mx = fmaxf(mx, sc[t]);
    mx = block_reduce(mx, red, true);
    float sum = 0.0f;
    for (int64_t t = threadIdx.x; t < a.T; t += blockDim.x) {
        float e = expf(sc[t] - mx);
        sc[t] = e;
        sum += e;
    }
    sum = block_reduce(sum, red, false); /* its barriers also publish sc */
    T *y = (T *)a.y + (b * a.S + s) * a.N * a.Hv + n * a.Hv;
    for (int64_t d = threadIdx.x; d < a.Hv; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t t = 0; t < a.T; t++) acc += sc[t] * kiln_to_f<T>(vp[t * a.Hv + d]);
        y[d] = kiln_from_f<T>(acc / sum);
    }
}

extern "C" gpuError_t kiln_gpu_contrib_attn(gpuStream_t s, const kiln_gpu_attn *a)
{
    int64_t rows = a->B * a->N * a->S;
    if (rows <= 0) return gpuSuccess;
    size_t smem = (size_t)(a->H + a->T + 32) * sizeof(float);
    if (rows > INT32_MAX || a->T <= 0 || smem > KILN_GPU_ATTN_MAX_SMEM) return kiln_gpu_bad_arg();
    if (a->dtype == KILN_DTYPE_FLOAT32) attn_kernel<float><<<(unsigned)rows, ATTN_BLOCK, smem, s>>>(*a);
    else if (a->dtype == KILN_DTYPE_FLOAT16) attn_kernel<kiln_gpu_half><<<(unsigned)rows, ATTN_BLOCK, smem, s>>>(*a);
    else return kiln_gpu_bad_arg();
    return gpuGetLastError();
}
