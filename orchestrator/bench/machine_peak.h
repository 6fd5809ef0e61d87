/*
 * machine_peak.h - the physical arithmetic peak of this machine's cores, the
 * denominator of `orch bench`'s MFU: physical cores used x measured clock x
 * FLOPs per cycle per core of the best instruction set for each precision:
 *
 *   fp32  AVX-512 FMA  64   (2 FMA units x 16 lanes x 2)
 *         AVX2 FMA     32   (2 FMA units x 8 lanes x 2)
 *         SSE          8    (4-lane add + 4-lane mul per cycle)
 *   bf16  AMX-BF16     1024 (Intel's TMUL rate: 16x32x16 dot-product per 16 cycles x 2)
 *         AVX512_BF16  128  (vdpbf16ps: 16 lanes x 2 pairs x 2, 2 units)
 *   int8  AMX-INT8     2048 ops
 *         AVX512_VNNI  256 ops (vpdpbusd: 16 lanes x 4 x 2, 2 units)
 *         AVX_VNNI     128 ops
 * (the FMA-unit counts are assumptions: some AVX-512 parts have one unit; a
 * precision without a native path has no peak (0) here).
 *
 * The clock is measured, not read from a table: every thread runs a chain of
 * dependent integer adds (one per cycle) at once, so the figure is the
 * all-core clock under load; the best of 5 rounds counts. On non-x86 the
 * clock is 0 and so are the peaks (callers print n/a).
 *
 * Threads: machine_peak_measure starts and joins `threads` threads.
 * Memory: the result is a plain struct of static strings and numbers.
 * Errors: none (a measurement that fails leaves 0).
 */
#ifndef ORCH_MACHINE_PEAK_H
#define ORCH_MACHINE_PEAK_H

typedef struct machine_peak_path {
    const char *isa;  /* "AVX-512 FMA", "AMX-BF16", ... ; "none" */
    double per_cycle; /* FLOPs (or int8 ops) per cycle per core */
    double gflops;    /* cores x GHz x per_cycle; 0 when none */
} machine_peak_path;

typedef struct machine_peak {
    int threads;        /* threads the benchmark uses */
    int physical_cores; /* of this machine (sysfs topology) */
    int cores;          /* min(threads, physical_cores): what the peak counts */
    double ghz;         /* measured all-thread clock */
    machine_peak_path fp32, bf16, int8;
} machine_peak;

void machine_peak_measure(int threads, machine_peak *out);

/* The path of a precision word ("fp32", "bf16", "int8"); NULL if unknown. */
const machine_peak_path *machine_peak_path_of(const machine_peak *p,
                                              const char *precision);

#endif
