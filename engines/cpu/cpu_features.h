/*
 * cpu_features.h - what this x86-64 CPU and its OS can run, read once with
 * cpuid and xgetbv: AVX2/FMA, AVX-512 (F, BW, VL, DQ), AVX512_BF16,
 * AVX512_VNNI, AVX-VNNI and AMX (BF16, INT8), plus the name of the CPU.
 * A feature counts only when the OS saves its registers (XCR0) and, for AMX,
 * when Linux grants the tile data permission (arch_prctl
 * ARCH_REQ_XCOMP_PERM), so "has" means "can execute here".
 *
 * Threads: cpu_features_get() is safe from any thread (pthread_once).
 * Memory: the returned struct is static, never freed. Errors: none; a
 * non-x86 build reports no features.
 */
#ifndef ORCH_CPU_FEATURES_H
#define ORCH_CPU_FEATURES_H

typedef struct cpu_features {
    int avx2, fma;
    int avx512f, avx512bw, avx512vl, avx512dq;
    int avx512_bf16, avx512_vnni, avx_vnni;
    int amx_tile, amx_bf16, amx_int8; /* tile data permission granted */
    int amx_in_cpu;                   /* cpuid says AMX (even if the OS refused) */
    char brand[64];                   /* cpuid brand string, trimmed */
    char vendor[16];
    unsigned family, model;
} cpu_features;

const cpu_features *cpu_features_get(void);

/* "AVX2 FMA AVX512F ..." of the features present, into buf (always
 * NUL-terminated). Returns buf. */
char *cpu_features_list(const cpu_features *f, char *buf, unsigned cap);

/* 1 if every AVX-512 feature the engine's AVX-512 kernels use is present. */
int cpu_features_avx512(const cpu_features *f);

#endif
