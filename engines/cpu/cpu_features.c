/*
 * cpu_features.c - cpuid/xgetbv feature detection (see cpu_features.h).
 * Bit positions are from Intel's SDM, volume 2, CPUID leaf 01H and 07H.
 */
#include "engines/cpu/cpu_features.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define FEAT_X86 1
#else
#define FEAT_X86 0
#endif

static cpu_features g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if FEAT_X86
static unsigned long long read_xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* Linux keeps AMX tile data off until a process asks (kernel 5.16+). */
static int request_amx_permission(void) {
    const long ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023;
    const unsigned long XFEATURE_XTILEDATA = 18;
    unsigned long bitmask = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) == 0 &&
        (bitmask & (1ul << XFEATURE_XTILEDATA)))
        return 1;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    bitmask = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) == 0 &&
           (bitmask & (1ul << XFEATURE_XTILEDATA));
}

static void trim_copy(char *dst, size_t cap, const char *src) {
    while (*src == ' ') src++;
    snprintf(dst, cap, "%s", src);
    size_t n = strlen(dst);
    while (n && dst[n - 1] == ' ') dst[--n] = '\0';
}
#endif

static void detect(void) {
    cpu_features *f = &g_features;
    memset(f, 0, sizeof *f);
    snprintf(f->brand, sizeof f->brand, "unknown CPU");
#if FEAT_X86
    unsigned a, b, c, d;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf == 0) return;
    __cpuid(0, a, b, c, d);
    memcpy(f->vendor, &b, 4);
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = '\0';
    __cpuid(1, a, b, c, d);
    f->family = (a >> 8) & 0xf;
    f->model = (a >> 4) & 0xf;
    if (f->family == 6 || f->family == 15) f->model |= ((a >> 16) & 0xf) << 4;
    if (f->family == 15) f->family += (a >> 20) & 0xff;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1;
    unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
    const int os_avx = (xcr0 & 0x6) == 0x6;
    const int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    const int os_amx = (xcr0 & 0x60000) == 0x60000;
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        unsigned dummy;
        __cpuid_count(7, 1, a71, dummy, dummy, dummy);
    }
    if (avx && os_avx) {
        f->fma = fma;
        f->avx2 = (b7 >> 5) & 1;
        f->avx_vnni = (a71 >> 4) & 1;
    }
    if (os_avx512) {
        f->avx512f = (b7 >> 16) & 1;
        f->avx512dq = (b7 >> 17) & 1;
        f->avx512bw = (b7 >> 30) & 1;
        f->avx512vl = (b7 >> 31) & 1;
        f->avx512_vnni = f->avx512f && ((c7 >> 11) & 1);
        f->avx512_bf16 = f->avx512f && ((a71 >> 5) & 1);
    }
    f->amx_in_cpu = (d7 >> 24) & 1;
    if (f->amx_in_cpu && os_amx && request_amx_permission()) {
        f->amx_tile = 1;
        f->amx_bf16 = (d7 >> 22) & 1;
        f->amx_int8 = (d7 >> 25) & 1;
    }
    if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        char brand[49];
        for (unsigned i = 0; i < 3; i++) {
            __cpuid(0x80000002u + i, a, b, c, d);
            memcpy(brand + 16 * i, &a, 4);
            memcpy(brand + 16 * i + 4, &b, 4);
            memcpy(brand + 16 * i + 8, &c, 4);
            memcpy(brand + 16 * i + 12, &d, 4);
        }
        brand[48] = '\0';
        trim_copy(f->brand, sizeof f->brand, brand);
    }
#endif
}

const cpu_features *cpu_features_get(void) {
    pthread_once(&g_once, detect);
    return &g_features;
}

int cpu_features_avx512(const cpu_features *f) {
    return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq;
}

char *cpu_features_list(const cpu_features *f, char *buf, unsigned cap) {
    static const struct {
        const char *name;
        size_t offset;
    } names[] = {
        { "AVX2", offsetof(cpu_features, avx2) },
        { "FMA", offsetof(cpu_features, fma) },
        { "AVX512F", offsetof(cpu_features, avx512f) },
        { "AVX512BW", offsetof(cpu_features, avx512bw) },
        { "AVX512VL", offsetof(cpu_features, avx512vl) },
        { "AVX512DQ", offsetof(cpu_features, avx512dq) },
        { "AVX512_BF16", offsetof(cpu_features, avx512_bf16) },
        { "AVX512_VNNI", offsetof(cpu_features, avx512_vnni) },
        { "AVX_VNNI", offsetof(cpu_features, avx_vnni) },
        { "AMX_BF16", offsetof(cpu_features, amx_bf16) },
        { "AMX_INT8", offsetof(cpu_features, amx_int8) },
    };
    size_t used = 0;
    if (cap == 0) return buf;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int on;
        memcpy(&on, (const char *)f + names[i].offset, sizeof on);
        if (!on) continue;
        int n = snprintf(buf + used, cap - used, "%s%s", used ? " " : "", names[i].name);
        if (n < 0 || (size_t)n >= cap - used) break;
        used += (size_t)n;
    }
    if (f->amx_in_cpu && !f->amx_tile && used + 40 < cap)
        snprintf(buf + used, cap - used, "%s(AMX present, OS refused tile data)",
                 used ? " " : "");
    if (!used && !f->amx_in_cpu) snprintf(buf, cap, "none beyond x86-64");
    return buf;
}
