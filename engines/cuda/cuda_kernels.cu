/*
 * cuda_kernels.cu - the CUDA engine's kernels and their host-side launchers
 * (declared in cuda_internal.h).
 *
 * Every reduction has a fixed shape (per-thread strided partial sums, then a
 * warp butterfly, then one warp over the per-warp results), so results do not
 * depend on scheduling: no atomics anywhere. Launchers never synchronise; they
 * return cudaGetLastError() of the launch.
 *
 * Index arithmetic uses size_t/uint64_t wherever a product of two model sizes
 * can appear.
 */
#include "engines/cuda/cuda_internal.h"

#include <math.h>

/* Kernel launches and dynamic shared memory go through two macros so the
 * same source also builds against the CPU emulator of tests/cuda_emu (which
 * runs the engine's logic without a GPU in `make test`). */
#ifndef KLAUNCH
#define KLAUNCH(kernel, grid, block, smem, stream, ...) \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif
#ifndef CU_DYN_SHARED
#define CU_DYN_SHARED(type, name) extern __shared__ type name[]
#endif

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */

#define FULL_MASK      0xffffffffu
#define EW_THREADS     256 /* element-wise kernels */
#define ROW_THREADS    256 /* warp-per-row kernels: 8 rows per block */
#define ROWS_PER_BLOCK (ROW_THREADS / 32)

static unsigned int ew_blocks(uint64_t n) {
    uint64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    if (b < 1) b = 1;
    if (b > (1u << 20)) b = 1u << 20; /* grid-stride beyond this */
    return (unsigned int)b;
}

static unsigned int row_blocks(uint64_t rows) {
    uint64_t b = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    if (b < 1) b = 1;
    return (unsigned int)b; /* callers keep rows < 2^34 */
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

/* Block-wide reductions; blockDim.x must be a multiple of 32 (<= 1024).
 * `sh` is shared scratch of 32 elements. Every thread gets the result. */
__device__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous reduction */
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    return sh[0];
}
__device__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? sh[lane] : -INFINITY;
        t = warp_max(t);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    return sh[0];
}
__device__ double block_sum_d(double v, double *sh) {
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        double t = lane < nw ? sh[lane] : 0.0;
        t = warp_sum_d(t);
        if (lane == 0) sh[0] = t;
    }
    __syncthreads();
    return sh[0];
}

/* ------------------------------------------------------------------------- */
/* Initialisation                                                             */
/* ------------------------------------------------------------------------- */

/* Box-Muller pairs: elements 2q and 2q+1 from outputs base+2q and base+2q+1
 * of the splitmix64 stream of seed (engines/common, the CPU engine's stream,
 * so a seed gives the same weights on both engines): cos and sin of the same
 * angle. */
__global__ void init_normal_kernel(float *out, uint64_t n, uint64_t seed, uint64_t base,
                                   double std) {
    uint64_t pairs = (n + 1) / 2;
    for (uint64_t q = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; q < pairs;
         q += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t k = base + 2 * q;
        double r = sqrt(-2.0 * log(engine_unit(engine_splitmix64_at(seed, k))));
        double th =
            2.0 * 3.14159265358979323846 * engine_unit(engine_splitmix64_at(seed, k + 1));
        out[2 * q] = (float)(std * r * cos(th));
        if (2 * q + 1 < n) out[2 * q + 1] = (float)(std * r * sin(th));
    }
}

cudaError_t k_init_normal(cudaStream_t s, float *out, uint64_t n, uint64_t seed,
                          uint64_t base, double std) {
    KLAUNCH(init_normal_kernel, ew_blocks((n + 1) / 2), EW_THREADS, 0, s, out, n, seed,
            base, std);
    return cudaGetLastError();
}

__global__ void fill_kernel(float *out, uint64_t n, float value) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        out[i] = value;
}

cudaError_t k_fill(cudaStream_t s, float *out, uint64_t n, float value) {
    KLAUNCH(fill_kernel, ew_blocks(n), EW_THREADS, 0, s, out, n, value);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Embedding                                                                  */
/* ------------------------------------------------------------------------- */

__global__ void embed_kernel(float *x, const int32_t *tokens, const int32_t *positions,
                             const float *wte, const float *wpe, uint32_t n, uint32_t T,
                             uint32_t C) {
    uint64_t total = (uint64_t)n * C;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t row = i / C;
        uint32_t c = (uint32_t)(i % C);
        uint64_t pos = positions ? (uint64_t)positions[row] : row % T;
        x[i] = wte[(uint64_t)tokens[row] * C + c] + wpe[pos * C + c];
    }
}

cudaError_t k_embed(cudaStream_t s, float *x, const int32_t *tokens,
                    const int32_t *positions, const float *wte, const float *wpe,
                    uint32_t n, uint32_t T, uint32_t C) {
    KLAUNCH(embed_kernel, ew_blocks((uint64_t)n * C), EW_THREADS, 0, s, x, tokens,
            positions, wte, wpe, n, T, C);
    return cudaGetLastError();
}

/* dwpe[t,c] += sum over b of dx[b*T+t, c]  (b in order) */
__global__ void embed_bwd_wpe_kernel(const float *dx, float *dwpe, uint32_t B, uint32_t T,
                                     uint32_t C) {
    uint64_t total = (uint64_t)T * C;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (uint32_t b = 0; b < B; b++) acc += dx[(uint64_t)b * T * C + i];
        dwpe[i] += acc;
    }
}

cudaError_t k_embed_bwd_wpe(cudaStream_t s, const float *dx, float *dwpe, uint32_t B,
                            uint32_t T, uint32_t C) {
    KLAUNCH(embed_bwd_wpe_kernel, ew_blocks((uint64_t)T * C), EW_THREADS, 0, s, dx, dwpe,
            B, T, C);
    return cudaGetLastError();
}

/* One block row per distinct token u; threads over channels. */
__global__ void embed_bwd_wte_kernel(const float *dx, float *dwte, const int32_t *uniq,
                                     const int32_t *start, const int32_t *rows,
                                     uint32_t C) {
    uint32_t u = blockIdx.x;
    uint32_t c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int32_t k = start[u]; k < start[u + 1]; k++)
        acc += dx[(uint64_t)rows[k] * C + c];
    dwte[(uint64_t)uniq[u] * C + c] += acc;
}

cudaError_t k_embed_bwd_wte(cudaStream_t s, const float *dx, float *dwte,
                            const int32_t *uniq, const int32_t *start,
                            const int32_t *rows, uint32_t n_uniq, uint32_t C) {
    if (n_uniq == 0) return cudaSuccess;
    dim3 grid(n_uniq, (C + EW_THREADS - 1) / EW_THREADS);
    KLAUNCH(embed_bwd_wte_kernel, grid, EW_THREADS, 0, s, dx, dwte, uniq, start, rows, C);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* LayerNorm (one warp per row)                                               */
/* ------------------------------------------------------------------------- */

__global__ void layernorm_kernel(const float *x, const float *w, const float *b,
                                 float *out, float *mean, float *rstd, uint32_t n,
                                 uint32_t C, float eps) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *xr = x + row * C;
    float s = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) s += xr[c];
    float m = warp_sum(s) / (float)C;
    float v = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) {
        float d = xr[c] - m;
        v += d * d;
    }
    float var = warp_sum(v) / (float)C;
    float r = 1.0f / sqrtf(var + eps);
    float *o = out + row * C;
    for (uint32_t c = lane; c < C; c += 32) o[c] = (xr[c] - m) * r * w[c] + b[c];
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

cudaError_t k_layernorm(cudaStream_t s, const float *x, const float *w, const float *b,
                        float *out, float *mean, float *rstd, uint32_t n, uint32_t C,
                        float eps) {
    KLAUNCH(layernorm_kernel, row_blocks(n), ROW_THREADS, 0, s, x, w, b, out, mean, rstd,
            n, C, eps);
    return cudaGetLastError();
}

__global__ void residual_layernorm_kernel(const float *a, const float *bb,
                                          const float *bias, float *res, const float *w,
                                          const float *lb, float *out, float *mean,
                                          float *rstd, uint32_t n, uint32_t C,
                                          float eps) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *ar = a + row * C;
    const float *br = bb + row * C;
    float *rr = res + row * C;
    float s = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) {
        float v = ar[c] + (br[c] + bias[c]);
        rr[c] = v;
        s += v;
    }
    float m = warp_sum(s) / (float)C;
    float v2 = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) { /* each lane rereads its own writes */
        float d = rr[c] - m;
        v2 += d * d;
    }
    float var = warp_sum(v2) / (float)C;
    float r = 1.0f / sqrtf(var + eps);
    float *o = out + row * C;
    for (uint32_t c = lane; c < C; c += 32) o[c] = (rr[c] - m) * r * w[c] + lb[c];
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

cudaError_t k_residual_layernorm(cudaStream_t s, const float *a, const float *b,
                                 const float *bias, float *res, const float *w,
                                 const float *lb, float *out, float *mean, float *rstd,
                                 uint32_t n, uint32_t C, float eps) {
    KLAUNCH(residual_layernorm_kernel, row_blocks(n), ROW_THREADS, 0, s, a, b, bias, res,
            w, lb, out, mean, rstd, n, C, eps);
    return cudaGetLastError();
}

/* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout*w */
__global__ void layernorm_bwd_dx_kernel(const float *dout, const float *x,
                                        const float *mean, const float *rstd,
                                        const float *w, float *dx, uint32_t n, uint32_t C,
                                        int accumulate) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *dy = dout + row * C;
    const float *xr = x + row * C;
    float m = mean[row], r = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) {
        float dxh = dy[c] * w[c];
        float xh = (xr[c] - m) * r;
        s1 += dxh;
        s2 += dxh * xh;
    }
    s1 = warp_sum(s1) / (float)C;
    s2 = warp_sum(s2) / (float)C;
    float *o = dx + row * C;
    for (uint32_t c = lane; c < C; c += 32) {
        float dxh = dy[c] * w[c];
        float xh = (xr[c] - m) * r;
        float g = r * (dxh - s1 - xh * s2);
        o[c] = accumulate ? o[c] + g : g;
    }
}

cudaError_t k_layernorm_bwd_dx(cudaStream_t s, const float *dout, const float *x,
                               const float *mean, const float *rstd, const float *w,
                               float *dx, uint32_t n, uint32_t C, int accumulate) {
    KLAUNCH(layernorm_bwd_dx_kernel, row_blocks(n), ROW_THREADS, 0, s, dout, x, mean,
            rstd, w, dx, n, C, accumulate);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Column sums (bias and LayerNorm parameter gradients)                       */
/* ------------------------------------------------------------------------- */
/* Stage 1: grid (ceil(C/32), chunks), block (32, 8). Block (cx, k) sums rows
 * [k*rpc, min(n,(k+1)*rpc)) of columns cx*32..cx*32+31 into part[k*C + c].
 * Stage 2: out[c] += sum over k of part[k*C + c], k ascending. */

#define CS_X 32
#define CS_Y 8

/* Chunks of at least 64 rows (8 per row-phase thread), at most
 * CU_COLSUM_CHUNKS of them: a pure function of n, so sums are reproducible. */
static void colsum_shape(uint32_t n, uint32_t *chunks, uint32_t *rpc) {
    uint32_t r = (n + CU_COLSUM_CHUNKS - 1) / CU_COLSUM_CHUNKS;
    if (r < 64) r = 64;
    *rpc = r;
    *chunks = n ? (n + r - 1) / r : 1;
}

__global__ void colsum_partial_kernel(const float *a, float *part, uint32_t n, uint32_t C,
                                      uint32_t rpc) {
    __shared__ float sh[CS_Y][CS_X + 1];
    uint32_t c = blockIdx.x * CS_X + threadIdx.x;
    uint32_t k = blockIdx.y;
    uint64_t r0 = (uint64_t)k * rpc;
    uint64_t r1 = r0 + rpc < n ? r0 + rpc : n;
    float acc = 0.0f;
    if (c < C)
        for (uint64_t r = r0 + threadIdx.y; r < r1; r += CS_Y) acc += a[r * C + c];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int i = 0; i < CS_Y; i++) t += sh[i][threadIdx.x];
        part[(uint64_t)k * C + c] = t;
    }
}

__global__ void ln_param_partial_kernel(const float *dout, const float *x,
                                        const float *mean, const float *rstd,
                                        float *part_w, float *part_b, uint32_t n,
                                        uint32_t C, uint32_t rpc) {
    __shared__ float sw[CS_Y][CS_X + 1];
    __shared__ float sb[CS_Y][CS_X + 1];
    uint32_t c = blockIdx.x * CS_X + threadIdx.x;
    uint32_t k = blockIdx.y;
    uint64_t r0 = (uint64_t)k * rpc;
    uint64_t r1 = r0 + rpc < n ? r0 + rpc : n;
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (uint64_t r = r0 + threadIdx.y; r < r1; r += CS_Y) {
            float d = dout[r * C + c];
            float xh = (x[r * C + c] - mean[r]) * rstd[r];
            aw += d * xh;
            ab += d;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int i = 0; i < CS_Y; i++) {
            tw += sw[i][threadIdx.x];
            tb += sb[i][threadIdx.x];
        }
        part_w[(uint64_t)k * C + c] = tw;
        part_b[(uint64_t)k * C + c] = tb;
    }
}

__global__ void colsum_finish_kernel(const float *part, float *out, uint32_t chunks,
                                     uint32_t C) {
    uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = 0.0f;
    for (uint32_t k = 0; k < chunks; k++) t += part[(uint64_t)k * C + c];
    out[c] += t;
}

cudaError_t k_colsum_add(cudaStream_t s, const float *a, float *out, uint32_t n,
                         uint32_t C, float *part) {
    uint32_t chunks, rpc;
    colsum_shape(n, &chunks, &rpc);
    dim3 grid((C + CS_X - 1) / CS_X, chunks);
    dim3 block(CS_X, CS_Y);
    KLAUNCH(colsum_partial_kernel, grid, block, 0, s, a, part, n, C, rpc);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    KLAUNCH(colsum_finish_kernel, (C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, 0, s,
            part, out, chunks, C);
    return cudaGetLastError();
}

cudaError_t k_layernorm_bwd_params(cudaStream_t s, const float *dout, const float *x,
                                   const float *mean, const float *rstd, float *dw,
                                   float *db, uint32_t n, uint32_t C, float *part) {
    uint32_t chunks, rpc;
    colsum_shape(n, &chunks, &rpc);
    float *part_w = part;
    float *part_b = part + (uint64_t)CU_COLSUM_CHUNKS * C;
    dim3 grid((C + CS_X - 1) / CS_X, chunks);
    dim3 block(CS_X, CS_Y);
    KLAUNCH(ln_param_partial_kernel, grid, block, 0, s, dout, x, mean, rstd, part_w,
            part_b, n, C, rpc);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    unsigned int fb = (C + EW_THREADS - 1) / EW_THREADS;
    KLAUNCH(colsum_finish_kernel, fb, EW_THREADS, 0, s, part_w, dw, chunks, C);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    KLAUNCH(colsum_finish_kernel, fb, EW_THREADS, 0, s, part_b, db, chunks, C);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Attention layout changes                                                   */
/* ------------------------------------------------------------------------- */
/* Token row r = b*T + t; head layout index ((b*H + h)*T + t)*hs + d. */

__device__ __forceinline__ uint64_t head_index(uint64_t r, uint32_t c, uint32_t T,
                                               uint32_t H, uint32_t hs) {
    uint64_t b = r / T, t = r % T;
    uint32_t h = c / hs, d = c % hs;
    return ((b * H + h) * T + t) * hs + d;
}

__global__ void split_heads_kernel(const float *qkv, const float *bias, float *dst,
                                   uint32_t N, uint32_t T, uint32_t H, uint32_t hs) {
    uint32_t C = H * hs;
    uint64_t NC = (uint64_t)N * C;
    uint64_t total = NC * 3;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / (3u * C);
        uint32_t j = (uint32_t)(i % (3u * C));
        uint32_t which = j / C, c = j % C;
        dst[which * NC + head_index(r, c, T, H, hs)] = qkv[i] + bias[j];
    }
}

cudaError_t k_split_heads(cudaStream_t s, const float *qkv, const float *bias, float *dst,
                          uint32_t B, uint32_t T, uint32_t H, uint32_t hs) {
    uint32_t N = B * T;
    KLAUNCH(split_heads_kernel, ew_blocks((uint64_t)N * H * hs * 3), EW_THREADS, 0, s,
            qkv, bias, dst, N, T, H, hs);
    return cudaGetLastError();
}

__global__ void merge_heads_kernel(const float *src, float *dst, uint32_t N, uint32_t T,
                                   uint32_t H, uint32_t hs, uint32_t count) {
    uint32_t C = H * hs;
    uint64_t NC = (uint64_t)N * C;
    uint64_t total = NC * count;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / (count * C);
        uint32_t j = (uint32_t)(i % (count * C));
        uint32_t which = j / C, c = j % C;
        dst[i] = src[which * NC + head_index(r, c, T, H, hs)];
    }
}

cudaError_t k_merge_heads(cudaStream_t s, const float *src, float *dst, uint32_t B,
                          uint32_t T, uint32_t H, uint32_t hs, uint32_t count) {
    uint32_t N = B * T;
    KLAUNCH(merge_heads_kernel, ew_blocks((uint64_t)N * H * hs * count), EW_THREADS, 0, s,
            src, dst, N, T, H, hs, count);
    return cudaGetLastError();
}

__global__ void to_heads_kernel(const float *src, float *dst, uint32_t N, uint32_t T,
                                uint32_t H, uint32_t hs) {
    uint32_t C = H * hs;
    uint64_t total = (uint64_t)N * C;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / C;
        uint32_t c = (uint32_t)(i % C);
        dst[head_index(r, c, T, H, hs)] = src[i];
    }
}

cudaError_t k_to_heads(cudaStream_t s, const float *src, float *dst, uint32_t B,
                       uint32_t T, uint32_t H, uint32_t hs) {
    uint32_t N = B * T;
    KLAUNCH(to_heads_kernel, ew_blocks((uint64_t)N * H * hs), EW_THREADS, 0, s, src, dst,
            N, T, H, hs);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Causal softmax (one warp per row; row r is query i = r % T and attends to
 * keys 0..i). With query chunks of tc rows, row i's chunk only computes keys
 * below lim(i) = min(T, (i/tc + 1)*tc): the kernels read j <= i and write
 * every j < lim(i) (zeros above the diagonal); columns from lim(i) on are
 * neither read nor written, and no product reads them either. */

/* One warp's row x: softmax of x[0..i] in place, x[i+1..lim) zeroed. */
__device__ __forceinline__ void softmax_row_upto(float *x, uint32_t i, uint32_t lim,
                                                 uint32_t lane) {
    float mx = -INFINITY;
    for (uint32_t j = lane; j <= i; j += 32) mx = fmaxf(mx, x[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (uint32_t j = lane; j <= i; j += 32) {
        float e = expf(x[j] - mx);
        x[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    float inv = 1.0f / sum;
    for (uint32_t j = lane; j < lim; j += 32) x[j] = j <= i ? x[j] * inv : 0.0f;
}

__device__ __forceinline__ uint32_t chunk_limit(uint32_t i, uint32_t T, uint32_t tc) {
    uint32_t lim = (i / tc + 1) * tc;
    return lim < T ? lim : T;
}

__global__ void softmax_causal_kernel(float *att, uint64_t rows, uint32_t T,
                                      uint32_t tc) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= rows) return;
    uint32_t i = (uint32_t)(row % T);
    uint32_t lim = chunk_limit(i, T, tc);
    softmax_row_upto(att + row * T, i, lim, lane);
}

cudaError_t k_softmax_causal(cudaStream_t s, float *att, uint64_t rows, uint32_t T,
                             uint32_t tc) {
    KLAUNCH(softmax_causal_kernel, row_blocks(rows), ROW_THREADS, 0, s, att, rows, T, tc);
    return cudaGetLastError();
}

__global__ void softmax_causal_bwd_kernel(const float *att, float *datt, uint64_t rows,
                                          uint32_t T, uint32_t tc) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= rows) return;
    uint32_t i = (uint32_t)(row % T);
    uint32_t lim = chunk_limit(i, T, tc);
    const float *p = att + row * T;
    float *d = datt + row * T;
    float s = 0.0f;
    for (uint32_t j = lane; j <= i; j += 32) s += p[j] * d[j];
    s = warp_sum(s);
    for (uint32_t j = lane; j < lim; j += 32) d[j] = j <= i ? p[j] * (d[j] - s) : 0.0f;
}

cudaError_t k_softmax_causal_bwd(cudaStream_t s, const float *att, float *datt,
                                 uint64_t rows, uint32_t T, uint32_t tc) {
    KLAUNCH(softmax_causal_bwd_kernel, row_blocks(rows), ROW_THREADS, 0, s, att, datt,
            rows, T, tc);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* GELU (tanh form)                                                           */
/* ------------------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_K * (x + GELU_A * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_grad_f(float x) {
    float u = GELU_K * (x + GELU_A * x * x * x);
    float t = tanhf(u);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

__global__ void bias_gelu_kernel(float *h, const float *bias, float *g, uint32_t n,
                                 uint32_t M) {
    uint64_t total = (uint64_t)n * M;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float v = h[i] + bias[i % M];
        h[i] = v;
        g[i] = gelu_f(v);
    }
}

cudaError_t k_bias_gelu(cudaStream_t s, float *h, const float *bias, float *g, uint32_t n,
                        uint32_t M) {
    KLAUNCH(bias_gelu_kernel, ew_blocks((uint64_t)n * M), EW_THREADS, 0, s, h, bias, g, n,
            M);
    return cudaGetLastError();
}

__global__ void gelu_bwd_kernel(const float *h, float *dg, uint32_t n, uint32_t M) {
    uint64_t total = (uint64_t)n * M;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x)
        dg[i] *= gelu_grad_f(h[i]);
}

cudaError_t k_gelu_bwd(cudaStream_t s, const float *h, float *dg, uint32_t n,
                       uint32_t M) {
    KLAUNCH(gelu_bwd_kernel, ew_blocks((uint64_t)n * M), EW_THREADS, 0, s, h, dg, n, M);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Cross-entropy (one block per row)                                          */
/* ------------------------------------------------------------------------- */

#define CE_THREADS 512

__global__ void cross_entropy_kernel(float *logits, const int32_t *targets, float *losses,
                                     uint32_t V, float dscale, int grad) {
    __shared__ float sh[32];
    uint64_t row = blockIdx.x;
    float *x = logits + row * V;
    int32_t t = targets[row];
    /* Every thread reads x[t] before the first barrier; x is only written
     * after the last reduction's barrier. */
    float xt = t >= 0 ? x[t] : 0.0f;
    float mx = -INFINITY;
    for (uint32_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (uint32_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - mx);
    sum = block_sum(sum, sh);
    if (threadIdx.x == 0) losses[row] = t >= 0 ? logf(sum) + mx - xt : 0.0f;
    if (!grad) return;
    float inv = 1.0f / sum;
    for (uint32_t j = threadIdx.x; j < V; j += blockDim.x) {
        float g = 0.0f;
        if (t >= 0) {
            float p = expf(x[j] - mx) * inv;
            g = (p - ((int32_t)j == t ? 1.0f : 0.0f)) * dscale;
        }
        x[j] = g;
    }
}

cudaError_t k_cross_entropy(cudaStream_t s, float *logits, const int32_t *targets,
                            float *losses, uint32_t n, uint32_t V, float dscale,
                            int grad) {
    if (n == 0) return cudaSuccess;
    KLAUNCH(cross_entropy_kernel, n, CE_THREADS, 0, s, logits, targets, losses, V, dscale,
            grad);
    return cudaGetLastError();
}

#define SUM_THREADS 512

__global__ void sum_to_double_kernel(const float *x, uint64_t n, double *out) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) acc += (double)x[i];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) *out = acc;
}

cudaError_t k_sum_to_double(cudaStream_t s, const float *x, uint64_t n, double *out) {
    KLAUNCH(sum_to_double_kernel, 1, SUM_THREADS, 0, s, x, n, out);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Global gradient norm and AdamW                                             */
/* ------------------------------------------------------------------------- */

#define NORM_THREADS 256

__global__ void sumsq_partial_kernel(const float *g, uint64_t n, double *part) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        double v = (double)g[i];
        acc += v * v;
    }
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void norm_finish_kernel(const double *part, float *norm, float clip) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (uint32_t i = threadIdx.x; i < CU_NORM_BLOCKS; i += blockDim.x) acc += part[i];
    acc = block_sum_d(acc, sh);
    if (threadIdx.x == 0) {
        double nrm = sqrt(acc);
        float scale = 1.0f;
        if (clip > 0.0f && nrm > (double)clip) scale = (float)((double)clip / nrm);
        norm[0] = (float)nrm;
        norm[1] = isfinite(nrm) ? scale : NAN; /* NaN scale: "do not update" */
    }
}

cudaError_t k_grad_norm(cudaStream_t s, const float *g, uint64_t n, double *part,
                        float *norm, float clip) {
    KLAUNCH(sumsq_partial_kernel, CU_NORM_BLOCKS, NORM_THREADS, 0, s, g, n, part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    KLAUNCH(norm_finish_kernel, 1, NORM_THREADS, 0, s, part, norm, clip);
    return cudaGetLastError();
}

/* PyTorch's AdamW order (as the CPU engine): p *= 1 - lr*wd;
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps). */
__global__ void adamw_kernel(float *p, float *g, float *m, float *v, uint64_t n,
                             const float *norm, cu_adamw_consts c) {
    float scale = norm[1];
    if (!isfinite(scale)) return; /* non-finite gradient norm: change nothing */
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (scale != 1.0f) {
            gi *= scale;
            g[i] = gi;
        }
        float pv = p[i] * c.decay;
        float mv = m[i] * c.beta1 + gi * c.one_minus_beta1;
        float vv = v[i] * c.beta2 + gi * gi * c.one_minus_beta2;
        float denom = sqrtf(vv) * c.inv_bc2_sqrt + c.eps;
        p[i] = pv - c.step_size * (mv / denom);
        m[i] = mv;
        v[i] = vv;
    }
}

cudaError_t k_adamw(cudaStream_t s, float *p, float *g, float *m, float *v, uint64_t n,
                    const float *norm, const cu_adamw_consts *c) {
    KLAUNCH(adamw_kernel, ew_blocks(n), EW_THREADS, 0, s, p, g, m, v, n, norm, *c);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Inference: KV writes and paged attention                                   */
/* ------------------------------------------------------------------------- */
/* KV pool layout: block b, layer l, K (0) or V (1), slot p % bs, channel c at
 *   kv[b*L*2*bs*W + ((l*2 + kind)*bs + slot)*W + c], W = kv_heads*hs (the row
 *   width: C for GPT-2). */

__device__ __forceinline__ uint64_t kv_index(uint32_t block, uint32_t layer,
                                             uint32_t kind, uint32_t slot, uint32_t c,
                                             uint32_t C, uint32_t bs, uint32_t L) {
    uint64_t block_elems = (uint64_t)L * 2 * bs * C;
    return (uint64_t)block * block_elems +
           (((uint64_t)layer * 2 + kind) * bs + slot) * C + c;
}

__global__ void kv_write_kernel(const float *qkv, const float *bias, float *q, float *kv,
                                const int32_t *pos, const int32_t *seq,
                                const int32_t *bt_off, const int32_t *bt_all, uint32_t n,
                                uint32_t C, uint32_t bs, uint32_t L, uint32_t layer) {
    uint64_t total = (uint64_t)n * 3 * C;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t tok = i / (3u * C);
        uint32_t j = (uint32_t)(i % (3u * C));
        float val = qkv[i] + bias[j];
        if (j < C) {
            q[tok * C + j] = val;
        } else {
            uint32_t kind = (j - C) / C; /* 0 = K, 1 = V */
            uint32_t c = (j - C) % C;
            uint32_t p = (uint32_t)pos[tok];
            uint32_t blk = (uint32_t)bt_all[bt_off[seq[tok]] + p / bs];
            kv[kv_index(blk, layer, kind, p % bs, c, C, bs, L)] = val;
        }
    }
}

cudaError_t k_kv_write(cudaStream_t s, const float *qkv, const float *bias, float *q,
                       float *kv, const int32_t *pos, const int32_t *seq,
                       const int32_t *bt_off, const int32_t *bt_all, uint32_t n,
                       uint32_t C, uint32_t bs, uint32_t L, uint32_t layer) {
    KLAUNCH(kv_write_kernel, ew_blocks((uint64_t)n * 3 * C), EW_THREADS, 0, s, qkv, bias,
            q, kv, pos, seq, bt_off, bt_all, n, C, bs, L, layer);
    return cudaGetLastError();
}

#define ATTN_THREADS 256 /* 8 warps */

/* grid (n tokens, H heads). Scores for keys 0..pos live in dynamic shared
 * memory; each warp computes whole dot products (lanes split the head dim).
 * Query head h reads K/V head h / (H/KVH) (grouped-query attention; GPT-2
 * passes KVH = H). */
__global__ void paged_attention_kernel(const float *q, const float *kv,
                                       const int32_t *pos, const int32_t *seq,
                                       const int32_t *bt_off, const int32_t *bt_all,
                                       float *y, uint32_t C, uint32_t H, uint32_t KVH,
                                       uint32_t bs, uint32_t L, uint32_t layer) {
    CU_DYN_SHARED(float, scores);
    __shared__ float red[32];
    uint64_t tok = blockIdx.x;
    uint32_t h = blockIdx.y;
    uint32_t hs = C / H;
    uint32_t W = KVH * hs;              /* K/V row width of the pool */
    uint32_t kc = (h / (H / KVH)) * hs; /* this query head's K/V head */
    uint32_t nk = (uint32_t)pos[tok] + 1;
    const int32_t *bt = bt_all + bt_off[seq[tok]];
    const float *qh = q + tok * C + (uint64_t)h * hs;
    float scale = 1.0f / sqrtf((float)hs);
    uint32_t lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    uint32_t nw = blockDim.x >> 5;

    for (uint32_t j = wid; j < nk; j += nw) {
        const float *kr =
            kv + kv_index((uint32_t)bt[j / bs], layer, 0, j % bs, kc, W, bs, L);
        float part = 0.0f;
        for (uint32_t d = lane; d < hs; d += 32) part += qh[d] * kr[d];
        part = warp_sum(part);
        if (lane == 0) scores[j] = part * scale;
    }
    __syncthreads();

    float mx = -INFINITY;
    for (uint32_t j = threadIdx.x; j < nk; j += blockDim.x) mx = fmaxf(mx, scores[j]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (uint32_t j = threadIdx.x; j < nk; j += blockDim.x) {
        float e = expf(scores[j] - mx);
        scores[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red); /* its barriers also publish the scores[] writes */
    float inv = 1.0f / sum;

    /* y = sum_j p_j v_j, 32 channels at a time: warp w sums keys j = w mod nw
     * (lanes read 32 consecutive floats of a V row), then warp 0 adds the nw
     * partial sums in warp order (fixed, so reproducible). */
    __shared__ float vpart[ATTN_THREADS / 32][33];
    for (uint32_t d0 = 0; d0 < hs; d0 += 32) {
        uint32_t d = d0 + lane;
        float acc = 0.0f;
        if (d < hs)
            for (uint32_t j = wid; j < nk; j += nw) {
                const float *vr =
                    kv + kv_index((uint32_t)bt[j / bs], layer, 1, j % bs, kc, W, bs, L);
                acc += scores[j] * vr[d];
            }
        vpart[wid][lane] = acc;
        __syncthreads();
        if (wid == 0 && d < hs) {
            float t = 0.0f;
            for (uint32_t w = 0; w < nw; w++) t += vpart[w][lane];
            y[tok * C + (uint64_t)h * hs + d] = t * inv;
        }
        __syncthreads(); /* vpart is reused by the next channel group */
    }
}

cudaError_t k_paged_attention_smem(size_t bytes) {
    return cudaFuncSetAttribute(paged_attention_kernel,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

cudaError_t k_paged_attention(cudaStream_t s, const float *q, const float *kv,
                              const int32_t *pos, const int32_t *seq,
                              const int32_t *bt_off, const int32_t *bt_all, float *y,
                              uint32_t n, uint32_t C, uint32_t H, uint32_t KVH,
                              uint32_t bs, uint32_t L, uint32_t layer,
                              size_t smem_bytes) {
    if (n == 0) return cudaSuccess;
    dim3 grid(n, H);
    KLAUNCH(paged_attention_kernel, grid, ATTN_THREADS, smem_bytes, s, q, kv, pos, seq,
            bt_off, bt_all, y, C, H, KVH, bs, L, layer);
    return cudaGetLastError();
}

__global__ void gather_rows_kernel(const float *src, const int32_t *rows, float *dst,
                                   uint32_t n_rows, uint32_t C) {
    uint64_t total = (uint64_t)n_rows * C;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / C;
        uint32_t c = (uint32_t)(i % C);
        dst[i] = src[(uint64_t)rows[r] * C + c];
    }
}

cudaError_t k_gather_rows(cudaStream_t s, const float *src, const int32_t *rows,
                          float *dst, uint32_t n_rows, uint32_t C) {
    if (n_rows == 0) return cudaSuccess;
    KLAUNCH(gather_rows_kernel, ew_blocks((uint64_t)n_rows * C), EW_THREADS, 0, s, src,
            rows, dst, n_rows, C);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* LLaMA: RMSNorm, RoPE, SwiGLU                                               */
/* ------------------------------------------------------------------------- */

/* out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); one warp per row. */
__global__ void rmsnorm_kernel(const float *x, const float *w, float *out, float *rstd,
                               uint32_t n, uint32_t C, float eps) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *xr = x + row * C;
    float s = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) s += xr[c] * xr[c];
    float r = 1.0f / sqrtf(warp_sum(s) / (float)C + eps);
    float *o = out + row * C;
    for (uint32_t c = lane; c < C; c += 32) o[c] = xr[c] * r * w[c];
    if (lane == 0 && rstd) rstd[row] = r;
}

cudaError_t k_rmsnorm(cudaStream_t s, const float *x, const float *w, float *out,
                      float *rstd, uint32_t n, uint32_t C, float eps) {
    KLAUNCH(rmsnorm_kernel, row_blocks(n), ROW_THREADS, 0, s, x, w, out, rstd, n, C, eps);
    return cudaGetLastError();
}

__global__ void residual_rmsnorm_kernel(const float *a, const float *b, float *res,
                                        const float *w, float *out, float *rstd,
                                        uint32_t n, uint32_t C, float eps) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *ar = a + row * C;
    const float *br = b + row * C;
    float *rr = res + row * C;
    float s = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) {
        float v = ar[c] + br[c];
        rr[c] = v;
        s += v * v;
    }
    float r = 1.0f / sqrtf(warp_sum(s) / (float)C + eps);
    float *o = out + row * C;
    for (uint32_t c = lane; c < C; c += 32) o[c] = rr[c] * r * w[c]; /* own writes */
    if (lane == 0 && rstd) rstd[row] = r;
}

cudaError_t k_residual_rmsnorm(cudaStream_t s, const float *a, const float *b, float *res,
                               const float *w, float *out, float *rstd, uint32_t n,
                               uint32_t C, float eps) {
    KLAUNCH(residual_rmsnorm_kernel, row_blocks(n), ROW_THREADS, 0, s, a, b, res, w, out,
            rstd, n, C, eps);
    return cudaGetLastError();
}

/* dx = rstd * (dxh - xhat * mean(dxh * xhat)), dxh = dout*w, xhat = x*rstd */
__global__ void rmsnorm_bwd_dx_kernel(const float *dout, const float *x,
                                      const float *rstd, const float *w, float *dx,
                                      uint32_t n, uint32_t C, int accumulate) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *dy = dout + row * C;
    const float *xr = x + row * C;
    float r = rstd[row];
    float s2 = 0.0f;
    for (uint32_t c = lane; c < C; c += 32) s2 += dy[c] * w[c] * (xr[c] * r);
    s2 = warp_sum(s2) / (float)C;
    float *o = dx + row * C;
    for (uint32_t c = lane; c < C; c += 32) {
        float g = r * (dy[c] * w[c] - xr[c] * r * s2);
        o[c] = accumulate ? o[c] + g : g;
    }
}

cudaError_t k_rmsnorm_bwd_dx(cudaStream_t s, const float *dout, const float *x,
                             const float *rstd, const float *w, float *dx, uint32_t n,
                             uint32_t C, int accumulate) {
    KLAUNCH(rmsnorm_bwd_dx_kernel, row_blocks(n), ROW_THREADS, 0, s, dout, x, rstd, w, dx,
            n, C, accumulate);
    return cudaGetLastError();
}

/* Stage 1 of dw += sum_rows dout * x * rstd (the column-sum shape above). */
__global__ void rms_param_partial_kernel(const float *dout, const float *x,
                                         const float *rstd, float *part, uint32_t n,
                                         uint32_t C, uint32_t rpc) {
    __shared__ float sw[CS_Y][CS_X + 1];
    uint32_t c = blockIdx.x * CS_X + threadIdx.x;
    uint32_t k = blockIdx.y;
    uint64_t r0 = (uint64_t)k * rpc;
    uint64_t r1 = r0 + rpc < n ? r0 + rpc : n;
    float aw = 0.0f;
    if (c < C)
        for (uint64_t r = r0 + threadIdx.y; r < r1; r += CS_Y)
            aw += dout[r * C + c] * (x[r * C + c] * rstd[r]);
    sw[threadIdx.y][threadIdx.x] = aw;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f;
        for (int i = 0; i < CS_Y; i++) tw += sw[i][threadIdx.x];
        part[(uint64_t)k * C + c] = tw;
    }
}

cudaError_t k_rmsnorm_bwd_w(cudaStream_t s, const float *dout, const float *x,
                            const float *rstd, float *dw, uint32_t n, uint32_t C,
                            float *part) {
    uint32_t chunks, rpc;
    colsum_shape(n, &chunks, &rpc);
    dim3 grid((C + CS_X - 1) / CS_X, chunks);
    dim3 block(CS_X, CS_Y);
    KLAUNCH(rms_param_partial_kernel, grid, block, 0, s, dout, x, rstd, part, n, C, rpc);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    KLAUNCH(colsum_finish_kernel, (C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, 0, s,
            part, dw, chunks, C);
    return cudaGetLastError();
}

/* Rotate-half RoPE of element d (0 <= d < D) of a head vector x at position
 * pos: d < D/2 pairs with d + D/2, angle pos * inv_freq[d % (D/2)];
 * sign = -1 applies the inverse rotation (the backward pass). */
__device__ __forceinline__ float rope_elem(const float *x, uint32_t d, uint32_t D,
                                           uint32_t pos, const float *inv_freq,
                                           float sign) {
    uint32_t half = D / 2;
    uint32_t i = d < half ? d : d - half;
    float ang = (float)pos * inv_freq[i];
    float cs = cosf(ang), sn = sign * sinf(ang);
    return d < half ? x[d] * cs - x[d + half] * sn : x[d] * cs + x[d - half] * sn;
}

/* qkv [N, W] rows (W = (H + 2*KVH)*D: q | k | v) -> q [B,H,T,D] with RoPE,
 * k [B,KVH,T,D] with RoPE, v [B,KVH,T,D]; position of row r is r % T. One
 * thread per output element (reads along the row, coalesced). */
__global__ void llama_split_heads_kernel(const float *qkv, float *q, float *k, float *v,
                                         const float *inv_freq, uint32_t N, uint32_t T,
                                         uint32_t H, uint32_t KVH, uint32_t D) {
    uint32_t W = (H + 2 * KVH) * D;
    uint64_t total = (uint64_t)N * W;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / W;
        uint32_t j = (uint32_t)(i % W);
        uint32_t head = j / D, d = j % D; /* head over the q | k | v heads */
        uint64_t b = r / T;
        uint32_t t = (uint32_t)(r % T);
        const float *x = qkv + r * W + (uint64_t)head * D;
        if (head < H) {
            q[((b * H + head) * T + t) * D + d] = rope_elem(x, d, D, t, inv_freq, 1.0f);
        } else if (head < H + KVH) {
            uint64_t g = head - H;
            k[((b * KVH + g) * T + t) * D + d] = rope_elem(x, d, D, t, inv_freq, 1.0f);
        } else {
            uint64_t g = head - H - KVH;
            v[((b * KVH + g) * T + t) * D + d] = x[d];
        }
    }
}

cudaError_t k_llama_split_heads(cudaStream_t s, const float *qkv, float *q, float *k,
                                float *v, const float *inv_freq, uint32_t B, uint32_t T,
                                uint32_t H, uint32_t KVH, uint32_t D) {
    uint32_t N = B * T;
    KLAUNCH(llama_split_heads_kernel, ew_blocks((uint64_t)N * (H + 2 * KVH) * D),
            EW_THREADS, 0, s, qkv, q, k, v, inv_freq, N, T, H, KVH, D);
    return cudaGetLastError();
}

/* The backward of llama_split_heads: dq, dk (rotated back), dv in head
 * layout -> dqkv [N, W]. One thread per output element. */
__global__ void llama_merge_heads_kernel(const float *dq, const float *dk,
                                         const float *dv, float *dqkv,
                                         const float *inv_freq, uint32_t N, uint32_t T,
                                         uint32_t H, uint32_t KVH, uint32_t D) {
    uint32_t W = (H + 2 * KVH) * D;
    uint64_t total = (uint64_t)N * W;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / W;
        uint32_t j = (uint32_t)(i % W);
        uint32_t head = j / D, d = j % D;
        uint64_t b = r / T;
        uint32_t t = (uint32_t)(r % T);
        float val;
        if (head < H) {
            val = rope_elem(dq + ((b * H + head) * T + t) * D, d, D, t, inv_freq, -1.0f);
        } else if (head < H + KVH) {
            uint64_t g = head - H;
            val = rope_elem(dk + ((b * KVH + g) * T + t) * D, d, D, t, inv_freq, -1.0f);
        } else {
            uint64_t g = head - H - KVH;
            val = dv[((b * KVH + g) * T + t) * D + d];
        }
        dqkv[i] = val;
    }
}

cudaError_t k_llama_merge_heads(cudaStream_t s, const float *dq, const float *dk,
                                const float *dv, float *dqkv, const float *inv_freq,
                                uint32_t B, uint32_t T, uint32_t H, uint32_t KVH,
                                uint32_t D) {
    uint32_t N = B * T;
    KLAUNCH(llama_merge_heads_kernel, ew_blocks((uint64_t)N * (H + 2 * KVH) * D),
            EW_THREADS, 0, s, dq, dk, dv, dqkv, inv_freq, N, T, H, KVH, D);
    return cudaGetLastError();
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* gu [n, 2M] (gate | up) -> out[r*ldo + j] = silu(gate) * up. out may be gu
 * itself with ldo = 2M (each thread reads its two inputs before writing its
 * own gate element). */
__global__ void swiglu_kernel(const float *gu, float *out, uint32_t n, uint32_t M,
                              uint32_t ldo) {
    uint64_t total = (uint64_t)n * M;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / M;
        uint32_t j = (uint32_t)(i % M);
        float g = gu[r * 2 * M + j], u = gu[r * 2 * M + M + j];
        out[r * ldo + j] = g * sigmoid_f(g) * u;
    }
}

cudaError_t k_swiglu(cudaStream_t s, const float *gu, float *out, uint32_t n, uint32_t M,
                     uint32_t ldo) {
    KLAUNCH(swiglu_kernel, ew_blocks((uint64_t)n * M), EW_THREADS, 0, s, gu, out, n, M,
            ldo);
    return cudaGetLastError();
}

/* dgu [n, 2M] from d(act) [n, M]: d gate = dact * up * silu'(gate),
 * d up = dact * silu(gate); silu'(g) = s(g) (1 + g (1 - s(g))). */
__global__ void swiglu_bwd_kernel(const float *gu, const float *dact, float *dgu,
                                  uint32_t n, uint32_t M) {
    uint64_t total = (uint64_t)n * M;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / M;
        uint32_t j = (uint32_t)(i % M);
        float g = gu[r * 2 * M + j], u = gu[r * 2 * M + M + j], da = dact[i];
        float sg = sigmoid_f(g);
        dgu[r * 2 * M + j] = da * u * sg * (1.0f + g * (1.0f - sg));
        dgu[r * 2 * M + M + j] = da * g * sg;
    }
}

cudaError_t k_swiglu_bwd(cudaStream_t s, const float *gu, const float *dact, float *dgu,
                         uint32_t n, uint32_t M) {
    KLAUNCH(swiglu_bwd_kernel, ew_blocks((uint64_t)n * M), EW_THREADS, 0, s, gu, dact,
            dgu, n, M);
    return cudaGetLastError();
}

/* Inference: qkv [n, W] -> q [n, H*D] with RoPE at pos[t]; K (RoPE) and V
 * into the blocks of layer `layer` (rows of KVH*D). */
__global__ void llama_kv_write_kernel(const float *qkv, float *q, float *kv,
                                      const float *inv_freq, const int32_t *pos,
                                      const int32_t *seq, const int32_t *bt_off,
                                      const int32_t *bt_all, uint32_t n, uint32_t H,
                                      uint32_t KVH, uint32_t D, uint32_t bs, uint32_t L,
                                      uint32_t layer) {
    uint32_t W = (H + 2 * KVH) * D, C = H * D, KW = KVH * D;
    uint64_t total = (uint64_t)n * W;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t tok = i / W;
        uint32_t j = (uint32_t)(i % W);
        uint32_t head = j / D, d = j % D;
        uint32_t p = (uint32_t)pos[tok];
        const float *x = qkv + tok * W + (uint64_t)head * D;
        if (head < H) {
            q[tok * C + j] = rope_elem(x, d, D, p, inv_freq, 1.0f);
        } else {
            uint32_t kind = head < H + KVH ? 0 : 1;
            uint32_t c = j - C - kind * KW;
            float val = kind == 0 ? rope_elem(x, d, D, p, inv_freq, 1.0f) : x[d];
            uint32_t blk = (uint32_t)bt_all[bt_off[seq[tok]] + p / bs];
            kv[kv_index(blk, layer, kind, p % bs, c, KW, bs, L)] = val;
        }
    }
}

cudaError_t k_llama_kv_write(cudaStream_t s, const float *qkv, float *q, float *kv,
                             const float *inv_freq, const int32_t *pos,
                             const int32_t *seq, const int32_t *bt_off,
                             const int32_t *bt_all, uint32_t n, uint32_t H, uint32_t KVH,
                             uint32_t D, uint32_t bs, uint32_t L, uint32_t layer) {
    if (n == 0) return cudaSuccess;
    KLAUNCH(llama_kv_write_kernel, ew_blocks((uint64_t)n * (H + 2 * KVH) * D), EW_THREADS,
            0, s, qkv, q, kv, inv_freq, pos, seq, bt_off, bt_all, n, H, KVH, D, bs, L,
            layer);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------------- */
/* Token-level fine-tuning streams (cuda_ft_stream.cu, ABI 1.5)               */
/* ------------------------------------------------------------------------- */

__global__ void ft_copy_cols_kernel(const float *src, uint32_t lds, const float *bias,
                                    float *dst, uint32_t ldd, uint32_t n, uint32_t w) {
    uint64_t total = (uint64_t)n * w;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / w;
        uint32_t c = (uint32_t)(i % w);
        dst[r * ldd + c] = src[r * lds + c] + (bias ? bias[c] : 0.0f);
    }
}

cudaError_t k_ft_copy_cols(cudaStream_t s, const float *src, uint32_t lds,
                           const float *bias, float *dst, uint32_t ldd, uint32_t n,
                           uint32_t w) {
    KLAUNCH(ft_copy_cols_kernel, ew_blocks((uint64_t)n * w), EW_THREADS, 0, s, src, lds,
            bias, dst, ldd, n, w);
    return cudaGetLastError();
}

__global__ void ft_add_kernel(float *a, const float *b, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        a[i] += b[i];
}

cudaError_t k_ft_add(cudaStream_t s, float *a, const float *b, uint64_t n) {
    KLAUNCH(ft_add_kernel, ew_blocks(n), EW_THREADS, 0, s, a, b, n);
    return cudaGetLastError();
}

/* Row r of [rows, nk]: query position p0 + r % nq sees keys 0..p. */
__global__ void ft_softmax_kernel(float *att, uint64_t rows, uint32_t nq, uint32_t nk,
                                  uint32_t p0) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= rows) return;
    uint32_t i = p0 + (uint32_t)(row % nq);
    softmax_row_upto(att + row * nk, i, nk, lane);
}

cudaError_t k_ft_softmax(cudaStream_t s, float *att, uint64_t rows, uint32_t nq,
                         uint32_t nk, uint32_t p0) {
    KLAUNCH(ft_softmax_kernel, row_blocks(rows), ROW_THREADS, 0, s, att, rows, nq, nk,
            p0);
    return cudaGetLastError();
}

__global__ void ft_softmax_bwd_kernel(const float *att, float *datt, uint64_t rows,
                                      uint32_t nq, uint32_t nk, uint32_t p0) {
    uint64_t row = (uint64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    uint32_t lane = threadIdx.x & 31;
    if (row >= rows) return;
    uint32_t i = p0 + (uint32_t)(row % nq);
    const float *p = att + row * nk;
    float *d = datt + row * nk;
    float sm = 0.0f;
    for (uint32_t j = lane; j <= i; j += 32) sm += p[j] * d[j];
    sm = warp_sum(sm);
    for (uint32_t j = lane; j < nk; j += 32) d[j] = j <= i ? p[j] * (d[j] - sm) : 0.0f;
}

cudaError_t k_ft_softmax_bwd(cudaStream_t s, const float *att, float *datt, uint64_t rows,
                             uint32_t nq, uint32_t nk, uint32_t p0) {
    KLAUNCH(ft_softmax_bwd_kernel, row_blocks(rows), ROW_THREADS, 0, s, att, datt, rows,
            nq, nk, p0);
    return cudaGetLastError();
}

/* out[r*ldo + h*D + d] = RoPE(in[r*ldi + h*D ..]) at position (p0 + r) % T. */
__global__ void ft_rope_kernel(const float *in, uint32_t ldi, float *out, uint32_t ldo,
                               uint32_t n, uint32_t heads, uint32_t D, uint64_t p0,
                               uint32_t T, const float *inv_freq, float sign) {
    uint64_t w = (uint64_t)heads * D, total = (uint64_t)n * w;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < total;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t r = i / w;
        uint32_t c = (uint32_t)(i % w), h = c / D, d = c % D;
        uint32_t pos = (uint32_t)((p0 + r) % T);
        out[r * ldo + c] =
            rope_elem(in + r * ldi + (uint64_t)h * D, d, D, pos, inv_freq, sign);
    }
}

cudaError_t k_ft_rope(cudaStream_t s, const float *in, uint32_t ldi, float *out,
                      uint32_t ldo, uint32_t n, uint32_t heads, uint32_t D, uint64_t p0,
                      uint32_t T, const float *inv_freq, float sign) {
    KLAUNCH(ft_rope_kernel, ew_blocks((uint64_t)n * heads * D), EW_THREADS, 0, s, in, ldi,
            out, ldo, n, heads, D, p0, T, inv_freq, sign);
    return cudaGetLastError();
}
