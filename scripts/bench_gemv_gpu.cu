/* bench_gemv_gpu.cu - the int4 MatMulNBits GEMV (kiln_gpu_nbits_gemv, src/gpu/k_llm.cu) alone on
 * the GPU: per shape, microseconds a call and the bandwidth its bytes (packed weights, scales, zero
 * points) reach, next to the device-to-device copy bandwidth measured in the same run; then the
 * GEMVs of a whole decode step of an 8B-shaped model (32 layers of qkv, o, gate, up, down, then
 * lm_head) with distinct weights, as one CUDA graph. Every shape's result is checked against a
 * plain kernel (double sums from the packed weights) first. A diagnostic for the GPU machine, not a test.
 *
 * build and run (on the device): bash scripts/bench_gemv_gpu.sh [--step-only | --once]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "gpu/k_llm.h"

extern "C" unsigned kiln_gpu_blocks(int64_t n, unsigned block)
{
    int64_t b = (n + block - 1) / block;
    return (unsigned)(b < 1 ? 1 : b);
}

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

__device__ uint32_t hash32(uint64_t i, uint32_t seed)
{
    uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
    return (uint32_t)(x >> 16);
}

__global__ void fill_bytes(uint8_t *p, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)hash32(i, seed);
}

/* uniform in [lo, hi) */
__global__ void fill_half(__half *p, int64_t n, uint32_t seed, float lo, float hi)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = __float2half(lo + (hi - lo) * (float)(hash32(i, seed) & 0xFFFF) / 65536.0f);
}

/* y[n] = sum_k A[k] (q[n, k] - z[n, k / 128]) s[n, k / 128], in double from the packed weights */
__global__ void ref_dot(const uint8_t *B, const __half *S, const uint8_t *Z, const __half *A, int64_t N, int64_t K,
                        int64_t nb, double *y)
{
    int64_t n = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (n >= N) return;
    double s = 0;
    for (int64_t k = 0; k < K; k++) {
        int64_t b = k / 128;
        int q = (B[n * nb * 64 + k / 2] >> (4 * (k & 1))) & 15, z = (Z[n * ((nb + 1) / 2) + b / 2] >> (4 * (b & 1))) & 15;
        s += (double)(q - z) * (double)__half2float(S[n * nb + b]) * (double)__half2float(A[k]);
    }
    y[n] = s;
}

/* reads n bytes (16 at a time, 4 loads in flight a thread): the read roofline of a call */
__global__ void read_kernel(const uint4 *p, int64_t n16, unsigned *out)
{
    unsigned x = 0;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += 4 * step) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = i + u * step < n16 ? p[i + u * step] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (x == 0x12345678u) *out = x; /* keeps the loads */
}

struct weights {
    uint8_t *B, *zp;
    __half *S;
    int64_t N, K, nb, bytes;
};

static weights make(int64_t N, int64_t K, uint32_t seed)
{
    weights w;
    w.N = N, w.K = K, w.nb = (K + 127) / 128;
    int64_t bb = N * w.nb * 64, zb = N * ((w.nb + 1) / 2);
    CK(cudaMalloc(&w.B, bb));
    CK(cudaMalloc(&w.zp, zb));
    CK(cudaMalloc(&w.S, N * w.nb * sizeof(__half)));
    fill_bytes<<<1024, 256>>>(w.B, bb, seed);
    fill_bytes<<<1024, 256>>>(w.zp, zb, seed + 1);
    fill_half<<<1024, 256>>>(w.S, N * w.nb, seed + 2, 0.004f, 0.02f);
    w.bytes = bb + zb + N * w.nb * (int64_t)sizeof(__half);
    CK(cudaDeviceSynchronize()); /* the fills ran on the legacy stream, the GEMVs on another */
    return w;
}

static kiln_gpu_nbits call(const weights &w, const __half *A, __half *Y, int sms)
{
    kiln_gpu_nbits a;
    memset(&a, 0, sizeof a);
    a.dtype = KILN_DTYPE_FLOAT16, a.s_dtype = KILN_DTYPE_FLOAT16, a.zp_mode = KILN_GPU_ZP_PACKED;
    a.A = A, a.B = w.B, a.scales = w.S, a.zp = w.zp, a.Y = Y;
    a.M = 1, a.N = w.N, a.K = w.K, a.bits = 4, a.block_size = 128, a.n_blocks = w.nb, a.blob = 64;
    a.sm_count = sms;
    a.const_weights = true; /* as a model's: the weights load before the kernel ahead ends */
    return a;
}

static float *g_part;

static void launch(cudaStream_t s, const kiln_gpu_nbits *a)
{
    int splits = kiln_gpu_nbits_splits(a);
    CK(kiln_gpu_nbits_gemv(s, a, splits, g_part));
}

/* median of 5 replays of graph g holding `calls` calls: us a call */
static double time_graph(cudaStream_t s, cudaGraphExec_t g, int calls)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[5];
    CK(cudaGraphLaunch(g, s)); /* warm */
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(g, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (t[j] < t[i]) {
                float x = t[i];
                t[i] = t[j], t[j] = x;
            }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return t[2] * 1000.0 / calls;
}

int main(int argc, char **argv)
{
    /* --step-only: the step alone; --once: one checked call a shape and nothing timed (for ncu) */
    bool step_only = argc > 1 && !strcmp(argv[1], "--step-only"), once = argc > 1 && !strcmp(argv[1], "--once");
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMalloc(&g_part, 64 << 20));
    __half *A, *Y;
    CK(cudaMalloc(&A, 32768 * sizeof(__half)));
    CK(cudaMalloc(&Y, 262144 * sizeof(__half)));
    fill_half<<<64, 256>>>(A, 32768, 7, -1.0f, 1.0f);
    CK(cudaDeviceSynchronize());

    /* copy bandwidth: 1 GiB device to device */
    {
        void *x, *y;
        size_t n = (size_t)1 << 30;
        CK(cudaMalloc(&x, n));
        CK(cudaMalloc(&y, n));
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 4; i++) CK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice, s));
        CK(cudaStreamEndCapture(s, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        double us = time_graph(s, ge, 4);
        printf("copy: %.2f TB/s (read + write of 1 GiB in %.1f us)\n", 2.0 * n / us / 1e6, us);
        cudaFree(x);
        cudaFree(y);
    }

    /* reads alone, the GEMVs' byte counts, distinct buffers (the L2 cold) */
    {
        const double mbs[] = {8.72, 13.07, 30.51, 272.93};
        unsigned *o;
        CK(cudaMalloc(&o, 4));
        for (int i = 0; i < 4; i++) {
            int64_t n = (int64_t)(mbs[i] * 1e6) / 16 * 16;
            int copies = (int)((512ll << 20) / n) + 1;
            uint8_t *buf;
            CK(cudaMalloc(&buf, n * copies));
            fill_bytes<<<1024, 256>>>(buf, n * copies, 5);
            CK(cudaDeviceSynchronize());
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int c = 0; c < copies; c++)
                read_kernel<<<(unsigned)(sms * 8), 256, 0, s>>>((const uint4 *)(buf + (int64_t)c * n), n / 16, o);
            CK(cudaStreamEndCapture(s, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            double us = time_graph(s, ge, copies);
            printf("read %7.2f MB: %8.2f us (%.2f TB/s)\n", n / 1e6, us, n / us / 1e6);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(gr);
            cudaFree(buf);
        }
    }

    const int64_t shapes[][2] = {{6144, 4096}, {4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
    const char *names[] = {"qkv", "o", "gate/up", "down", "lm_head"};
    if (!step_only) {
        printf("%-8s %7s %6s %9s %8s %7s %s\n", "shape", "N", "K", "MB", "us", "TB/s", "max err / max |y|");
        for (int si = 0; si < 5; si++) {
            int64_t N = shapes[si][0], K = shapes[si][1];
            weights w0 = make(N, K, 100 + si);
            /* check */
            kiln_gpu_nbits a = call(w0, A, Y, sms);
            double *yr;
            CK(cudaMalloc(&yr, N * sizeof(double)));
            ref_dot<<<(unsigned)((N + 127) / 128), 128, 0, s>>>(w0.B, w0.S, w0.zp, A, N, K, w0.nb, yr);
            launch(s, &a);
            CK(cudaStreamSynchronize(s));
            double *hr = (double *)malloc(N * sizeof(double));
            __half *hy = (__half *)malloc(N * sizeof(__half));
            CK(cudaMemcpy(hr, yr, N * sizeof(double), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hy, Y, N * sizeof(__half), cudaMemcpyDeviceToHost));
            double err = 0, mag = 0;
            for (int64_t n = 0; n < N; n++) {
                double d = fabs((double)__half2float(hy[n]) - hr[n]);
                if (d > err || d != d) err = d;
                if (fabs(hr[n]) > mag) mag = fabs(hr[n]);
            }
            free(hr);
            free(hy);
            cudaFree(yr);
            if (once) {
                printf("%-8s %7lld %6lld %9.2f max err / max |y| %.2e\n", names[si], (long long)N, (long long)K,
                       w0.bytes / 1e6, mag > 0 ? err / mag : err);
                cudaFree(w0.B), cudaFree(w0.S), cudaFree(w0.zp);
                continue;
            }
            /* copies enough to leave the L2 cold: at least 512 MB a round */
            int copies = (int)((512ll << 20) / w0.bytes) + 1;
            if (copies < 2) copies = 2;
            weights *ws = (weights *)malloc(copies * sizeof(weights));
            ws[0] = w0;
            for (int c = 1; c < copies; c++) ws[c] = make(N, K, 200 + 10 * si + c);
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int c = 0; c < copies; c++) {
                kiln_gpu_nbits ac = call(ws[c], A, Y, sms);
                launch(s, &ac);
            }
            CK(cudaStreamEndCapture(s, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            double us = time_graph(s, ge, copies);
            printf("%-8s %7lld %6lld %9.2f %8.2f %7.2f %.2e\n", names[si], (long long)N, (long long)K, w0.bytes / 1e6, us,
                   w0.bytes / us / 1e6, mag > 0 ? err / mag : err);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(gr);
            for (int c = 0; c < copies; c++) cudaFree(ws[c].B), cudaFree(ws[c].S), cudaFree(ws[c].zp);
            free(ws);
        }
    }

    /* a decode step's GEMVs: 32 x (qkv, o, gate, up, down) + lm_head, distinct weights */
    if (!once) {
        const int order[] = {0, 1, 2, 2, 3};
        weights *ws = (weights *)malloc(161 * sizeof(weights));
        int64_t total = 0;
        for (int l = 0; l < 32; l++)
            for (int j = 0; j < 5; j++) {
                int si = order[j];
                ws[5 * l + j] = make(shapes[si][0], shapes[si][1], 1000 + 5 * l + j);
                total += ws[5 * l + j].bytes;
            }
        ws[160] = make(shapes[4][0], shapes[4][1], 999);
        total += ws[160].bytes;
        cudaGraph_t gr;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 161; i++) {
            kiln_gpu_nbits ac = call(ws[i], A, Y, sms);
            launch(s, &ac);
        }
        CK(cudaStreamEndCapture(s, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        double us = time_graph(s, ge, 1);
        printf("step: 161 GEMVs, %.2f GB, %.1f us (%.2f TB/s)\n", total / 1e9, us, total / us / 1e6);
        /* the same bytes read by 161 plain read kernels: the floor of a step of separate kernels */
        unsigned *o;
        CK(cudaMalloc(&o, 4));
        cudaGraph_t gr2;
        cudaGraphExec_t ge2;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < 161; i++)
            read_kernel<<<(unsigned)(sms * 8), 256, 0, s>>>((const uint4 *)ws[i].B, ws[i].N * ws[i].nb * 64 / 16, o);
        CK(cudaStreamEndCapture(s, &gr2));
        CK(cudaGraphInstantiate(&ge2, gr2, 0));
        us = time_graph(s, ge2, 1);
        printf("step floor: 161 plain reads of the packed weights, %.1f us (%.2f TB/s)\n", us, total / us / 1e6);
    }
    return 0;
}
