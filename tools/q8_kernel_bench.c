/*
 * q8_kernel_bench.c - the CPU engine's int8 (Q8_0-like) product kernels on
 * one thread: nanoseconds per 576-byte weight block (16 columns x 32 k of
 * int8 plus 16 fp32 scales) and the weight bytes streamed per second, for
 * each kernel this CPU can run, for 1, 4 and 16 activation rows, and for a
 * weight matrix that fits L2, one that fits a large L3 and one that must
 * come from DRAM; next to them the same thread's plain streaming read of
 * the DRAM-sized buffer with vector loads (the per-core read bound).
 *
 * Why: decoding 16 sequences with weights=int8 runs the AMX kernel (one
 * tdpbssd per 32-deep block, each block's int32 tile scaled into fp32),
 * one sequence the AVX512-VNNI one; this tells how much of the difference
 * is arithmetic and how much is the weight stream. The engine is compiled
 * in (its kernels are not exported by libengine_cpu.so).
 *
 *   build/tools/q8_kernel_bench [--rows 1,4,16] [--dram-mb 256] [--reps N]
 *                               [--kernel NAME] [--json]
 *
 * Every kernel but the portable one by default (--kernel picks one).
 * Exit status: 0 done, 2 bad usage or out of memory.
 */
#define CPU_QUANT_KERNELS_ONLY 1
#include "engines/cpu/cpu_features.c"
#include "engines/cpu/cpu_kernels.c"
#include "engines/cpu/cpu_quant.c"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/bench_util.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(FILE *o) {
    fprintf(o, "usage: q8_kernel_bench [--rows 1,4,16] [--dram-mb 256] [--reps N]\n"
               "                       [--kernel generic|avx2|avxvnni|avx512vnni|amx] "
               "[--json]\n"
               "One thread: ns per 576-byte int8 weight block and weight GB/s of each "
               "int8 kernel\nfor an L2-, an L3- and a DRAM-sized [N x 768] matrix, and "
               "the thread's\nstreaming read of the DRAM-sized buffer.\n");
}

/* The fastest of reps runs of one product, in seconds. */
static double time_product(int kernel, int M, size_t N, size_t K, const uint8_t *xq,
                           const uint8_t *wp, float *y, int reps) {
    const size_t np = (N + CPU_PANEL - 1) / CPU_PANEL;
    cpu_q8_matmul(kernel, M, N, K, xq, wp, NULL, y, N, 0, 0, np); /* warm */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t = now_s();
        cpu_q8_matmul(kernel, M, N, K, xq, wp, NULL, y, N, 0, 0, np);
        const double d = now_s() - t;
        if (d < best) best = d;
    }
    return best;
}

#if defined(__x86_64__)
#include <immintrin.h>
/* Four 32-byte loads a round, xor-folded (AVX2). */
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a,
                             _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        b = _mm256_xor_si256(
            b, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        c = _mm256_xor_si256(
            c, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        d = _mm256_xor_si256(
            d, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}
#endif

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    uint64_t a = 0, b = 0;
    const uint64_t *q = (const uint64_t *)(const void *)p;
    for (size_t i = 0; i + 2 <= n / 8; i += 2) {
        a ^= q[i];
        b ^= q[i + 1];
    }
    return a ^ b;
}

/* Bytes per second of a vector read of n bytes (p 64-byte aligned; best of
 * reps). */
static double stream_read(const cpu_features *f, const uint8_t *p, size_t n, int reps,
                          uint64_t *sink) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t = now_s();
#if defined(__x86_64__)
        *sink ^= f->avx2 ? read_avx2(p, n) : read_scalar(p, n);
#else
        (void)f;
        *sink ^= read_scalar(p, n);
#endif
        const double dt = now_s() - t;
        if (dt < best) best = dt;
    }
    return (double)n / best;
}

/* *out = v when it is a decimal in [lo, hi]; else a message and -1. */
static int parse_in(const char *v, const char *flag, uint32_t lo, uint32_t hi,
                    uint32_t *out) {
    uint32_t x;
    if (bench_parse_u32(v, &x) < 0 || x < lo || x > hi) {
        fprintf(stderr, "q8_kernel_bench: %s must be %u..%u\n", flag, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int main(int argc, char **argv) {
    uint32_t u;
    int rows[8] = { 1, 4, 16 }, n_rows = 3, reps = 0, json = 0, only = -1;
    size_t dram_mb = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--rows") && v) {
            n_rows = 0;
            for (const char *s = v; *s && n_rows < 8;) {
                char *end;
                long r = strtol(s, &end, 10);
                if (end == s || r < 1 || r > 64) {
                    fprintf(stderr,
                            "q8_kernel_bench: --rows: %s is not a list of 1..64\n", v);
                    return 2;
                }
                rows[n_rows++] = (int)r;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') {
                    fprintf(stderr,
                            "q8_kernel_bench: --rows: %s is not a list of 1..64\n", v);
                    return 2;
                }
            }
            i++;
        } else if (!strcmp(a, "--dram-mb") && v) {
            if (parse_in(v, "--dram-mb", 16, 16384, &u) < 0) return 2;
            dram_mb = u;
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            if (parse_in(v, "--reps", 1, 100000, &u) < 0) return 2;
            reps = (int)u;
            i++;
        } else if (!strcmp(a, "--kernel") && v) {
            for (int k = 0; k < CPU_Q8_KERNELS; k++)
                if (!strcmp(v, cpu_q8_kernel_name(k))) only = k;
            if (only < 0) {
                fprintf(stderr, "q8_kernel_bench: unknown kernel %s\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "q8_kernel_bench: unknown or incomplete argument %s\n", a);
            usage(stderr);
            return 2;
        }
    }

    const cpu_features *f = cpu_features_get();
    const size_t K = 768;
    const size_t dram_n = (dram_mb << 20) / (K + K / 8) / CPU_PANEL * CPU_PANEL;
    const struct {
        const char *name;
        size_t N;
        int reps;
    } sizes[3] = { { "l2", 256, 2000 }, { "l3", 3072, 200 }, { "dram", dram_n, 6 } };
    float *w = malloc(dram_n * K * sizeof(float));
    uint8_t *wp = aligned_alloc(64, (cpu_q8_packed_bytes(dram_n, K) + 63) / 64 * 64);
    float *x = malloc(64 * K * sizeof(float));
    uint8_t *xq = aligned_alloc(64, (cpu_q8_act_bytes(64, K) + 63) / 64 * 64);
    float *y = malloc(64 * dram_n * sizeof(float));
    if (!w || !wp || !x || !xq || !y) {
        fprintf(stderr, "q8_kernel_bench: out of memory for a %zu MB matrix\n", dram_mb);
        return 2;
    }
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < dram_n * K; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        w[i] = (float)(s >> 40) / 16777216.0f - 0.5f;
    }
    for (size_t i = 0; i < 64 * K; i++) x[i] = (float)(i % 77) / 77.0f - 0.4f;
    cpu_q8_pack_panels(dram_n, K, w, wp, 0, (dram_n + CPU_PANEL - 1) / CPU_PANEL);
    free(w);

    uint64_t sink = 0;
    const double read_bps = stream_read(f, wp, cpu_q8_packed_bytes(dram_n, K), 3, &sink);
    if (!json)
        printf("CPU: %s, one thread; K = %zu; DRAM matrix %zu x %zu (%.0f MB packed)\n"
               "streaming read of it: %.1f GB/s\n"
               "%-11s %5s %5s %10s %8s\n",
               f->brand, K, dram_n, K, cpu_q8_packed_bytes(dram_n, K) / 1e6,
               read_bps / 1e9, "kernel", "rows", "size", "ns/block", "GB/s");
    else
        printf("{\"bench\":\"q8_kernel\",\"cpu\":\"%s\",\"stream_read_gb_per_s\":%.2f}\n",
               f->brand, read_bps / 1e9);
    for (int k = 0; k < CPU_Q8_KERNELS; k++) {
        /* The portable kernel only when asked for: it takes minutes. */
        if (only >= 0 ? k != only : k == CPU_Q8_GENERIC) continue;
        char why[256];
        if (cpu_q8_select(CPU_ISA_AVX512, k, why, sizeof why) < 0) {
            if (!json) printf("%-11s skipped: %s\n", cpu_q8_kernel_name(k), why);
            continue;
        }
        for (int r = 0; r < n_rows; r++) {
            const int M = rows[r];
            cpu_q8_quantize_act(k, (size_t)M, K, x, K, xq);
            for (int z = 0; z < 3; z++) {
                const size_t N = sizes[z].N;
                const int rp = reps ? reps : sizes[z].reps;
                const double t = time_product(k, M, N, K, xq, wp, y, rp);
                const double blocks =
                    (double)((N + CPU_PANEL - 1) / CPU_PANEL) * (double)cpu_q8_blocks(K);
                const double ns = t * 1e9 / blocks;
                const double gbs = (double)cpu_q8_packed_bytes(N, K) / t / 1e9;
                if (json)
                    printf("{\"kernel\":\"%s\",\"rows\":%d,\"size\":\"%s\",\"n\":%zu,"
                           "\"ns_per_block\":%.2f,\"gb_per_s\":%.2f}\n",
                           cpu_q8_kernel_name(k), M, sizes[z].name, N, ns, gbs);
                else
                    printf("%-11s %5d %5s %10.1f %8.1f\n", cpu_q8_kernel_name(k), M,
                           sizes[z].name, ns, gbs);
            }
        }
    }
    free(wp);
    free(x);
    free(xq);
    free(y);
    volatile uint64_t keep = sink; /* the read must not be optimised away */
    (void)keep;
    return 0;
}
