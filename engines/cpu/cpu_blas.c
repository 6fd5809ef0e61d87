/*
 * cpu_blas.c - run-time loading of OpenBLAS with kernels matching the CPU
 * (see cpu_blas.h).
 */
#include "engines/cpu/cpu_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "engines/cpu/cpu_features.h"

/* CBLAS enum values (cblas.h): row-major 101, no-trans 111, trans 112. */
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);

static struct {
    int32_t status;
    char err[256];
    void *dl;
    sgemm_fn sgemm;
    char kernel[64];
    char requested[32];
    const char *choice;
} g_blas;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const char *cpu_blas_coretype_for_cpu(void) {
    const cpu_features *f = cpu_features_get();
    if (cpu_features_avx512(f)) return "SkylakeX";
    if (f->avx2 && f->fma)
        return strcmp(f->vendor, "AuthenticAMD") == 0 ? "Zen" : "Haswell";
    return "";
}

static void load_once(void) {
    g_blas.choice = "OpenBLAS's own detection";
    const char *user = getenv("OPENBLAS_CORETYPE");
    int set_env = 0;
    void *dl = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (dl) {
        g_blas.choice = "fixed by an earlier load of OpenBLAS in this process";
    } else if (user && *user) {
        snprintf(g_blas.requested, sizeof g_blas.requested, "%s", user);
        g_blas.choice = "set by the user (OPENBLAS_CORETYPE)";
    } else {
        const char *want = cpu_blas_coretype_for_cpu();
        if (*want) {
            snprintf(g_blas.requested, sizeof g_blas.requested, "%s", want);
            set_env = setenv("OPENBLAS_CORETYPE", want, 1) == 0;
            g_blas.choice = "chosen by the engine from cpuid";
        }
    }
    if (!dl) dl = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (set_env) unsetenv("OPENBLAS_CORETYPE");
    if (!dl) {
        const char *why = dlerror();
        snprintf(g_blas.err, sizeof g_blas.err,
                 "cannot load OpenBLAS (libopenblas.so.0): %s; install libopenblas0",
                 why ? why : "unknown error");
        g_blas.status = ORCH_ERR_INTERNAL;
        return;
    }
    g_blas.sgemm = (sgemm_fn)dlsym(dl, "cblas_sgemm");
    void (*set_threads)(int) = (void (*)(int))dlsym(dl, "openblas_set_num_threads");
    char *(*corename)(void) = (char *(*)(void))dlsym(dl, "openblas_get_corename");
    if (!g_blas.sgemm || !set_threads) {
        snprintf(g_blas.err, sizeof g_blas.err,
                 "libopenblas.so.0 has no cblas_sgemm/openblas_set_num_threads");
        g_blas.status = ORCH_ERR_INTERNAL;
        dlclose(dl);
        return;
    }
    set_threads(1);
    const char *name = corename ? corename() : NULL;
    snprintf(g_blas.kernel, sizeof g_blas.kernel, "%s", name ? name : "unknown");
    g_blas.dl = dl;
    g_blas.status = ORCH_OK;
}

int32_t cpu_blas_load(char *err, size_t err_cap) {
    pthread_once(&g_once, load_once);
    if (g_blas.status != ORCH_OK && err && err_cap)
        snprintf(err, err_cap, "%s", g_blas.err);
    return g_blas.status;
}

void cpu_blas_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
                    const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    g_blas.sgemm(101, trans_a ? 112 : 111, trans_b ? 112 : 111, M, N, K, alpha, A, lda, B,
                 ldb, beta, C, ldc);
}

const char *cpu_blas_kernel(void) {
    return g_blas.kernel[0] ? g_blas.kernel : "not loaded";
}
const char *cpu_blas_requested(void) { return g_blas.requested; }
const char *cpu_blas_choice(void) { return g_blas.choice ? g_blas.choice : "not loaded"; }
