/* k_cnn.cu - the cnn family's GPU kernels: im2col / col2im around cuBLAS GEMMs, direct
 * depthwise convolution, window and global pooling, Resize (nearest, n-linear, cubic) and the
 * permuted gather of DepthToSpace / SpaceToDepth. Semantics follow the reference kernels in
 * src/ops/nn_conv.c, nn_pool.c and image.c. */
#include "gpu/kcommon.cuh"
#include "gpu/k_cnn.h"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define CNN_BLOCK 256u

/* ---- dispatch over the floating element types ---- */

#define CNN_DISPATCH_FLOAT(dtype, T, ...)                                                     \
    switch (dtype) {                                                                          \
    case KILN_DTYPE_FLOAT32: { typedef float T; __VA_ARGS__; break; }                          \
    case KILN_DTYPE_FLOAT16: { typedef kiln_gpu_half T; __VA_ARGS__; break; }                  \
    case KILN_DTYPE_BFLOAT16: { typedef kiln_gpu_bf16 T; __VA_ARGS__; break; }                 \
    default: return gpuErrorInvalidValue;                                                     \
    }

#if defined(KILN_HIP)
#define gpuErrorInvalidValue hipErrorInvalidValue
#else
#define gpuErrorInvalidValue cudaErrorInvalidValue
#endif

/* The conv-like kernels run on a 2-D grid: y over rows (one (n, channel[, tap]) each), x over
 * the output positions of a row, so the costly index arithmetic is done once per row and the
 * per-element unflattening uses 32-bit division (row lengths fit int: cuBLAS needs that). */

/* Copies w's spatial arrays into per-thread ints / int64s of static size NSP. */
#define CNN_WINDOW_LOCALS(NSP)                                                                \
    int out_d[NSP], in_d[NSP], k_d[NSP];                                                      \
    int64_t str[NSP], dil[NSP], pad[NSP];                                                     \
    _Pragma("unroll") for (int i = 0; i < NSP; i++)                                           \
    {                                                                                         \
        out_d[i] = (int)w.out[i], in_d[i] = (int)w.in[i], k_d[i] = (int)w.k[i];               \
        str[i] = w.stride[i], dil[i] = w.dil[i], pad[i] = w.pad[i];                           \
    }

template <int NSP> __device__ __forceinline__ void cnn_unflatten32(const int *dims, int i, int *idx)
{
#pragma unroll
    for (int k = NSP - 1; k >= 0; k--) {
        int q = i / dims[k];
        idx[k] = i - q * dims[k];
        i = q;
    }
}

/* q = a / b, r = a % b for a >= 0, b > 0: 32-bit division when both fit (the common case). */
__device__ __forceinline__ void cnn_divmod(int64_t a, int64_t b, int64_t &q, int64_t &r)
{
    if (((uint64_t)a | (uint64_t)b) <= 0xffffffffull) {
        uint32_t qa = (uint32_t)a / (uint32_t)b;
        q = qa, r = (int64_t)((uint32_t)a - qa * (uint32_t)b);
    } else {
        q = a / b, r = a - (a / b) * b;
    }
}

static dim3 cnn_grid(int64_t rows, int64_t per_row)
{
    int64_t gx = (per_row + CNN_BLOCK - 1) / CNN_BLOCK, gy = rows;
    if (gx < 1) gx = 1;
    if (gy < 1) gy = 1;
    if (gy > 65535) gy = 65535;
    int64_t cap = ((int64_t)1 << 20) / gy + 1; /* enough blocks to fill the device, not more */
    if (gx > cap) gx = cap;
    return dim3((unsigned)gx, (unsigned)gy, 1);
}

#define CNN_ROW_LOOP(row, rows) for (int64_t row = blockIdx.y; row < (rows); row += gridDim.y)
#define CNN_COL_LOOP(j, n) for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < (n); j += gridDim.x * blockDim.x)

#define CNN_DISPATCH_NSP(nsp, NSP, ...)                                                       \
    switch (nsp) {                                                                            \
    case 1: { const int NSP = 1; __VA_ARGS__; break; }                                         \
    case 2: { const int NSP = 2; __VA_ARGS__; break; }                                         \
    case 3: { const int NSP = 3; __VA_ARGS__; break; }                                         \
    default: return gpuErrorInvalidValue;                                                     \
    }

/* ---- im2col ---- */

/* rows = nb * C * ks, row (n*C + c)*ks + kp; col[row][op]. */
template <typename T, int NSP>
__global__ void im2col_kernel(const T *__restrict__ X, T *__restrict__ col, int64_t rows, int ks, int os,
                              int64_t is, kiln_gpu_window w)
{
    CNN_WINDOW_LOCALS(NSP)
    CNN_ROW_LOOP(row, rows)
    {
        int64_t nc, kp64;
        cnn_divmod(row, ks, nc, kp64);
        int kp = (int)kp64;
        int q[NSP];
        cnn_unflatten32<NSP>(k_d, kp, q);
        int64_t base[NSP];
#pragma unroll
        for (int i = 0; i < NSP; i++) base[i] = q[i] * dil[i] - pad[i];
        const T *x = X + nc * is;
        T *c = col + row * os;
        CNN_COL_LOOP(op, os)
        {
            int o[NSP];
            cnn_unflatten32<NSP>(out_d, op, o);
            int64_t off = 0;
            bool inside = true;
#pragma unroll
            for (int i = 0; i < NSP; i++) {
                int64_t p = o[i] * str[i] + base[i];
                inside = inside && p >= 0 && p < in_d[i];
                off = off * in_d[i] + p;
            }
            c[op] = inside ? x[off] : kiln_from_f<T>(0.0f);
        }
    }
}

extern "C" gpuError_t kiln_gpu_cnn_im2col(int dtype, const void *X, void *col, int64_t nb, int64_t C,
                                          kiln_gpu_window w, gpuStream_t s)
{
    int64_t ks = 1, os = 1, is = 1;
    for (int i = 0; i < w.nsp; i++) ks *= w.k[i], os *= w.out[i], is *= w.in[i];
    int64_t rows = nb * C * ks;
    if (rows <= 0 || os <= 0) return gpuSuccess;
    if (os > INT32_MAX || ks > INT32_MAX) return gpuErrorInvalidValue;
    dim3 grid = cnn_grid(rows, os);
    CNN_DISPATCH_FLOAT(dtype, T,
                       CNN_DISPATCH_NSP(w.nsp, NSP,
                                        im2col_kernel<T, NSP><<<grid, CNN_BLOCK, 0, s>>>(
                                            (const T *)X, (T *)col, rows, (int)ks, (int)os, is, w)))
    return gpuGetLastError();
}

/* ---- bias ---- */

template <typename T>
__global__ void bias_fill_kernel(T *__restrict__ Y, const T *__restrict__ B, int64_t rows, int64_t M, int plane)
{
    CNN_ROW_LOOP(row, rows)
    {
        int64_t n_, m_;
        cnn_divmod(row, M, n_, m_);
        T b = B[m_];
        T *y = Y + row * plane;
        CNN_COL_LOOP(j, plane) y[j] = b;
    }
}

extern "C" gpuError_t kiln_gpu_cnn_bias_fill(int dtype, void *Y, const void *B, int64_t N, int64_t M,
                                             int64_t plane, gpuStream_t s)
{
    int64_t rows = N * M;
    if (rows <= 0 || plane <= 0) return gpuSuccess;
    if (plane > INT32_MAX) return gpuErrorInvalidValue;
    dim3 grid = cnn_grid(rows, plane);
    CNN_DISPATCH_FLOAT(dtype, T,
                       bias_fill_kernel<T><<<grid, CNN_BLOCK, 0, s>>>((T *)Y, (const T *)B, rows, M, (int)plane))
    return gpuGetLastError();
}

/* ---- direct convolution, one input channel per group ---- */

/* rows = N * M, row n*M + m; Y[row][op]. */
template <typename T, int NSP>
__global__ void conv_direct_kernel(const T *__restrict__ X, const T *__restrict__ W, const T *__restrict__ B,
                                   T *__restrict__ Y, int64_t rows, int64_t C, int64_t M, int ks, int os,
                                   int64_t is, kiln_gpu_window w)
{
    CNN_WINDOW_LOCALS(NSP)
    int64_t Mg = M / C;
    CNN_ROW_LOOP(row, rows)
    {
        int64_t m, n, c_, r_;
        cnn_divmod(row, M, n, m);
        cnn_divmod(m, Mg, c_, r_);
        const T *x = X + (n * C + c_) * is;
        const T *wm = W + m * ks;
        float b = B ? kiln_to_f(B[m]) : 0.0f;
        T *y = Y + row * os;
        CNN_COL_LOOP(op, os)
        {
            int o[NSP], q[NSP];
            cnn_unflatten32<NSP>(out_d, op, o);
            int64_t p0[NSP];
#pragma unroll
            for (int i = 0; i < NSP; i++) p0[i] = o[i] * str[i] - pad[i], q[i] = 0;
            float acc = b;
            for (int kp = 0; kp < ks; kp++) {
                int64_t off = 0;
                bool inside = true;
#pragma unroll
                for (int i = 0; i < NSP; i++) {
                    int64_t p = p0[i] + q[i] * dil[i];
                    inside = inside && p >= 0 && p < in_d[i];
                    off = off * in_d[i] + p;
                }
                if (inside) acc += kiln_to_f(x[off]) * kiln_to_f(wm[kp]);
#pragma unroll
                for (int i = NSP - 1; i >= 0; i--) { /* next tap, row-major */
                    if (++q[i] < k_d[i]) break;
                    q[i] = 0;
                }
            }
            y[op] = kiln_from_f<T>(acc);
        }
    }
}

extern "C" gpuError_t kiln_gpu_cnn_conv_direct(int dtype, const void *X, const void *W, const void *B, void *Y,
                                               int64_t N, int64_t C, int64_t M, kiln_gpu_window w,
                                               gpuStream_t s)
{
    int64_t ks = 1, os = 1, is = 1;
    for (int i = 0; i < w.nsp; i++) ks *= w.k[i], os *= w.out[i], is *= w.in[i];
    int64_t rows = N * M;
    if (rows <= 0 || os <= 0 || C <= 0) return gpuSuccess;
    if (os > INT32_MAX || ks > INT32_MAX) return gpuErrorInvalidValue;
    dim3 grid = cnn_grid(rows, os);
    CNN_DISPATCH_FLOAT(dtype, T,
                       CNN_DISPATCH_NSP(w.nsp, NSP,
                                        conv_direct_kernel<T, NSP><<<grid, CNN_BLOCK, 0, s>>>(
                                            (const T *)X, (const T *)W, (const T *)B, (T *)Y, rows, C, M, (int)ks,
                                            (int)os, is, w)))
    return gpuGetLastError();
}

/* ---- 2-D depthwise convolution, tiled through shared memory ---- */

/* Each thread computes DW_R x DW_R adjacent outputs of one plane; the block's threads
 * (blockDim.x x blockDim.y a plane, blockDim.z planes) cover a tile of
 * (blockDim.y DW_R) x (blockDim.x DW_R) outputs of blockDim.z planes. The input window of the
 * tile is staged in shared memory as float (zeros for padding), rows of `sw` floats (a multiple
 * of 4), and a thread reads each input row it needs once, as float4s, into registers, where the
 * row serves every output row and tap that uses it: about (DW_R - 1) S + K loads of a row for
 * DW_R^2 K^2 multiply-adds. K (square kernel), S (stride) and DW_R are compile-time, so the
 * loops unroll and the tap test below folds away; dilation 1. */
#define DW_R 4

/* The input columns a thread reads from a row, rounded up to whole float4s. */
#define DW_IW(K, S) ((((DW_R - 1) * (S) + (K)) + 3) / 4 * 4)

template <typename T, int K, int S>
__global__ void __launch_bounds__(256)
    dw2d_kernel(const T *__restrict__ X, const T *__restrict__ W, const T *__restrict__ B, const T *__restrict__ Z,
                T *__restrict__ Y, int planes, int C, int M, int Mg, int H, int Wd, int OH, int OW, int pad_t, int pad_l,
                int sh, int sw, bool relu)
{
    extern __shared__ float dw_tile[];
    const int tx = threadIdx.x, ty = threadIdx.y, tz = threadIdx.z, nthr = blockDim.x * blockDim.y;
    float *tile = dw_tile + tz * sh * sw;
    const int ox0 = blockIdx.x * blockDim.x * DW_R, oy0 = blockIdx.y * blockDim.y * DW_R;
    const int ix0 = ox0 * S - pad_l, iy0 = oy0 * S - pad_t;
    constexpr int ROWS = (DW_R - 1) * S + K, IW = DW_IW(K, S);
    for (int pz = blockIdx.z * blockDim.z; pz < planes; pz += gridDim.z * blockDim.z) { /* uniform in the block */
        const int p = pz + tz;
        const bool live = p < planes;
        const int n = live ? p / M : 0, m = live ? p - n * M : 0;
        __syncthreads(); /* the last plane's readers are done with the tile */
        if (live) {
            const T *x = X + ((int64_t)n * C + m / Mg) * H * Wd;
            for (int i = ty * blockDim.x + tx; i < sh * sw; i += nthr) {
                int r = i / sw, cc = i - r * sw, iy = iy0 + r, ix = ix0 + cc;
                tile[i] = iy >= 0 && iy < H && ix >= 0 && ix < Wd ? kiln_to_f(x[(int64_t)iy * Wd + ix]) : 0.0f;
            }
        }
        __syncthreads();
        if (!live) continue;
        float w[K * K];
#pragma unroll
        for (int i = 0; i < K * K; i++) w[i] = kiln_to_f(W[(int64_t)m * K * K + i]);
        const float b = B ? kiln_to_f(B[m]) : 0.0f;
        float acc[DW_R][DW_R];
#pragma unroll
        for (int i = 0; i < DW_R; i++)
#pragma unroll
            for (int j = 0; j < DW_R; j++) acc[i][j] = b;
        const float *t0 = tile + ty * DW_R * S * sw + tx * DW_R * S;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float row[IW];
#pragma unroll
            for (int j = 0; j < IW / 4; j++) {
                float4 v = reinterpret_cast<const float4 *>(t0 + r * sw)[j];
                row[4 * j] = v.x, row[4 * j + 1] = v.y, row[4 * j + 2] = v.z, row[4 * j + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < DW_R; i++) {
                const int ky = r - i * S;
                if (ky < 0 || ky >= K) continue;
#pragma unroll
                for (int j = 0; j < DW_R; j++)
#pragma unroll
                    for (int kx = 0; kx < K; kx++) acc[i][j] = fmaf(row[j * S + kx], w[ky * K + kx], acc[i][j]);
            }
        }
        const int64_t plane = (int64_t)p * OH * OW;
#pragma unroll
        for (int i = 0; i < DW_R; i++) {
            const int oy = oy0 + ty * DW_R + i;
            if (oy >= OH) break;
#pragma unroll
            for (int j = 0; j < DW_R; j++) {
                const int ox = ox0 + tx * DW_R + j;
                if (ox >= OW) break;
                const int64_t at = plane + (int64_t)oy * OW + ox;
                float v = acc[i][j];
                if (Z) v += kiln_to_f(Z[at]);
                if (relu && v < 0.0f) v = 0.0f; /* NaN stays */
                Y[at] = kiln_from_f<T>(v);
            }
        }
    }
}

/* The block shape of a dw2d launch and its shared memory; false where the window is not one
 * dw2d_kernel is instantiated for or its tile cannot fit. */
static bool dw2d_plan(const kiln_gpu_window *w, int64_t planes, dim3 *block, dim3 *grid, int *sh, int *sw, size_t *smem)
{
    if (w->nsp != 2 || w->k[0] != w->k[1] || w->stride[0] != w->stride[1] || w->dil[0] != 1 || w->dil[1] != 1)
        return false;
    int64_t K = w->k[0], S = w->stride[0];
    if ((K != 3 && K != 5 && K != 7) || (S != 1 && S != 2) || planes > INT32_MAX || w->in[0] * w->in[1] > INT32_MAX ||
        w->out[0] * w->out[1] > INT32_MAX || w->out[0] < 1 || w->out[1] < 1)
        return false;
    int64_t tw = (w->out[1] + DW_R - 1) / DW_R, th = (w->out[0] + DW_R - 1) / DW_R;
    int bx = (int)(tw < 16 ? tw : 16);
    int by = (int)(th < 128 / bx ? th : 128 / bx);
    if (by < 1) by = 1;
    int bz = 128 / (bx * by);
    if (bz < 1) bz = 1;
    if (bz > planes) bz = (int)planes;
    const int iw = DW_IW(K, S);
    for (;;) {
        int64_t cols = (int64_t)(bx * DW_R - 1) * S + K, last = (int64_t)(bx - 1) * DW_R * S + iw;
        *sw = (int)(((cols > last ? cols : last) + 3) / 4 * 4);
        *sh = (int)((by * DW_R - 1) * S + K);
        *smem = (size_t)bz * (size_t)*sh * (size_t)*sw * sizeof(float);
        if (*smem <= 48 * 1024) break;
        if (bz > 1) bz = (bz + 1) / 2;
        else if (by > 1) by = (by + 1) / 2;
        else return false;
    }
    *block = dim3((unsigned)bx, (unsigned)by, (unsigned)bz);
    int64_t gz = (planes + bz - 1) / bz;
    *grid = dim3((unsigned)((tw + bx - 1) / bx), (unsigned)((th + by - 1) / by), (unsigned)(gz < 65535 ? gz : 65535));
    return grid->x <= INT32_MAX && grid->y <= 65535;
}

extern "C" int64_t kiln_gpu_cnn_dw2d_threads(const kiln_gpu_window *w, int64_t planes)
{
    dim3 b, g;
    int sh, sw;
    size_t smem;
    if (!dw2d_plan(w, planes, &b, &g, &sh, &sw, &smem)) return 0;
    return planes * ((w->out[0] + DW_R - 1) / DW_R) * ((w->out[1] + DW_R - 1) / DW_R);
}

#define DW2D_LAUNCH(T, KK, SS)                                                                                   \
    dw2d_kernel<T, KK, SS><<<grid, block, smem, s>>>((const T *)X, (const T *)W, (const T *)B, (const T *)Z, (T *)Y, \
                                                    (int)planes, (int)C, (int)M, (int)(M / C), (int)w.in[0],      \
                                                    (int)w.in[1], (int)w.out[0], (int)w.out[1], (int)w.pad[0],    \
                                                    (int)w.pad[1], sh, sw, relu)

#define DW2D_BY_S(T, KK)                     \
    if (w.stride[0] == 1) DW2D_LAUNCH(T, KK, 1); \
    else DW2D_LAUNCH(T, KK, 2)

extern "C" gpuError_t kiln_gpu_cnn_conv_dw2d(int dtype, const void *X, const void *W, const void *B, const void *Z,
                                             bool relu, void *Y, int64_t N, int64_t C, int64_t M, kiln_gpu_window w,
                                             gpuStream_t s)
{
    int64_t planes = N * M;
    dim3 block, grid;
    int sh, sw;
    size_t smem;
    if (C <= 0 || M % C || !dw2d_plan(&w, planes, &block, &grid, &sh, &sw, &smem)) return gpuErrorInvalidValue;
    if (planes == 0) return gpuSuccess;
    CNN_DISPATCH_FLOAT(dtype, T, {
        if (w.k[0] == 3) { DW2D_BY_S(T, 3); }
        else if (w.k[0] == 5) { DW2D_BY_S(T, 5); }
        else { DW2D_BY_S(T, 7); }
    })
    return gpuGetLastError();
}

/* ---- col2im (ConvTranspose) ---- */

/* rows = nb * M, row n*M + m; Y[row][op] gathers cols[row][kp][ii]. */
template <typename T, int NSP>
__global__ void col2im_kernel(const float *__restrict__ cols, const T *__restrict__ B, T *__restrict__ Y,
                              int64_t rows, int64_t M, int ks, int os, int64_t is, kiln_gpu_window w)
{
    CNN_WINDOW_LOCALS(NSP)
    CNN_ROW_LOOP(row, rows)
    {
        const float *c = cols + row * ks * is;
        int64_t n_, m_;
        cnn_divmod(row, M, n_, m_);
        float b = B ? kiln_to_f(B[m_]) : 0.0f;
        T *y = Y + row * os;
        CNN_COL_LOOP(op, os)
        {
            int o[NSP], q[NSP];
            cnn_unflatten32<NSP>(out_d, op, o);
#pragma unroll
            for (int i = 0; i < NSP; i++) q[i] = 0;
            float acc = 0.0f;
            for (int kp = 0; kp < ks; kp++) {
                int64_t off = 0;
                bool hit = true;
#pragma unroll
                for (int i = 0; i < NSP; i++) {
                    /* input position ii with ii*stride - pad + q*dil == o */
                    int64_t t = o[i] + pad[i] - q[i] * dil[i];
                    int64_t ii = t / str[i];
                    hit = hit && t >= 0 && ii * str[i] == t && ii < in_d[i];
                    off = off * in_d[i] + ii;
                }
                if (hit) acc += c[kp * is + off];
#pragma unroll
                for (int i = NSP - 1; i >= 0; i--) {
                    if (++q[i] < k_d[i]) break;
                    q[i] = 0;
                }
            }
            y[op] = kiln_from_f<T>(acc + b);
        }
    }
}

extern "C" gpuError_t kiln_gpu_cnn_col2im(int dtype, const float *cols, const void *B, void *Y, int64_t nb,
                                          int64_t M, kiln_gpu_window w, gpuStream_t s)
{
    int64_t ks = 1, os = 1, is = 1;
    for (int i = 0; i < w.nsp; i++) ks *= w.k[i], os *= w.out[i], is *= w.in[i];
    int64_t rows = nb * M;
    if (rows <= 0 || os <= 0) return gpuSuccess;
    if (os > INT32_MAX || ks > INT32_MAX) return gpuErrorInvalidValue;
    dim3 grid = cnn_grid(rows, os);
    CNN_DISPATCH_FLOAT(dtype, T,
                       CNN_DISPATCH_NSP(w.nsp, NSP,
                                        col2im_kernel<T, NSP><<<grid, CNN_BLOCK, 0, s>>>(
                                            cols, (const T *)B, (T *)Y, rows, M, (int)ks, (int)os, is, w)))
    return gpuGetLastError();
}

/* ---- window pooling ---- */

/* rows = planes; Y[row][op], I the flat index into X of each max. */
template <typename T, int NSP>
__global__ void pool_kernel(const T *__restrict__ X, T *__restrict__ Y, int64_t *__restrict__ I, int64_t rows,
                            int ks, int os, int64_t is, int mode, kiln_gpu_window w, bool include_pad,
                            bool col_major, float pw)
{
    CNN_WINDOW_LOCALS(NSP)
    int64_t pad_end[NSP];
#pragma unroll
    for (int i = 0; i < NSP; i++) pad_end[i] = w.pad_end[i];
    CNN_ROW_LOOP(plane, rows)
    {
        const T *x = X + plane * is;
        CNN_COL_LOOP(op, os)
        {
            int o[NSP], q[NSP];
            int64_t p[NSP], best_p[NSP];
            cnn_unflatten32<NSP>(out_d, op, o);
#pragma unroll
            for (int i = 0; i < NSP; i++) q[i] = 0, best_p[i] = 0;
            float acc = 0.0f, best = 0.0f;
            int64_t n_in = 0, n_counted = 0;
            bool found = false;
            for (int kp = 0; kp < ks; kp++) {
                bool inside = true, counted = true;
                int64_t off = 0;
#pragma unroll
                for (int i = 0; i < NSP; i++) {
                    p[i] = o[i] * str[i] - pad[i] + q[i] * dil[i];
                    inside = inside && p[i] >= 0 && p[i] < in_d[i];
                    counted = counted && p[i] < in_d[i] + pad_end[i];
                    off = off * in_d[i] + p[i];
                }
#pragma unroll
                for (int i = NSP - 1; i >= 0; i--) {
                    if (++q[i] < k_d[i]) break;
                    q[i] = 0;
                }
                n_counted += counted;
                if (!inside) continue;
                float v = kiln_to_f(x[off]);
                n_in++;
                if (mode == KILN_GPU_POOL_AVG) {
                    acc += v;
                } else if (mode == KILN_GPU_POOL_LP) {
                    acc += powf(fabsf(v), pw);
                } else if (!found || v > best || (isnan(v) && !isnan(best))) {
                    best = v, found = true;
#pragma unroll
                    for (int i = 0; i < NSP; i++) best_p[i] = p[i];
                }
            }
            float r = mode == KILN_GPU_POOL_MAX  ? best
                      : mode == KILN_GPU_POOL_LP ? powf(acc, 1.0f / pw)
                                                 : acc / (float)(include_pad ? n_counted : n_in);
            int64_t e = plane * os + op;
            Y[e] = kiln_from_f<T>(r);
            if (I) {
                int64_t off = 0;
                if (col_major) {
#pragma unroll
                    for (int i = NSP - 1; i >= 0; i--) off = off * in_d[i] + best_p[i];
                } else {
#pragma unroll
                    for (int i = 0; i < NSP; i++) off = off * in_d[i] + best_p[i];
                }
                I[e] = plane * is + off;
            }
        }
    }
}

extern "C" gpuError_t kiln_gpu_cnn_pool(int dtype, int mode, const void *X, void *Y, int64_t *I, int64_t planes,
                                        kiln_gpu_window w, bool include_pad, bool col_major, float p,
                                        gpuStream_t s)
{
    int64_t ks = 1, os = 1, is = 1;
    for (int i = 0; i < w.nsp; i++) ks *= w.k[i], os *= w.out[i], is *= w.in[i];
    if (planes <= 0 || os <= 0) return gpuSuccess;
    if (os > INT32_MAX || ks > INT32_MAX) return gpuErrorInvalidValue;
    dim3 grid = cnn_grid(planes, os);
    CNN_DISPATCH_FLOAT(dtype, T,
                       CNN_DISPATCH_NSP(w.nsp, NSP,
                                        pool_kernel<T, NSP><<<grid, CNN_BLOCK, 0, s>>>(
                                            (const T *)X, (T *)Y, I, planes, (int)ks, (int)os, is, mode, w,
                                            include_pad, col_major, p)))
    return gpuGetLastError();
}

/* ---- global pooling: one block per plane ---- */

/* Combines two partial results of a global pool. */
__device__ __forceinline__ float gpool_join(int mode, float a, float b)
{
    if (mode != KILN_GPU_POOL_MAX) return a + b;
    return (b > a || isnan(b)) ? b : a;
}

template <typename T>
__global__ void global_pool_kernel(const T *__restrict__ X, T *__restrict__ Y, int64_t planes, int64_t sz,
                                   int mode, float pw)
{
    __shared__ float part[32];
    float init = mode == KILN_GPU_POOL_MAX ? -INFINITY : 0.0f;
    for (int64_t pl = blockIdx.x; pl < planes; pl += gridDim.x) {
        const T *x = X + pl * sz;
        float acc = init;
        for (int64_t i = threadIdx.x; i < sz; i += blockDim.x) {
            float v = kiln_to_f(x[i]);
            if (mode == KILN_GPU_POOL_LP) v = powf(fabsf(v), pw);
            acc = gpool_join(mode, acc, v);
        }
        for (int d = 16; d > 0; d >>= 1) acc = gpool_join(mode, acc, __shfl_xor_sync(0xffffffffu, acc, d));
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
        if (lane == 0) part[warp] = acc;
        __syncthreads();
        if (warp == 0) {
            acc = lane < nwarps ? part[lane] : init;
            for (int d = 16; d > 0; d >>= 1) acc = gpool_join(mode, acc, __shfl_xor_sync(0xffffffffu, acc, d));
            if (lane == 0) {
                float r = mode == KILN_GPU_POOL_MAX  ? acc
                          : mode == KILN_GPU_POOL_LP ? powf(acc, 1.0f / pw)
                                                     : acc / (float)sz;
                Y[pl] = kiln_from_f<T>(r);
            }
        }
        __syncthreads();
    }
}

extern "C" gpuError_t kiln_gpu_cnn_global_pool(int dtype, int mode, const void *X, void *Y, int64_t planes,
                                               int64_t sz, float p, gpuStream_t s)
{
    if (planes <= 0) return gpuSuccess;
    unsigned block = sz >= 1024 ? 256u : sz >= 256 ? 128u : 32u;
    unsigned grid = planes > 65535 * 16 ? 65535u * 16u : (unsigned)planes;
    CNN_DISPATCH_FLOAT(dtype, T,
                       global_pool_kernel<T><<<grid, block, 0, s>>>((const T *)X, (T *)Y, planes, sz, mode, p))
    return gpuGetLastError();
}

/* ---- Resize ---- */

/* Interpolation taps of one output index along one axis (the reference's resize_taps). */
struct resize_tap {
    int64_t idx[4];
    float w[4];
    int extrap;
};

/* The reference's double arithmetic, unfused: __dmul_rn / __dadd_rn keep the compiler from
 * contracting a*b+c into an fma, so coordinates match the host bit for bit. */
__device__ double resize_coord(const kiln_gpu_resize &r, int ax, int64_t j)
{
    double scale = r.scale[ax], lo = r.lo[ax], hi = r.hi[ax];
    int64_t in_n = r.in[ax], out_n = r.out[ax];
    double out_w = __dmul_rn(scale, (double)in_n);
    double jd = (double)j;
    switch (r.ct) {
    case KILN_RESIZE_CT_HALF_PIXEL_SYM: {
        double offset = __dmul_rn((double)in_n / 2.0, __dadd_rn(1.0, -((double)out_n / out_w)));
        return __dadd_rn(__dadd_rn(offset, __dadd_rn(jd, 0.5) / scale), -0.5);
    }
    case KILN_RESIZE_CT_PYTORCH_HALF_PIXEL: return out_n > 1 ? __dadd_rn(__dadd_rn(jd, 0.5) / scale, -0.5) : 0.0;
    case KILN_RESIZE_CT_ALIGN_CORNERS:
        return out_n == 1 || out_w == 1.0 ? 0.0 : __dmul_rn(jd, (double)(in_n - 1)) / __dadd_rn(out_w, -1.0);
    case KILN_RESIZE_CT_ASYMMETRIC: return jd / scale;
    case KILN_RESIZE_CT_TF_HALF_PIXEL_NN: return __dadd_rn(jd, 0.5) / scale;
    case KILN_RESIZE_CT_TF_CROP:
        if (out_n == 1 || out_w == 1.0) return __dmul_rn(__dmul_rn(0.5, __dadd_rn(lo, hi)), (double)(in_n - 1));
        return __dadd_rn(__dmul_rn(lo, (double)(in_n - 1)),
                         __dmul_rn(__dmul_rn(jd, __dadd_rn(hi, -lo)), (double)(in_n - 1)) /
                             __dadd_rn(out_w, -1.0));
    default: return __dadd_rn(__dadd_rn(jd, 0.5) / scale, -0.5);
    }
}

__device__ double resize_cubic_weight(double x, double A)
{
    x = fabs(x);
    if (x <= 1)
        return __dadd_rn(__dmul_rn(__dmul_rn(__dadd_rn(__dmul_rn(__dadd_rn(A, 2.0), x), -__dadd_rn(A, 3.0)), x), x),
                         1.0);
    if (x < 2)
        return __dadd_rn(
            __dmul_rn(__dadd_rn(__dmul_rn(__dadd_rn(__dmul_rn(A, x), -__dmul_rn(5.0, A)), x), __dmul_rn(8.0, A)), x),
            -__dmul_rn(4.0, A));
    return 0;
}

/* One thread per (active axis, output index): fills the tap table. */
__global__ void resize_taps_kernel(kiln_gpu_resize r, resize_tap *taps, int64_t total)
{
    KILN_GRID_LOOP(e, total)
    {
        int64_t j = e;
        int ax = 0;
        for (; ax < r.rank; ax++) {
            if (!r.active[ax]) continue;
            if (j < r.out[ax]) break;
            j -= r.out[ax];
        }
        if (ax >= r.rank) continue;
        resize_tap t;
        double x = resize_coord(r, ax, j), last = (double)(r.in[ax] - 1);
        t.extrap = r.ct == KILN_RESIZE_CT_TF_CROP && (x < 0 || x > last);
        for (int k = 0; k < 4; k++) t.idx[k] = 0, t.w[k] = 0.0f;
        if (r.mode == KILN_RESIZE_NEAREST) {
            double f = floor(x), rr = x - f, p;
            switch (r.nr) {
            case KILN_RESIZE_NR_PREFER_CEIL: p = rr < 0.5 ? f : f + 1; break;
            case KILN_RESIZE_NR_FLOOR: p = f; break;
            case KILN_RESIZE_NR_CEIL: p = ceil(x); break;
            default: p = rr <= 0.5 ? f : f + 1; break;
            }
            t.idx[0] = (int64_t)fmax(0.0, fmin(p, last));
            t.w[0] = 1.0f;
        } else {
            int n = r.mode == KILN_RESIZE_LINEAR ? 2 : 4;
            double start = r.mode == KILN_RESIZE_LINEAR ? 0.0 : -1.0;
            double base = floor(x), ratio = x - base;
            if (ratio == 0) base -= 1, ratio = 1;
            double w[4], kept = 0;
            for (int k = 0; k < n; k++) {
                double d = (start + k) - ratio;
                w[k] = r.mode == KILN_RESIZE_LINEAR ? fmax(0.0, 1 - fabs(d)) : resize_cubic_weight(d, r.cubic_a);
            }
            for (int k = 0; k < n; k++) {
                double p = (base + start) + k;
                if (r.exclude_outside && (p < 0 || p > last)) w[k] = 0;
                kept += w[k];
                t.idx[k] = (int64_t)fmax(0.0, fmin(p, last));
            }
            for (int k = 0; k < n; k++) t.w[k] = (float)(r.exclude_outside && kept != 0 ? w[k] / kept : w[k]);
        }
        taps[e] = t;
    }
}

/* Output element -> (active-axis tap rows, offset over the inactive axes). */
struct resize_geom {
    int rank, n_active, n_taps;
    int64_t out[KILN_GPU_MAX_RANK], in_stride[KILN_GPU_MAX_RANK];
    int64_t tap_base[KILN_GPU_MAX_RANK]; /* first table row of axis k (active axes) */
    bool active[KILN_GPU_MAX_RANK];
};

template <typename T>
__global__ void resize_interp_kernel(const T *__restrict__ X, T *__restrict__ Y, const resize_tap *__restrict__ taps,
                                     resize_geom g, float extrap, int64_t total)
{
    KILN_GRID_LOOP(e, total)
    {
        const resize_tap *row[KILN_GPU_MAX_RANK];
        int64_t ax_stride[KILN_GPU_MAX_RANK];
        int na = 0;
        int64_t base = 0, i = e;
        bool ext = false;
        for (int k = g.rank - 1; k >= 0; k--) {
            int64_t q = i / g.out[k], o = i - q * g.out[k];
            i = q;
            if (g.active[k]) {
                row[na] = taps + g.tap_base[k] + o;
                ax_stride[na] = g.in_stride[k];
                ext = ext || row[na]->extrap;
                na++;
            } else {
                base += o * g.in_stride[k];
            }
        }
        float acc = 0.0f;
        if (!ext) {
            int64_t combos = 1;
            for (int a = 0; a < na; a++) combos *= g.n_taps;
            for (int64_t cmb = 0; cmb < combos; cmb++) {
                int64_t c = cmb, off = base;
                float wt = 1.0f;
                for (int a = 0; a < na; a++) {
                    int t = (int)(c % g.n_taps);
                    c /= g.n_taps;
                    wt *= row[a]->w[t];
                    off += row[a]->idx[t] * ax_stride[a];
                }
                if (wt != 0.0f) acc += wt * kiln_to_f(X[off]);
            }
        }
        Y[e] = kiln_from_f<T>(ext ? extrap : acc);
    }
}

template <typename U>
__global__ void resize_nearest_kernel(const U *__restrict__ X, U *__restrict__ Y, const resize_tap *__restrict__ taps,
                                      resize_geom g, U extrap, int64_t total)
{
    KILN_GRID_LOOP(e, total)
    {
        int64_t off = 0, i = e;
        bool ext = false;
        for (int k = g.rank - 1; k >= 0; k--) {
            int64_t q = i / g.out[k], o = i - q * g.out[k];
            i = q;
            if (g.active[k]) {
                const resize_tap *t = taps + g.tap_base[k] + o;
                ext = ext || t->extrap;
                off += t->idx[0] * g.in_stride[k];
            } else {
                off += o * g.in_stride[k];
            }
        }
        Y[e] = ext ? extrap : X[off];
    }
}

extern "C" size_t kiln_gpu_cnn_resize_ws_bytes(const kiln_gpu_resize *r)
{
    int64_t rows = 0;
    for (int k = 0; k < r->rank; k++)
        if (r->active[k]) rows += r->out[k];
    return (size_t)(rows > 0 ? rows : 1) * sizeof(resize_tap);
}

extern "C" gpuError_t kiln_gpu_cnn_resize(int dtype, size_t esize, const void *X, void *Y,
                                          const kiln_gpu_resize *r, void *ws, gpuStream_t s)
{
    resize_geom g;
    int64_t total = 1, rows = 0, st = 1;
    g.rank = r->rank;
    g.n_active = 0;
    g.n_taps = r->mode == KILN_RESIZE_NEAREST ? 1 : r->mode == KILN_RESIZE_LINEAR ? 2 : 4;
    for (int k = r->rank - 1; k >= 0; k--) {
        g.in_stride[k] = st;
        st *= r->in[k];
    }
    for (int k = 0; k < r->rank; k++) {
        g.out[k] = r->out[k];
        g.active[k] = r->active[k];
        g.tap_base[k] = rows;
        total *= r->out[k];
        if (r->active[k]) rows += r->out[k], g.n_active++;
    }
    if (total <= 0) return gpuSuccess;
    resize_tap *taps = (resize_tap *)ws;
    if (rows > 0) resize_taps_kernel<<<kiln_gpu_blocks(rows, CNN_BLOCK), CNN_BLOCK, 0, s>>>(*r, taps, rows);
    unsigned blocks = kiln_gpu_blocks(total, CNN_BLOCK);
    if (r->mode == KILN_RESIZE_NEAREST) {
        switch (esize) {
        case 1: resize_nearest_kernel<uint8_t><<<blocks, CNN_BLOCK, 0, s>>>((const uint8_t *)X, (uint8_t *)Y, taps, g,
                                                                             (uint8_t)r->extrap_bits, total); break;
        case 2: resize_nearest_kernel<uint16_t><<<blocks, CNN_BLOCK, 0, s>>>(
                    (const uint16_t *)X, (uint16_t *)Y, taps, g, (uint16_t)r->extrap_bits, total); break;
        case 4: resize_nearest_kernel<uint32_t><<<blocks, CNN_BLOCK, 0, s>>>(
                    (const uint32_t *)X, (uint32_t *)Y, taps, g, (uint32_t)r->extrap_bits, total); break;
        case 8: resize_nearest_kernel<uint64_t><<<blocks, CNN_BLOCK, 0, s>>>(
                    (const uint64_t *)X, (uint64_t *)Y, taps, g, (uint64_t)r->extrap_bits, total); break;
        default: return gpuErrorInvalidValue;
        }
        return gpuGetLastError();
    }
    CNN_DISPATCH_FLOAT(dtype, T,
                       resize_interp_kernel<T><<<blocks, CNN_BLOCK, 0, s>>>((const T *)X, (T *)Y, taps, g,
                                                                            r->extrapolation, total))
    return gpuGetLastError();
}

/* ---- permuted gather (DepthToSpace / SpaceToDepth) ---- */

template <typename U>
__global__ void gather_view_kernel(const U *__restrict__ X, U *__restrict__ Y, kiln_gpu_shape src, int64_t n)
{
    KILN_GRID_LOOP(i, n) Y[i] = X[kiln_strided_offset(src, i)];
}

extern "C" gpuError_t kiln_gpu_cnn_gather_view(size_t esize, const void *X, void *Y, kiln_gpu_shape src,
                                               int64_t n, gpuStream_t s)
{
    if (n <= 0) return gpuSuccess;
    unsigned blocks = kiln_gpu_blocks(n, CNN_BLOCK);
    switch (esize) {
    case 1: gather_view_kernel<uint8_t><<<blocks, CNN_BLOCK, 0, s>>>((const uint8_t *)X, (uint8_t *)Y, src, n); break;
    case 2: gather_view_kernel<uint16_t><<<blocks, CNN_BLOCK, 0, s>>>((const uint16_t *)X, (uint16_t *)Y, src, n); break;
    case 4: gather_view_kernel<uint32_t><<<blocks, CNN_BLOCK, 0, s>>>((const uint32_t *)X, (uint32_t *)Y, src, n); break;
    case 8: gather_view_kernel<uint64_t><<<blocks, CNN_BLOCK, 0, s>>>((const uint64_t *)X, (uint64_t *)Y, src, n); break;
    default: return gpuErrorInvalidValue;
    }
    return gpuGetLastError();
}
