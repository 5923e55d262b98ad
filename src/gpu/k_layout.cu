/* k_layout.cu - layout kernels: strided copies (Transpose, Slice, Expand), the tiled transpose,
 * row copies (Concat, Split), Tile, Pad, Gather/GatherElements/GatherND, ScatterND and
 * ScatterElements with reductions, Range, Trilu and OneHot. Element moves are templated on an
 * unsigned integer of the element's size, so one instance serves every dtype of that size. */
#include "gpu/kcommon.cuh"
#include "gpu/k_layout.h"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block);

#define BLOCK 256

/* The unsigned type of an element size. */
template <int N> struct bytes_t;
template <> struct bytes_t<1> { typedef uint8_t type; };
template <> struct bytes_t<2> { typedef uint16_t type; };
template <> struct bytes_t<4> { typedef uint32_t type; };
template <> struct bytes_t<8> { typedef unsigned long long type; };

/* Runs the statement(s) with T the unsigned type of esize bytes (variadic: launches hold commas). */
#define BY_SIZE(esize, ...)                                                                    \
    switch (esize) {                                                                           \
    case 1: { typedef uint8_t T; __VA_ARGS__; } break;                                         \
    case 2: { typedef uint16_t T; __VA_ARGS__; } break;                                        \
    case 4: { typedef uint32_t T; __VA_ARGS__; } break;                                        \
    case 8: { typedef unsigned long long T; __VA_ARGS__; } break;                              \
    default: return gpuErrorInvalidValue;                                                      \
    }

#if defined(KILN_HIP)
#define gpuErrorInvalidValue hipErrorInvalidValue
#else
#define gpuErrorInvalidValue cudaErrorInvalidValue
#endif

/* Index as a signed 64-bit value. */
template <typename I> __device__ __forceinline__ int64_t load_index(const void *ind, int64_t i)
{
    return (int64_t)((const I *)ind)[i];
}

__device__ __forceinline__ int64_t index_at(int idx64, const void *ind, int64_t i)
{
    return idx64 ? load_index<int64_t>(ind, i) : load_index<int32_t>(ind, i);
}

/* ---- strided copy: Transpose, Slice, Expand ---- */

/* Sixteen bytes moved as one element. */
struct alignas(16) bytes16 {
    uint32_t w[4];
};

/* The widest unit of 16, 8, 4, 2 or 1 bytes, at least `least`, whose multiples all the bits of
 * `all` (sizes and addresses OR-ed together) are. */
static int widest_unit(uint64_t all, int least)
{
    int unit = 16;
    while (unit > least && (all & (uint64_t)(unit - 1))) unit /= 2;
    return unit;
}

/* Runs the statement(s) with U the type moving `unit` bytes (widest_unit's). */
#define BY_UNIT(unit, ...)                                                                     \
    switch (unit) {                                                                            \
    case 16: { typedef bytes16 U; __VA_ARGS__; } break;                                        \
    case 8: { typedef unsigned long long U; __VA_ARGS__; } break;                              \
    case 4: { typedef uint32_t U; __VA_ARGS__; } break;                                        \
    case 2: { typedef uint16_t U; __VA_ARGS__; } break;                                        \
    default: { typedef uint8_t U; __VA_ARGS__; } break;                                        \
    }

/* y[i] = x[offset of i], the offset decomposed in I (32-bit while the counts fit: the copy was
 * bound by 64-bit divisions, not by memory). Strides may be negative (Slice's negative steps). */
template <typename T, typename I>
__global__ void strided_kernel(T *__restrict__ y, const T *__restrict__ x, kiln_gpu_shape s, int64_t n)
{
    KILN_GRID_LOOP(i, n) y[i] = x[kiln_strided_offset<I>(s, i)];
}

/* The copy in units of `unit` bytes (a multiple of esize): the innermost dim contiguous in x,
 * its length, every other stride, the offset and both pointers multiples of the unit. */
static bool widen(kiln_gpu_shape *s, int esize, int unit, const void *y, const void *x, int64_t *x_off)
{
    int f = unit / esize, r = s->rank;
    if (r < 1 || s->strides[r - 1] != 1 || s->dims[r - 1] % f || *x_off % f || (uintptr_t)y % unit ||
        (uintptr_t)x % unit)
        return false;
    for (int k = 0; k < r - 1; k++)
        if (s->strides[k] % f) return false;
    s->dims[r - 1] /= f;
    for (int k = 0; k < r - 1; k++) s->strides[k] /= f;
    *x_off /= f;
    return true;
}

/* The elements between x's first and last reads (the kernel's index type must hold it). */
static int64_t strided_span(const kiln_gpu_shape &s, int64_t x_off)
{
    int64_t span = x_off < 0 ? -x_off : x_off;
    for (int k = 0; k < s.rank; k++) span += (s.dims[k] - 1) * (s.strides[k] < 0 ? -s.strides[k] : s.strides[k]);
    return span;
}

template <typename T>
static void strided_launch(T *y, const T *x, const kiln_gpu_shape &s, int64_t n, int64_t span, gpuStream_t st)
{
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    if (n < INT32_MAX && span < INT32_MAX) strided_kernel<T, int32_t><<<nb, BLOCK, 0, st>>>(y, x, s, n);
    else strided_kernel<T, int64_t><<<nb, BLOCK, 0, st>>>(y, x, s, n);
}

extern "C" gpuError_t kiln_gpu_layout_strided(int esize, void *y, const void *x, int64_t x_off, kiln_gpu_shape s,
                                              gpuStream_t st)
{
    int64_t n = 1;
    for (int k = 0; k < s.rank; k++) n *= s.dims[k];
    if (n <= 0) return gpuSuccess;
    /* rows contiguous in x (a Transpose keeping the last axis, a Slice of outer axes, an Expand of
     * them) move 16, 8 or 4 bytes at a time (no 2-byte unit: 1-byte rows of an odd half stay bytes) */
    const char *xb = (const char *)x;
    for (int unit = 16; unit >= 4 && unit > esize; unit /= 2) {
        kiln_gpu_shape w = s;
        int64_t off = x_off;
        if (!widen(&w, esize, unit, y, xb + x_off * esize, &off)) continue;
        int64_t m = n / (unit / esize), span = strided_span(w, off);
        if (unit == 16) strided_launch((bytes16 *)y, (const bytes16 *)x + off, w, m, span, st);
        else if (unit == 8) strided_launch((unsigned long long *)y, (const unsigned long long *)x + off, w, m, span, st);
        else strided_launch((uint32_t *)y, (const uint32_t *)x + off, w, m, span, st);
        return gpuGetLastError();
    }
    int64_t span = strided_span(s, x_off);
    BY_SIZE(esize, strided_launch((T *)y, (const T *)x + x_off, s, n, span, st));
    return gpuGetLastError();
}

/* ---- tiled transpose: 32x32 tiles, 32x8 threads, reads and writes coalesced ---- */

#define TILE 32
#define TILE_ROWS 8

template <typename T>
__global__ void transpose_kernel(T *__restrict__ y, const T *__restrict__ x, int64_t P, int64_t Q,
                                 int64_t bstride, int64_t tp, int64_t tq, int64_t tiles)
{
    __shared__ T tile[TILE][TILE + 1];
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
        int64_t b = t / (tp * tq), r = t - b * tp * tq;
        int64_t q0 = (r / tp) * TILE, p0 = (r % tp) * TILE;
        const T *xb = x + b * bstride;
        T *yb = y + b * P * Q;
        /* read x[q][p] (p fastest) into tile[q - q0][p - p0] */
        for (int j = threadIdx.y; j < TILE; j += TILE_ROWS) {
            int64_t q = q0 + j, p = p0 + threadIdx.x;
            if (q < Q && p < P) tile[j][threadIdx.x] = xb[q * P + p];
        }
        __syncthreads();
        /* write y[p][q] (q fastest) */
        for (int j = threadIdx.y; j < TILE; j += TILE_ROWS) {
            int64_t p = p0 + j, q = q0 + threadIdx.x;
            if (p < P && q < Q) yb[p * Q + q] = tile[threadIdx.x][j];
        }
        __syncthreads();
    }
}

extern "C" gpuError_t kiln_gpu_layout_transpose(int esize, void *y, const void *x, int64_t B, int64_t P,
                                                int64_t Q, int64_t bstride, gpuStream_t st)
{
    if (B <= 0 || P <= 0 || Q <= 0) return gpuSuccess;
    int64_t tp = (P + TILE - 1) / TILE, tq = (Q + TILE - 1) / TILE, tiles = B * tp * tq;
    unsigned nb = kiln_gpu_blocks(tiles, 1);
    if (nb > 65535u * 16u) nb = 65535u * 16u; /* the loop covers the rest */
    dim3 block(TILE, TILE_ROWS);
    BY_SIZE(esize, transpose_kernel<T><<<nb, block, 0, st>>>((T *)y, (const T *)x, P, Q, bstride, tp, tq, tiles));
    return gpuGetLastError();
}

/* ---- row copies: Concat, Split. Moves the widest unit that divides every size and address. ---- */

template <typename U>
__global__ void copy2d_kernel(char *__restrict__ y, int64_t y_ld, const char *__restrict__ x, int64_t x_ld,
                              int64_t row_units, int64_t n)
{
    KILN_GRID_LOOP(i, n) {
        int64_t r = i / row_units, c = i - r * row_units;
        ((U *)(y + r * y_ld))[c] = ((const U *)(x + r * x_ld))[c];
    }
}

extern "C" gpuError_t kiln_gpu_layout_copy2d(void *y, int64_t y_ld, const void *x, int64_t x_ld, int64_t rows,
                                             int64_t row_bytes, gpuStream_t st)
{
    if (rows <= 0 || row_bytes <= 0) return gpuSuccess;
    int unit = widest_unit((uint64_t)(uintptr_t)y | (uint64_t)(uintptr_t)x | (uint64_t)y_ld | (uint64_t)x_ld |
                               (uint64_t)row_bytes,
                           1);
    int64_t row_units = row_bytes / unit, n = rows * row_units;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_UNIT(unit, copy2d_kernel<U><<<nb, BLOCK, 0, st>>>((char *)y, y_ld, (const char *)x, x_ld, row_units, n));
    return gpuGetLastError();
}

/* ---- Tile ---- */

template <typename T>
__global__ void tile_kernel(T *__restrict__ y, const T *__restrict__ x, kiln_gpu_shape ys, kiln_gpu_shape xd,
                            int64_t n)
{
    KILN_GRID_LOOP(i, n) {
        int64_t j = i, off = 0;
        for (int k = ys.rank - 1; k >= 0; k--) {
            int64_t d = ys.dims[k], q = j / d;
            off += ((j - q * d) % xd.dims[k]) * ys.strides[k];
            j = q;
        }
        y[i] = x[off];
    }
}

extern "C" gpuError_t kiln_gpu_layout_tile(int esize, void *y, const void *x, kiln_gpu_shape ys,
                                           kiln_gpu_shape xdims, gpuStream_t st)
{
    int64_t n = 1;
    for (int k = 0; k < ys.rank; k++) n *= ys.dims[k];
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_SIZE(esize, tile_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, (const T *)x, ys, xdims, n));
    return gpuGetLastError();
}

/* ---- Pad ---- */

/* Source position in [0, n) for a padded position i outside it (n > 0). */
__device__ __forceinline__ int64_t pad_source(int mode, int64_t i, int64_t n)
{
    if (mode == KILN_GPU_PAD_EDGE) return i < 0 ? 0 : n - 1;
    if (mode == KILN_GPU_PAD_WRAP) return ((i % n) + n) % n;
    if (n == 1) return 0;
    int64_t p = 2 * (n - 1);
    i = ((i % p) + p) % p;
    return i < n ? i : p - i;
}

template <typename T>
__global__ void pad_kernel(T *__restrict__ y, const T *__restrict__ x, int64_t n, kiln_gpu_pad_args a)
{
    T value = (T)a.value;
    KILN_GRID_LOOP(i, n) {
        int64_t j = i, src = 0;
        bool inside = true;
        for (int k = a.rank - 1; k >= 0; k--) {
            int64_t d = a.ydims[k], q = j / d, p = j - q * d - a.pb[k];
            j = q;
            if (p < 0 || p >= a.len[k]) {
                if (a.mode == KILN_GPU_PAD_CONSTANT) {
                    inside = false;
                    break;
                }
                p = pad_source(a.mode, p, a.len[k]);
            }
            src += (a.lo[k] + p) * a.xs[k];
        }
        y[i] = inside ? x[src] : value;
    }
}

extern "C" gpuError_t kiln_gpu_layout_pad(int esize, void *y, const void *x, int64_t n, kiln_gpu_pad_args a,
                                          gpuStream_t st)
{
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_SIZE(esize, pad_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, (const T *)x, n, a));
    return gpuGetLastError();
}

/* ---- Gather, GatherElements, GatherND ---- */

/* y[o, j, e] = x[o, ind[j], e] (0 for an index out of range), e over `inner` units of U: the
 * widest unit dividing a row of elements and both addresses; I the index arithmetic's type. */
template <typename U, typename I>
__global__ void gather_kernel(U *__restrict__ y, const U *__restrict__ x, const void *__restrict__ ind, int idx64, I n,
                              I m, I inner, I total)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (I)gridDim.x * blockDim.x) {
        I r = i / inner, e = i - r * inner, o = r / m, j = r - o * m;
        int64_t p = index_at(idx64, ind, j);
        if (p < 0) p += n;
        y[i] = p >= 0 && p < n ? x[(o * n + (I)p) * inner + e] : U();
    }
}

template <typename U>
static void gather_launch(void *y, const void *x, const void *ind, int idx64, int64_t n, int64_t m, int64_t inner,
                          int64_t total, gpuStream_t st)
{
    unsigned nb = kiln_gpu_blocks(total, BLOCK);
    if (n * inner < INT32_MAX && total < INT32_MAX - (int64_t)nb * BLOCK)
        gather_kernel<U, int><<<nb, BLOCK, 0, st>>>((U *)y, (const U *)x, ind, idx64, (int)n, (int)m, (int)inner, (int)total);
    else
        gather_kernel<U, int64_t><<<nb, BLOCK, 0, st>>>((U *)y, (const U *)x, ind, idx64, n, m, inner, total);
}

extern "C" gpuError_t kiln_gpu_layout_gather(int esize, int idx64, void *y, const void *x, const void *ind,
                                             int64_t outer, int64_t n, int64_t m, int64_t inner, gpuStream_t st)
{
    if (outer * m * inner <= 0) return gpuSuccess;
    if (esize != 1 && esize != 2 && esize != 4 && esize != 8) return gpuErrorInvalidValue;
    int64_t row = inner * esize;
    int unit = widest_unit((uint64_t)(uintptr_t)y | (uint64_t)(uintptr_t)x | (uint64_t)row, esize);
    int64_t units = row / unit;
    BY_UNIT(unit, gather_launch<U>(y, x, ind, idx64, n, m, units, outer * m * units, st));
    return gpuGetLastError();
}

template <typename T>
__global__ void gather_elements_kernel(T *__restrict__ y, const T *__restrict__ x, const void *__restrict__ ind,
                                       int idx64, kiln_gpu_shape s, int64_t ad, int64_t as, int64_t n)
{
    KILN_GRID_LOOP(j, n) {
        int64_t p = index_at(idx64, ind, j);
        if (p < 0) p += ad;
        y[j] = p >= 0 && p < ad ? x[kiln_strided_offset(s, j) + p * as] : (T)0;
    }
}

extern "C" gpuError_t kiln_gpu_layout_gather_elements(int esize, int idx64, void *y, const void *x,
                                                      const void *ind, kiln_gpu_shape s, int64_t ad, int64_t as,
                                                      int64_t n, gpuStream_t st)
{
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_SIZE(esize,
            gather_elements_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, (const T *)x, ind, idx64, s, ad, as, n));
    return gpuGetLastError();
}

/* Offset in x (dims/strides xs) of index tuple `row` (entries ind[row * last ...]) from axis
 * `from` on; -1 when an entry is out of range. */
__device__ __forceinline__ int64_t tuple_offset(const kiln_gpu_shape &xs, const void *ind, int idx64, int64_t row,
                                                int from, int last)
{
    int64_t off = 0;
    for (int k = 0; k < last; k++) {
        int64_t d = xs.dims[from + k], p = index_at(idx64, ind, row * last + k);
        if (p < 0) p += d;
        if (p < 0 || p >= d) return -1;
        off += p * xs.strides[from + k];
    }
    return off;
}

template <typename T>
__global__ void gather_nd_kernel(T *__restrict__ y, const T *__restrict__ x, const void *__restrict__ ind,
                                 int idx64, kiln_gpu_shape xs, int b, int last, int64_t tuples, int64_t slice,
                                 int64_t n)
{
    /* batch bi starts at bi * strides[b - 1] (contiguous x) */
    int64_t batch_size = b > 0 ? xs.strides[b - 1] : 0;
    KILN_GRID_LOOP(i, n) {
        int64_t row = i / slice, e = i - row * slice, bi = row / tuples;
        int64_t off = tuple_offset(xs, ind, idx64, row, b, last);
        y[i] = off >= 0 ? x[bi * batch_size + off + e] : (T)0;
    }
}

extern "C" gpuError_t kiln_gpu_layout_gather_nd(int esize, int idx64, void *y, const void *x, const void *ind,
                                                kiln_gpu_shape xs, int b, int last, int64_t tuples,
                                                int64_t slice, int64_t n, gpuStream_t st)
{
    if (n <= 0 || slice <= 0 || tuples <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_SIZE(esize, gather_nd_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, (const T *)x, ind, idx64, xs, b, last,
                                                            tuples, slice, n));
    return gpuGetLastError();
}

/* ---- ScatterND, ScatterElements: reductions through compare-and-swap ---- */

template <typename T> __device__ __forceinline__ T reduce_op(int red, T a, T b)
{
    /* integers: add and mul wrap (unsigned arithmetic), max and min compare signed */
    typedef typename bytes_t<sizeof(T)>::type U;
    switch (red) {
    case KILN_GPU_RED_ADD: return (T)((U)a + (U)b);
    case KILN_GPU_RED_MUL: return (T)((U)a * (U)b);
    case KILN_GPU_RED_MAX: return a > b ? a : b;
    case KILN_GPU_RED_MIN: return a < b ? a : b;
    default: return b;
    }
}

template <typename F> __device__ __forceinline__ F reduce_real(int red, F a, F b)
{
    switch (red) {
    case KILN_GPU_RED_ADD: return a + b;
    case KILN_GPU_RED_MUL: return a * b;
    case KILN_GPU_RED_MAX: return a != a || b != b ? a + b : a > b ? a : b;
    case KILN_GPU_RED_MIN: return a != a || b != b ? a + b : a < b ? a : b;
    default: return b;
    }
}

template <> __device__ __forceinline__ float reduce_op<float>(int red, float a, float b) { return reduce_real(red, a, b); }
template <> __device__ __forceinline__ double reduce_op<double>(int red, double a, double b) { return reduce_real(red, a, b); }
template <> __device__ __forceinline__ kiln_gpu_half reduce_op<kiln_gpu_half>(int red, kiln_gpu_half a, kiln_gpu_half b)
{
    return kiln_from_f<kiln_gpu_half>(reduce_real(red, kiln_to_f(a), kiln_to_f(b)));
}
template <> __device__ __forceinline__ kiln_gpu_bf16 reduce_op<kiln_gpu_bf16>(int red, kiln_gpu_bf16 a, kiln_gpu_bf16 b)
{
    return kiln_from_f<kiln_gpu_bf16>(reduce_real(red, kiln_to_f(a), kiln_to_f(b)));
}

template <typename T> __device__ __forceinline__ T from_bits(uint64_t v)
{
    T r;
    memcpy(&r, &v, sizeof r); /* little endian: the low bytes */
    return r;
}
template <typename T> __device__ __forceinline__ uint64_t to_bits(T v)
{
    uint64_t r = 0;
    memcpy(&r, &v, sizeof v);
    return r;
}

/* *p = red(*p, v) atomically: a CAS loop on the element's 4- or 8-byte word. */
template <typename T> __device__ void atomic_reduce(T *p, T v, int red)
{
    if (sizeof(T) == 8) {
        unsigned long long *w = (unsigned long long *)p, old = *w, seen;
        do {
            seen = old;
            T r = reduce_op<T>(red, from_bits<T>(seen), v);
            old = atomicCAS(w, seen, (unsigned long long)to_bits(r));
        } while (old != seen);
    } else {
        /* the aligned 32-bit word holding the element; shift: its bit position there */
        uintptr_t a = (uintptr_t)p;
        unsigned int *w = (unsigned int *)(a & ~(uintptr_t)3);
        unsigned shift = (unsigned)(a & 3) * 8;
        unsigned mask = (sizeof(T) == 1 ? 0xffu : sizeof(T) == 2 ? 0xffffu : 0xffffffffu) << shift;
        unsigned int old = *w, seen;
        do {
            seen = old;
            T cur = from_bits<T>((seen & mask) >> shift);
            unsigned int nv = ((unsigned int)to_bits(reduce_op<T>(red, cur, v)) << shift) & mask;
            old = atomicCAS(w, seen, (seen & ~mask) | nv);
        } while (old != seen);
    }
}

template <typename T>
__global__ void scatter_nd_kernel(T *__restrict__ y, const void *__restrict__ ind, const T *__restrict__ u,
                                  int idx64, kiln_gpu_shape xs, int last, int64_t slice, int64_t n, int red)
{
    KILN_GRID_LOOP(i, n) {
        int64_t t = i / slice, e = i - t * slice;
        int64_t off = tuple_offset(xs, ind, idx64, t, 0, last);
        if (off < 0) continue;
        if (red == KILN_GPU_RED_NONE)
            y[off + e] = u[i];
        else
            atomic_reduce(&y[off + e], u[i], red);
    }
}

template <typename T>
__global__ void scatter_elements_kernel(T *__restrict__ y, const void *__restrict__ ind, const T *__restrict__ u,
                                        int idx64, kiln_gpu_shape s, int64_t ad, int64_t as, int64_t n, int red)
{
    KILN_GRID_LOOP(j, n) {
        int64_t p = index_at(idx64, ind, j);
        if (p < 0) p += ad;
        if (p < 0 || p >= ad) continue;
        T *at = &y[kiln_strided_offset(s, j) + p * as];
        if (red == KILN_GPU_RED_NONE)
            *at = u[j];
        else
            atomic_reduce(at, u[j], red);
    }
}

/* Runs the launch with T the element type of dtype for reductions, or the unsigned type of its
 * size for plain stores. */
#define BY_REDUCE_TYPE(dtype, red, ...)                                                        \
    if ((red) == KILN_GPU_RED_NONE) {                                                          \
        size_t es = kiln_dtype_size((kiln_dtype)(dtype));                                      \
        BY_SIZE((int)es, __VA_ARGS__);                                                                \
    } else {                                                                                   \
        switch (dtype) {                                                                       \
        case KILN_DTYPE_FLOAT32: { typedef float T; __VA_ARGS__; } break;                             \
        case KILN_DTYPE_FLOAT64: { typedef double T; __VA_ARGS__; } break;                            \
        case KILN_DTYPE_FLOAT16: { typedef kiln_gpu_half T; __VA_ARGS__; } break;                     \
        case KILN_DTYPE_BFLOAT16: { typedef kiln_gpu_bf16 T; __VA_ARGS__; } break;                    \
        case KILN_DTYPE_INT32: { typedef int32_t T; __VA_ARGS__; } break;                             \
        case KILN_DTYPE_INT64: { typedef long long T; __VA_ARGS__; } break;                           \
        default: return gpuErrorInvalidValue;                                                  \
        }                                                                                      \
    }

extern "C" gpuError_t kiln_gpu_layout_scatter_nd(int dtype, int red, int idx64, void *y, const void *ind,
                                                 const void *u, kiln_gpu_shape xs, int last, int64_t tuples,
                                                 int64_t slice, gpuStream_t st)
{
    int64_t n = tuples * slice;
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_REDUCE_TYPE(dtype, red, scatter_nd_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, ind, (const T *)u, idx64, xs,
                                                                         last, slice, n, red));
    return gpuGetLastError();
}

extern "C" gpuError_t kiln_gpu_layout_scatter_elements(int dtype, int red, int idx64, void *y, const void *ind,
                                                       const void *u, kiln_gpu_shape s, int64_t ad, int64_t as,
                                                       int64_t n, gpuStream_t st)
{
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_REDUCE_TYPE(dtype, red, scatter_elements_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, ind, (const T *)u, idx64,
                                                                               s, ad, as, n, red));
    return gpuGetLastError();
}

/* ---- Range ---- */

template <typename T> __global__ void range_int_kernel(T *__restrict__ y, int64_t n, uint64_t start, uint64_t step)
{
    KILN_GRID_LOOP(i, n) y[i] = (T)(start + (uint64_t)i * step); /* wraps like the reference */
}

template <typename T> __global__ void range_real_kernel(T *__restrict__ y, int64_t n, double start, double step)
{
    KILN_GRID_LOOP(i, n) y[i] = kiln_from_f<T>((float)(start + (double)i * step));
}

template <> __global__ void range_real_kernel<double>(double *__restrict__ y, int64_t n, double start, double step)
{
    KILN_GRID_LOOP(i, n) y[i] = start + (double)i * step;
}

extern "C" gpuError_t kiln_gpu_layout_range(int dtype, void *y, int64_t n, int64_t start, int64_t step,
                                            double fstart, double fstep, gpuStream_t st)
{
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    uint64_t s = (uint64_t)start, d = (uint64_t)step;
    switch (dtype) {
    case KILN_DTYPE_FLOAT32: range_real_kernel<float><<<nb, BLOCK, 0, st>>>((float *)y, n, fstart, fstep); break;
    case KILN_DTYPE_FLOAT64: range_real_kernel<double><<<nb, BLOCK, 0, st>>>((double *)y, n, fstart, fstep); break;
    case KILN_DTYPE_FLOAT16:
        range_real_kernel<kiln_gpu_half><<<nb, BLOCK, 0, st>>>((kiln_gpu_half *)y, n, fstart, fstep);
        break;
    case KILN_DTYPE_BFLOAT16:
        range_real_kernel<kiln_gpu_bf16><<<nb, BLOCK, 0, st>>>((kiln_gpu_bf16 *)y, n, fstart, fstep);
        break;
    case KILN_DTYPE_INT8:
    case KILN_DTYPE_UINT8: range_int_kernel<uint8_t><<<nb, BLOCK, 0, st>>>((uint8_t *)y, n, s, d); break;
    case KILN_DTYPE_INT16:
    case KILN_DTYPE_UINT16: range_int_kernel<uint16_t><<<nb, BLOCK, 0, st>>>((uint16_t *)y, n, s, d); break;
    case KILN_DTYPE_INT32:
    case KILN_DTYPE_UINT32: range_int_kernel<uint32_t><<<nb, BLOCK, 0, st>>>((uint32_t *)y, n, s, d); break;
    case KILN_DTYPE_INT64:
    case KILN_DTYPE_UINT64:
        range_int_kernel<unsigned long long><<<nb, BLOCK, 0, st>>>((unsigned long long *)y, n, s, d);
        break;
    default: return gpuErrorInvalidValue;
    }
    return gpuGetLastError();
}

/* ---- Trilu ---- */

template <typename T>
__global__ void trilu_kernel(T *__restrict__ y, const T *__restrict__ x, int64_t rows, int64_t cols, int64_t k,
                             int upper, int64_t n)
{
    KILN_GRID_LOOP(i, n) {
        int64_t j = i % cols, r = (i / cols) % rows;
        bool keep = upper ? j - r >= k : j - r <= k;
        y[i] = keep ? x[i] : (T)0;
    }
}

extern "C" gpuError_t kiln_gpu_layout_trilu(int esize, void *y, const void *x, int64_t mats, int64_t rows,
                                            int64_t cols, int64_t k, int upper, gpuStream_t st)
{
    int64_t n = mats * rows * cols;
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    BY_SIZE(esize, trilu_kernel<T><<<nb, BLOCK, 0, st>>>((T *)y, (const T *)x, rows, cols, k, upper, n));
    return gpuGetLastError();
}

/* ---- OneHot ---- */

template <typename T, typename I>
__global__ void onehot_kernel(T *__restrict__ y, const I *__restrict__ ind, int64_t d, int64_t inner, T off, T on,
                              int64_t n)
{
    KILN_GRID_LOOP(i, n) {
        int64_t e = i % inner, r = i / inner, k = r % d, o = r / d;
        int64_t hot = (int64_t)ind[o * inner + e];
        if (hot < 0) hot += d;
        y[i] = k == hot ? on : off;
    }
}

extern "C" gpuError_t kiln_gpu_layout_onehot(int esize, int ind_dtype, void *y, const void *ind, int64_t outer,
                                             int64_t d, int64_t inner, uint64_t off, uint64_t on, gpuStream_t st)
{
    int64_t n = outer * d * inner;
    if (n <= 0) return gpuSuccess;
    unsigned nb = kiln_gpu_blocks(n, BLOCK);
    switch (ind_dtype) {
    case KILN_DTYPE_INT32:
        BY_SIZE(esize, onehot_kernel<T, int32_t><<<nb, BLOCK, 0, st>>>((T *)y, (const int32_t *)ind, d, inner,
                                                                      (T)off, (T)on, n));
        break;
    case KILN_DTYPE_INT64:
        BY_SIZE(esize, onehot_kernel<T, long long><<<nb, BLOCK, 0, st>>>((T *)y, (const long long *)ind, d, inner,
                                                                        (T)off, (T)on, n));
        break;
    case KILN_DTYPE_FLOAT32:
        BY_SIZE(esize, onehot_kernel<T, float><<<nb, BLOCK, 0, st>>>((T *)y, (const float *)ind, d, inner, (T)off,
                                                                    (T)on, n));
        break;
    default: return gpuErrorInvalidValue;
    }
    return gpuGetLastError();
}
