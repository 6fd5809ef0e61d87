/*
 * machine_peak.c - measured clock x FLOPs per cycle (see machine_peak.h).
 * Feature bits: Intel SDM vol. 2, CPUID leaf 07H; XCR0 says whether the OS
 * saves the AVX-512 and AMX state.
 */
#include "orchestrator/bench/machine_peak.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/core/util.h"

#if defined(__x86_64__)
#include <cpuid.h>
#define PEAK_X86 1
#else
#define PEAK_X86 0
#endif

typedef struct isa_bits {
    int avx2_fma, avx512f, avx512_bf16, avx512_vnni, avx_vnni, amx_bf16, amx_int8;
} isa_bits;

static isa_bits read_isa(void) {
    isa_bits b;
    memset(&b, 0, sizeof b);
#if PEAK_X86
    unsigned a, bx, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return b;
    __cpuid(1, a, bx, c, d);
    if (!((c >> 27) & 1)) return b; /* no OSXSAVE: no AVX state */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const uint64_t xcr0 = ((uint64_t)hi << 32) | lo;
    const int os_avx = (xcr0 & 0x6) == 0x6, os_512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    const int os_amx = (xcr0 & 0x60000) == 0x60000;
    const int fma = (c >> 12) & 1;
    unsigned b7, c7, d7, a71, dummy;
    __cpuid_count(7, 0, a, b7, c7, d7);
    __cpuid_count(7, 1, a71, dummy, dummy, dummy);
    b.avx2_fma = os_avx && fma && ((b7 >> 5) & 1);
    b.avx_vnni = os_avx && ((a71 >> 4) & 1);
    b.avx512f = os_512 && ((b7 >> 16) & 1);
    b.avx512_vnni = b.avx512f && ((c7 >> 11) & 1);
    b.avx512_bf16 = b.avx512f && ((a71 >> 5) & 1);
    b.amx_bf16 = os_amx && ((d7 >> 22) & 1);
    b.amx_int8 = os_amx && ((d7 >> 25) & 1);
#endif
    return b;
}

/* Distinct thread-sibling sets among the online CPUs = physical cores. */
static int physical_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) return 1;
    char seen[64][64];
    int count = 0;
    for (long cpu = 0; cpu < n && cpu < 4096; cpu++) {
        char path[128], sib[64] = "";
        snprintf(path, sizeof path,
                 "/sys/devices/system/cpu/cpu%ld/topology/thread_siblings_list", cpu);
        FILE *f = fopen(path, "r");
        if (!f) return (int)n;
        if (!fgets(sib, sizeof sib, f)) sib[0] = '\0';
        fclose(f);
        int dup = 0;
        for (int k = 0; k < count && k < 64; k++)
            if (strcmp(seen[k], sib) == 0) dup = 1;
        if (!dup) {
            if (count < 64) snprintf(seen[count], sizeof seen[count], "%s", sib);
            count++;
        }
    }
    return count > 0 ? count : (int)n;
}

/* ---- clock: a chain of dependent adds, one per cycle ---- */

#define CLOCK_ITERS 20000000ull /* x 8 adds: ~60 ms at 2.5 GHz */

typedef struct clock_run {
    pthread_barrier_t bar;
    double ghz[256];
} clock_run;

static double add_chain_ghz(void) {
#if PEAK_X86
    /* Register-register adds: recent cores fold chains of add-immediate in
     * the renamer (more than one per cycle), never a register operand. */
    uint64_t x = 0, one = 1, n = CLOCK_ITERS;
    double t0 = util_now();
    __asm__ volatile("1:\n\t"
                     "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
                     "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
                     "dec %1\n\tjnz 1b"
                     : "+r"(x), "+r"(n)
                     : "r"(one)
                     : "cc");
    double dt = util_now() - t0;
    return dt > 0 && x == 8 * CLOCK_ITERS ? 8.0 * (double)CLOCK_ITERS / dt / 1e9 : 0.0;
#else
    return 0.0;
#endif
}

typedef struct clock_arg {
    clock_run *run;
    int tid;
} clock_arg;

static void *clock_main(void *p) {
    clock_arg *a = p;
    double best = 0.0;
    for (int round = 0; round < 5; round++) {
        pthread_barrier_wait(&a->run->bar);
        double g = add_chain_ghz();
        if (g > best) best = g;
    }
    a->run->ghz[a->tid] = best;
    return NULL;
}

static double measure_ghz(int threads) {
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    clock_run run;
    memset(&run, 0, sizeof run);
    pthread_barrier_init(&run.bar, NULL, (unsigned)threads);
    pthread_t th[256];
    clock_arg args[256];
    int started = 1;
    for (int t = 1; t < threads; t++) {
        args[t] = (clock_arg){ &run, t };
        if (pthread_create(&th[t], NULL, clock_main, &args[t]) != 0) break;
        started++;
    }
    if (started != threads) { /* the barrier would never open: measure alone */
        pthread_barrier_destroy(&run.bar);
        pthread_barrier_init(&run.bar, NULL, 1);
        for (int t = 1; t < started; t++) pthread_join(th[t], NULL);
        started = 1;
    }
    args[0] = (clock_arg){ &run, 0 };
    clock_main(&args[0]);
    for (int t = 1; t < started; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&run.bar);
    /* The slowest thread bounds a parallel product: report the minimum. */
    double ghz = run.ghz[0];
    for (int t = 1; t < started; t++)
        if (run.ghz[t] < ghz) ghz = run.ghz[t];
    return ghz;
}

static void set_path(machine_peak_path *p, const char *isa, double per_cycle,
                     const machine_peak *m) {
    p->isa = isa;
    p->per_cycle = per_cycle;
    p->gflops = per_cycle > 0 ? m->cores * m->ghz * per_cycle : 0.0;
}

void machine_peak_measure(int threads, machine_peak *out) {
    memset(out, 0, sizeof *out);
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    out->threads = threads;
    out->physical_cores = physical_cores();
    out->cores = threads < out->physical_cores ? threads : out->physical_cores;
    out->ghz = measure_ghz(threads);
    const isa_bits b = read_isa();
    if (b.avx512f)
        set_path(&out->fp32, "AVX-512 FMA", 64, out);
    else if (b.avx2_fma)
        set_path(&out->fp32, "AVX2 FMA", 32, out);
    else
        set_path(&out->fp32, "SSE", 8, out);
    if (b.amx_bf16)
        set_path(&out->bf16, "AMX-BF16", 1024, out);
    else if (b.avx512_bf16)
        set_path(&out->bf16, "AVX512_BF16", 128, out);
    else
        set_path(&out->bf16, "none", 0, out);
    if (b.amx_int8)
        set_path(&out->int8, "AMX-INT8", 2048, out);
    else if (b.avx512_vnni)
        set_path(&out->int8, "AVX512_VNNI", 256, out);
    else if (b.avx_vnni)
        set_path(&out->int8, "AVX_VNNI", 128, out);
    else
        set_path(&out->int8, "none", 0, out);
}

const machine_peak_path *machine_peak_path_of(const machine_peak *p,
                                              const char *precision) {
    if (!precision) return NULL;
    if (strcmp(precision, "fp32") == 0) return &p->fp32;
    if (strcmp(precision, "bf16") == 0) return &p->bf16;
    if (strcmp(precision, "int8") == 0) return &p->int8;
    return NULL;
}
