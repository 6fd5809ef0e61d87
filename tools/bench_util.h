/*
 * bench_util.h - the small helpers the engine benchmarks in tools/ share
 * (engine_decode_bench, lora_bench, ft_stream_bench, q8_kernel_bench): parsing an unsigned
 * 32-bit argument and the median of a sample. Header-only (static inline);
 * pure functions, thread-safe; nothing allocates.
 */
#ifndef ORCH_TOOLS_BENCH_UTIL_H
#define ORCH_TOOLS_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* *out = s as a decimal uint32 (the whole string); 0, or -1 leaving *out. */
static inline int bench_parse_u32(const char *s, uint32_t *out) {
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v > 0xffffffffUL) return -1;
    *out = (uint32_t)v;
    return 0;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorts v in place); 0 for n = 0. */
static inline double bench_median(double *v, size_t n) {
    if (n == 0) return 0.0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

#endif
