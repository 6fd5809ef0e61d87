/*
 * cuda_engine.cu - the orch engine ABI for NVIDIA GPUs (libengine_cuda.so):
 * function table, probe, context life cycle, options, the tensor table (GPT-2
 * or LLaMA, ABI 1.1), the KV pool (K/V rows of kv_heads*head_size floats) and
 * the public entry points. The numeric work lives in cuda_model.cu and
 * cuda_llama.cu (passes) and cuda_kernels.cu (kernels); LoRA adapters (ABI
 * 1.4, ORCH_CAP_LORA: training with the base frozen, adapter_id in
 * infer_forward) in cuda_lora.cu; coserve_forward (ABI 1.4,
 * ORCH_CAP_COSERVE: an inference batch and fine-tuning micro-batches in one
 * pass over the base weights) in cuda_coserve.cu; token-level fine-tuning
 * streams (ABI 1.5, ORCH_CAP_FT_STREAM: ft_stream_open / ft_stream_close /
 * coserve_step; GPT-2 and LLaMA) in cuda_ft_stream.cu. While a stream is open its adapter is locked:
 * adapter_tensor_write of PARAM, adapter_optimizer_step and adapter_destroy
 * return ORCH_ERR_STATE, as the CPU engine does.
 *
 * Semantics mirror the CPU engine: the same tensor names, shapes, order and
 * flags (NO_DECAY on 1-D tensors: biases and norm weights), the flat gradient
 * buffer is the concatenation of the tensors in table order, the same KV block
 * semantics and the same input checks with the same messages: the model
 * rules, the options parser, the status strings and every argument check are
 * engines/common's (engine_common.h, engine_checks.h). Parameters, gradients
 * and both AdamW moments are fp32 on the device, each one cudaMalloc with
 * views at the table offsets, so tensor and gradient transfers are single
 * copies.
 *
 * Options ("key=value" separated by ',' or ';'):
 *   math=fp32|tf32|bf16   matrix-product precision (default fp32): tf32 and
 *                         bf16 use cuBLAS's CUBLAS_COMPUTE_32F_FAST_TF32 /
 *                         _FAST_16BF on fp32 storage; everything else is fp32
 *                         (both architectures)
 *   device=N              CUDA device ordinal 0..1024 (default 0)
 * The `threads` option of the ABI has no meaning here and is ignored.
 *
 * Errors: every CUDA/cuBLAS failure becomes a status with the CUDA error text
 * in last_error; out of device memory is ORCH_ERR_OUT_OF_MEMORY and leaves the
 * context usable; other device failures mark the context broken (later calls
 * return ORCH_ERR_DEVICE). Nothing here exits, aborts or prints.
 *
 * Threads: one context per thread at a time (ABI rule); every entry point
 * selects the context's device first, so contexts on different devices can
 * be driven from different threads. probe/status_string are thread-safe.
 */
#include "engines/cuda/cuda_internal.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU_STR2(x)        #x
#define CU_STR(x)         CU_STR2(x)
#define CU_ENGINE_VERSION "1.1.0 (CUDA runtime " CU_STR(CUDART_VERSION) ", cuBLAS)"

/* Sizes beyond these are refused up front (int arguments of cuBLAS, 32-bit
 * grid dimensions and index arrays); CU_MAX_TOKENS is cuda_internal.h's. */
#define CU_MAX_DIM        (1u << 24)
#define CU_MAX_BLOCK_SIZE (1u << 20)
#define CU_BLAS_WORKSPACE (32u << 20)

/* ------------------------------------------------------------------------- */
/* Errors                                                                     */
/* ------------------------------------------------------------------------- */

int32_t cu_cuda_error(orch_engine_ctx *ctx, cudaError_t e, const char *what) {
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it */
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "out of device memory in %s: %s",
                            what, cudaGetErrorString(e));
    }
    ctx->broken = 1;
    return cu_set_error(ctx, ORCH_ERR_DEVICE, "CUDA error in %s: %s (%s)", what,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

int32_t cu_blas_error(orch_engine_ctx *ctx, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "out of device memory in %s: %s",
                            what, cublasGetStatusString(s));
    if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_ARCH_MISMATCH)
        return cu_set_error(ctx, ORCH_ERR_UNSUPPORTED, "cuBLAS error in %s: %s", what,
                            cublasGetStatusString(s));
    if (s == CUBLAS_STATUS_INVALID_VALUE)
        return cu_set_error(ctx, ORCH_ERR_INTERNAL, "cuBLAS error in %s: %s", what,
                            cublasGetStatusString(s));
    ctx->broken = 1;
    return cu_set_error(ctx, ORCH_ERR_DEVICE, "cuBLAS error in %s: %s", what,
                        cublasGetStatusString(s));
}

/* Common prologue of every context entry point. */
static int32_t enter(orch_engine_ctx *ctx) {
    if (ctx->broken)
        return cu_set_error(ctx, ORCH_ERR_DEVICE,
                            "this context hit a CUDA device error earlier and "
                            "cannot be used (destroy it)");
    cudaError_t e = cudaSetDevice(ctx->device);
    if (e != cudaSuccess) return cu_cuda_error(ctx, e, "cudaSetDevice");
    return ORCH_OK;
}

#define ENTER(ctx)                                    \
    do {                                              \
        if (!(ctx)) return ORCH_ERR_INVALID_ARGUMENT; \
        int32_t en_st_ = enter(ctx);                  \
        if (en_st_ != ORCH_OK) return en_st_;         \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Probe                                                                      */
/* ------------------------------------------------------------------------- */

/* probe() must not initialise CUDA in the calling process: CUDA does not
 * survive fork(), and callers (the conformance suite, `orch serve` workers)
 * probe in a parent and work in children. So it asks the driver through
 * NVML (libnvidia-ml.so.1, part of every NVIDIA driver), loaded with dlopen:
 * device count, names, compute capability, memory, and the CUDA version the
 * driver supports. The CUDA emulator of tests/cuda_emu has no NVML and goes
 * through its runtime instead. */

#ifndef ORCH_CUDA_EMU
/* The few NVML entry points used (stable C ABI of the NVIDIA driver). */
typedef struct cu_nvml_device *cu_nvml_device_t;
typedef struct cu_nvml_memory {
    unsigned long long total, free, used;
} cu_nvml_memory;
typedef int (*nvml_void_fn)(void);
typedef int (*nvml_count_fn)(unsigned int *);
typedef int (*nvml_handle_fn)(unsigned int, cu_nvml_device_t *);
typedef int (*nvml_name_fn)(cu_nvml_device_t, char *, unsigned int);
typedef int (*nvml_cc_fn)(cu_nvml_device_t, int *, int *);
typedef int (*nvml_mem_fn)(cu_nvml_device_t, cu_nvml_memory *);
typedef int (*nvml_drv_fn)(int *);
typedef const char *(*nvml_err_fn)(int);

#define CU_NEED_CC_MAJOR 9 /* sm_90 code + compute_90 PTX in this library */

static void *nvml_sym(void *h, const char *a, const char *b) {
    void *f = dlsym(h, a);
    return f || !b ? f : dlsym(h, b);
}

static int32_t probe_nvml(char *buf, size_t cap) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && (vis[0] == '\0' || vis[0] == '-')) {
        snprintf(buf, cap, "no CUDA device (CUDA_VISIBLE_DEVICES='%.32s' hides them all)",
                 vis);
        return ORCH_ERR_DEVICE;
    }
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(buf, cap,
                 "no CUDA device (no NVIDIA driver here: libnvidia-ml.so.1 "
                 "cannot be loaded)");
        return ORCH_ERR_DEVICE;
    }
    /* the handle stays open: dlopen is reference counted, and unloading a
     * driver library under a live process buys nothing */
    nvml_void_fn init = (nvml_void_fn)nvml_sym(h, "nvmlInit_v2", "nvmlInit");
    nvml_void_fn shutdown = (nvml_void_fn)nvml_sym(h, "nvmlShutdown", NULL);
    nvml_count_fn count =
        (nvml_count_fn)nvml_sym(h, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    nvml_handle_fn handle = (nvml_handle_fn)nvml_sym(h, "nvmlDeviceGetHandleByIndex_v2",
                                                     "nvmlDeviceGetHandleByIndex");
    nvml_name_fn name = (nvml_name_fn)nvml_sym(h, "nvmlDeviceGetName", NULL);
    nvml_cc_fn cc = (nvml_cc_fn)nvml_sym(h, "nvmlDeviceGetCudaComputeCapability", NULL);
    nvml_mem_fn mem = (nvml_mem_fn)nvml_sym(h, "nvmlDeviceGetMemoryInfo", NULL);
    nvml_drv_fn drv = (nvml_drv_fn)nvml_sym(h, "nvmlSystemGetCudaDriverVersion_v2",
                                            "nvmlSystemGetCudaDriverVersion");
    nvml_err_fn errstr = (nvml_err_fn)nvml_sym(h, "nvmlErrorString", NULL);
    if (!init || !shutdown || !count || !handle || !name || !cc) {
        snprintf(buf, cap,
                 "no CUDA device (the NVIDIA driver library lacks the NVML calls "
                 "this engine uses)");
        return ORCH_ERR_DEVICE;
    }
    int r = init();
    if (r != 0) {
        snprintf(buf, cap, "no CUDA device (NVML: %s)",
                 errstr ? errstr(r) : "init failed");
        return ORCH_ERR_DEVICE;
    }
    int32_t st = ORCH_OK;
    unsigned int n = 0;
    int dv = 0;
    r = count(&n);
    if (r != 0 || n == 0) {
        snprintf(buf, cap, "no CUDA device (the NVIDIA driver reports %s)",
                 r != 0 ? (errstr ? errstr(r) : "an error") : "none");
        st = ORCH_ERR_DEVICE;
    } else if (drv && drv(&dv) == 0 && dv / 1000 < CUDART_VERSION / 1000) {
        snprintf(buf, cap,
                 "no usable CUDA device: the NVIDIA driver supports CUDA %d.%d, "
                 "this build needs %d.x",
                 dv / 1000, (dv % 1000) / 10, CUDART_VERSION / 1000);
        st = ORCH_ERR_UNSUPPORTED;
    } else {
        int usable = -1, first_major = 0, first_minor = 0;
        char first_name[96] = "?", use_name[96] = "?";
        unsigned long long use_mem = 0;
        for (unsigned int i = 0; i < n; i++) {
            cu_nvml_device_t d;
            int ma = 0, mi = 0;
            char nm[96] = "?";
            if (handle(i, &d) != 0 || cc(d, &ma, &mi) != 0) continue;
            (void)name(d, nm, sizeof nm);
            nm[sizeof nm - 1] = '\0';
            if (i == 0) {
                first_major = ma;
                first_minor = mi;
                snprintf(first_name, sizeof first_name, "%s", nm);
            }
            if (ma >= CU_NEED_CC_MAJOR && usable < 0) {
                usable = (int)i;
                snprintf(use_name, sizeof use_name, "%s", nm);
                cu_nvml_memory m;
                if (mem && mem(d, &m) == 0) use_mem = m.total;
            }
        }
        if (usable < 0) {
            snprintf(buf, cap,
                     "no usable CUDA device: %s has compute capability %d.%d; "
                     "this build needs %d.0 or newer",
                     first_name, first_major, first_minor, CU_NEED_CC_MAJOR);
            st = ORCH_ERR_UNSUPPORTED;
        } else {
            snprintf(buf, cap, "%u CUDA device%s; device %d: %s, %.0f GiB", n,
                     n == 1 ? "" : "s", usable, use_name,
                     (double)use_mem / (1024.0 * 1024.0 * 1024.0));
        }
    }
    (void)shutdown();
    return st;
}

#else
/* The emulator: ask its runtime. */
static int32_t probe_runtime(char *buf, size_t cap) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        snprintf(buf, cap, "no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none");
        return ORCH_ERR_DEVICE;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(buf, cap, "no CUDA device (cannot read its properties)");
        return ORCH_ERR_DEVICE;
    }
    snprintf(buf, cap, "%d CUDA device%s; device 0: %.96s, sm_%d%d", n, n == 1 ? "" : "s",
             p.name, p.major, p.minor);
    return ORCH_OK;
}
#endif

static int32_t probe(char *msg, uint32_t msg_cap) {
    char buf[512];
#ifdef ORCH_CUDA_EMU
    int32_t st = probe_runtime(buf, sizeof buf);
#else
    int32_t st = probe_nvml(buf, sizeof buf);
#endif
    if (msg && msg_cap) snprintf(msg, msg_cap, "%s", buf);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Options and model description                                              */
/* ------------------------------------------------------------------------- */

/* The keys of the options string (engines/common parses it); math's words
 * are in cu_math order. */
enum { OPT_MATH, OPT_DEVICE, OPT_COUNT };
static const engine_opt_spec cu_opt_spec[OPT_COUNT] = {
    { "math", "fp32|tf32|bf16", 0, 0 },
    { "device", NULL, 0, 1024 },
};

/* What this engine accepts (int arguments of cuBLAS, 32-bit grids, the
 * paged-attention scores in shared memory). */
static const engine_model_limits cu_limits = { "cuda", CU_MAX_DIM, CU_MAX_DIM / 16,
                                               4096,   65536,      4u * 65536,
                                               1 };

/* ------------------------------------------------------------------------- */
/* Tensor table                                                               */
/* ------------------------------------------------------------------------- */

static_assert(CU_PER_LAYER == ENGINE_GPT2_PER_LAYER, "CU_* follow the common table");
static_assert(CL_PER_LAYER == ENGINE_LLAMA_PER_LAYER, "CL_* follow the common table");

/* The table of the normalised model md (GPT-2 or LLaMA, engines/common). */
static int32_t build_table(orch_engine_ctx *ctx, const orch_model_desc *md) {
    uint32_t count = engine_model_tensor_count(md);
    ctx->tensors = (cu_tensor *)calloc(count, sizeof(cu_tensor));
    if (!ctx->tensors)
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "out of host memory");
    ctx->n_params = engine_model_table_fill(ctx->tensors, md);
    ctx->n_tensors = count;
    ctx->sh_off = 0;
    ctx->sh_count = ctx->n_params;
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Context life cycle                                                         */
/* ------------------------------------------------------------------------- */

/* Keep this library (and with it the CUDA runtime and cuBLAS) mapped for the
 * life of the process once a context has used the GPU: unloading the CUDA
 * runtime while its driver state lives on is not something we want to test
 * our luck with. */
static void pin_library(void) {
    static int pinned = 0;
    if (__atomic_exchange_n(&pinned, 1, __ATOMIC_SEQ_CST)) return;
    Dl_info info;
    if (dladdr((void *)&pin_library, &info) && info.dli_fname)
        (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

static void context_destroy(orch_engine_ctx *ctx) {
    if (!ctx) return;
    (void)cudaSetDevice(ctx->device);
    if (ctx->stream) (void)cudaStreamSynchronize(ctx->stream);
    cu_ft_free_all(ctx);
    cu_lora_free_all(ctx);
    cu_acts_free(ctx);
    cu_infer_free(ctx);
    if (ctx->d_kv) cudaFree(ctx->d_kv);
    if (ctx->d_params) cudaFree(ctx->d_params);
    if (ctx->d_mom) cudaFree(ctx->d_mom);
    if (ctx->d_inv_freq) cudaFree(ctx->d_inv_freq);
    if (ctx->d_red) cudaFree(ctx->d_red);
    if (ctx->h_red) cudaFreeHost(ctx->h_red);
    if (ctx->h_stage) cudaFreeHost(ctx->h_stage);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->blas_ws) cudaFree(ctx->blas_ws);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError();
    free(ctx->h_kv_marks);
    free(ctx->h_kv_written);
    free(ctx->h_tok_map);
    free(ctx->tensors);
    free(ctx);
}

/* Floats from d_m to d_v in a moment allocation of count elements each. */
static uint64_t mom_stride(uint64_t count) { return (count + 63) & ~(uint64_t)63; }

/* A zeroed device allocation for the m and v of count elements. */
static int32_t mom_alloc(orch_engine_ctx *ctx, uint64_t count, float **out) {
    size_t bytes = 2 * (size_t)mom_stride(count) * sizeof(float);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "out of device memory: AdamW moments need %.1f MiB",
                                (double)bytes / (1024.0 * 1024.0));
        }
        return cu_cuda_error(ctx, e, "cudaMalloc(moments)");
    }
    e = cudaMemsetAsync(p, 0, bytes, ctx->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return cu_cuda_error(ctx, e, "cudaMemset(moments)");
    }
    *out = (float *)p;
    return ORCH_OK;
}

static int32_t create_device_state(orch_engine_ctx *ctx, const orch_model_desc *md,
                                   uint64_t seed) {
    CU_CHECK(ctx, cudaSetDevice(ctx->device));
    CU_CHECK(ctx, cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    CU_BLAS(ctx, cublasCreate(&ctx->blas));
    CU_BLAS(ctx, cublasSetStream(ctx->blas, ctx->stream));
    CU_BLAS(ctx, cublasSetPointerMode(ctx->blas, CUBLAS_POINTER_MODE_HOST));
    CU_BLAS(ctx, cublasSetMathMode(ctx->blas, CUBLAS_DEFAULT_MATH));
    /* An explicit workspace keeps cuBLAS from allocating inside steps and
     * keeps its results reproducible on one stream. */
    ctx->blas_ws_bytes = CU_BLAS_WORKSPACE;
    CU_CHECK(ctx, cudaMalloc(&ctx->blas_ws, ctx->blas_ws_bytes));
    CU_BLAS(ctx, cublasSetWorkspace(ctx->blas, ctx->blas_ws, ctx->blas_ws_bytes));
    switch (ctx->math) {
    case CU_MATH_TF32: ctx->compute = CUBLAS_COMPUTE_32F_FAST_TF32; break;
    case CU_MATH_BF16: ctx->compute = CUBLAS_COMPUTE_32F_FAST_16BF; break;
    default: ctx->compute = CUBLAS_COMPUTE_32F; break;
    }

    /* parameters and gradients: one allocation, two views; the moments
     * (m, v) another (mom_alloc), so a shard can replace them */
    size_t bytes = (size_t)ctx->n_params * sizeof(float);
    size_t stride = (bytes + 255) & ~(size_t)255;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 2 * stride);
    if (e != cudaSuccess) {
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "out of device memory: parameters, gradients and "
                                "AdamW moments need %.1f MiB",
                                4.0 * (double)stride / (1024.0 * 1024.0));
        }
        return cu_cuda_error(ctx, e, "cudaMalloc(parameters)");
    }
    ctx->d_params = (float *)p;
    ctx->d_grads = (float *)((char *)p + stride);
    float *mom = NULL;
    CU_TRY(mom_alloc(ctx, ctx->sh_count, &mom));
    ctx->d_mom = mom;
    ctx->d_m = mom;
    ctx->d_v = mom + mom_stride(ctx->sh_count);

    CU_CHECK(ctx, cudaMalloc(&p, (CU_NORM_BLOCKS + 1) * sizeof(double) + 64));
    ctx->d_red = (double *)p;
    ctx->d_norm = (float *)(ctx->d_red + CU_NORM_BLOCKS + 1);
    CU_CHECK(ctx, cudaMallocHost(&p, 64));
    ctx->h_red = (double *)p;
    ctx->h_norm = (float *)(ctx->h_red + 1);

    /* llama: the RoPE frequencies of engines/common (the same floats as every
     * engine), computed on the host once */
    if (ctx->arch == ORCH_ARCH_LLAMA) {
        const uint32_t half = ctx->hs / 2;
        float *f = (float *)malloc((size_t)half * sizeof(float));
        if (!f) return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "out of host memory");
        engine_rope_inv_freq(md, f);
        cudaError_t fe = cudaMalloc(&p, (size_t)half * sizeof(float));
        if (fe == cudaSuccess) {
            ctx->d_inv_freq = (float *)p;
            fe = cudaMemcpyAsync(ctx->d_inv_freq, f, (size_t)half * sizeof(float),
                                 cudaMemcpyHostToDevice, ctx->stream);
            if (fe == cudaSuccess) fe = cudaStreamSynchronize(ctx->stream);
        }
        free(f);
        if (fe != cudaSuccess) return cu_cuda_error(ctx, fe, "RoPE frequencies");
    }

    /* paged attention keeps one score per position in shared memory */
    ctx->attn_smem_max = (size_t)ctx->T * sizeof(float);
    if (ctx->attn_smem_max > 48 * 1024) {
        int optin = 0;
        CU_CHECK(ctx, cudaDeviceGetAttribute(
                          &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx->device));
        if ((size_t)optin < ctx->attn_smem_max + 1024)
            return cu_set_error(ctx, ORCH_ERR_UNSUPPORTED,
                                "context %u is too long for this device's shared memory "
                                "(paged attention needs %zu bytes, device allows %d)",
                                ctx->T, ctx->attn_smem_max, optin);
        CU_CHECK(ctx, k_paged_attention_smem(ctx->attn_smem_max));
    }
    return cu_model_init(ctx, seed);
}

static int32_t context_create(const orch_model_desc *model,
                              const orch_engine_options *opts, orch_engine_ctx **out_ctx,
                              char *err, uint32_t err_cap) {
    orch_engine_options o;
    int32_t st = engine_create_args(model, opts, out_ctx, &o, err, err_cap);
    if (st != ORCH_OK) return st;
    orch_model_desc md;
    memset(&md, 0, sizeof md);
    if ((st = engine_model_normalise(model, &cu_limits, &md, err, err_cap)) != ORCH_OK)
        return st;
    uint64_t ov[OPT_COUNT] = { CU_MATH_FP32, 0 };
    uint8_t given[OPT_COUNT] = { 0 };
    st = engine_opts_parse(o.options, "cuda", cu_opt_spec, OPT_COUNT, ov, given, err,
                           err_cap);
    if (st != ORCH_OK) return st;
    const int device = (int)ov[OPT_DEVICE];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return engine_fail_buf(err, err_cap, ORCH_ERR_DEVICE, "no CUDA device (%s)",
                               e != cudaSuccess ? cudaGetErrorString(e)
                                                : "the driver reports none");
    }
    if (device >= n)
        return engine_fail_buf(err, err_cap, ORCH_ERR_INVALID_ARGUMENT,
                               "device=%d but only %d CUDA device%s", device, n,
                               n == 1 ? "" : "s");
    orch_engine_ctx *ctx = (orch_engine_ctx *)calloc(1, sizeof *ctx);
    if (!ctx)
        return engine_fail_buf(err, err_cap, ORCH_ERR_OUT_OF_MEMORY,
                               "out of host memory");
    ctx->device = device;
    ctx->math = (cu_math)ov[OPT_MATH];
    ctx->V = md.vocab_size;
    ctx->T = md.context;
    ctx->L = md.layers;
    ctx->H = md.heads;
    ctx->C = md.width;
    ctx->M = md.mlp_width;
    ctx->hs = ctx->C / ctx->H;
    ctx->arch = md.arch;
    ctx->KVH = md.kv_heads; /* normalised: heads for GPT-2 */
    ctx->kvC = ctx->KVH * ctx->hs;
    ctx->untied = md.arch == ORCH_ARCH_LLAMA && (md.flags & ORCH_MODEL_FLAG_UNTIED_HEAD);
    ctx->eps = md.layernorm_eps;
    ctx->train_lim.engine = "cuda";
    ctx->train_lim.vocab = ctx->V;
    ctx->train_lim.context = ctx->T;
    ctx->train_lim.max_tokens = CU_MAX_TOKENS;
    st = build_table(ctx, &md);
    if (st == ORCH_OK) {
        ctx->h_tok_map = (int32_t *)malloc((size_t)ctx->V * sizeof(int32_t));
        if (!ctx->h_tok_map)
            st = cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "out of host memory");
        else
            memset(ctx->h_tok_map, 0xff, (size_t)ctx->V * sizeof(int32_t)); /* -1 */
    }
    if (st == ORCH_OK) {
        pin_library();
        st = create_device_state(ctx, &md, o.seed);
    }
    if (st != ORCH_OK) {
        engine_fail_buf(err, err_cap, st, "%s", ctx->last_error);
        context_destroy(ctx);
        return st;
    }
    ctx->last_error[0] = '\0';
    *out_ctx = ctx;
    return ORCH_OK;
}

static const char *last_error(const orch_engine_ctx *ctx) {
    return ctx ? ctx->last_error : "";
}

/* ------------------------------------------------------------------------- */
/* Tensors and gradients                                                      */
/* ------------------------------------------------------------------------- */

static int32_t tensor_count(orch_engine_ctx *ctx, uint32_t kind, uint32_t *out_count) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(engine_check_tensor_count(kind, out_count, ENGINE_ERRBUF(ctx)));
    *out_count = ctx->n_tensors;
    return ORCH_OK;
}

static int32_t tensor_info(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                           orch_tensor_info *out) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(
        engine_check_tensor_info(kind, index, ctx->n_tensors, out, ENGINE_ERRBUF(ctx)));
    engine_tensor_info_fill(&ctx->tensors[index], out);
    return ORCH_OK;
}

static float *kind_base(orch_engine_ctx *ctx, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? ctx->d_params
           : kind == ORCH_TENSOR_ADAM_M ? ctx->d_m
                                        : ctx->d_v;
}

static int sharded(const orch_engine_ctx *ctx) {
    return ctx->sh_off != 0 || ctx->sh_count != ctx->n_params;
}

/* The whole-table moment calls need every moment (ABI 1.2). */
static int32_t shard_refusal(orch_engine_ctx *ctx, const char *fn) {
    return cu_set_error(ctx, ORCH_ERR_STATE,
                        "%s: this context keeps the AdamW moments of [%llu, %llu+%llu) "
                        "only (optimizer_shard); use moments_read/moments_write and "
                        "optimizer_step_range",
                        fn, (unsigned long long)ctx->sh_off,
                        (unsigned long long)ctx->sh_off,
                        (unsigned long long)ctx->sh_count);
}

static int32_t tensor_copy(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                           void *host, uint64_t bytes, int to_host) {
    ENTER(ctx);
    CU_TRY(engine_check_tensor_io(to_host ? "tensor_read" : "tensor_write", kind, index,
                                  ctx->tensors, ctx->n_tensors, host, bytes,
                                  ENGINE_ERRBUF(ctx)));
    if (kind != ORCH_TENSOR_PARAM && sharded(ctx))
        return shard_refusal(ctx, to_host ? "tensor_read" : "tensor_write");
    const cu_tensor *t = &ctx->tensors[index];
    float *dev = kind_base(ctx, kind) + t->offset;
    if (to_host)
        CU_CHECK(ctx,
                 cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    else
        CU_CHECK(ctx,
                 cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

static int32_t tensor_read(orch_engine_ctx *ctx, uint32_t kind, uint32_t index, void *dst,
                           uint64_t dst_bytes) {
    return tensor_copy(ctx, kind, index, dst, dst_bytes, 1);
}

static int32_t tensor_write(orch_engine_ctx *ctx, uint32_t kind, uint32_t index,
                            const void *src, uint64_t src_bytes) {
    return tensor_copy(ctx, kind, index, (void *)src, src_bytes, 0);
}

static int32_t grads_zero(orch_engine_ctx *ctx) {
    ENTER(ctx);
    CU_CHECK(ctx, cudaMemsetAsync(ctx->d_grads, 0, ctx->n_params * sizeof(float),
                                  ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

static int32_t grads_copy(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                          float *host, int to_host) {
    ENTER(ctx);
    CU_TRY(engine_check_grad_range(to_host ? "grads_read" : "grads_write", offset, count,
                                   ctx->n_params, host, ENGINE_ERRBUF(ctx)));
    if (count == 0) return ORCH_OK;
    size_t bytes = (size_t)count * sizeof(float);
    if (to_host)
        CU_CHECK(ctx, cudaMemcpyAsync(host, ctx->d_grads + offset, bytes,
                                      cudaMemcpyDeviceToHost, ctx->stream));
    else
        CU_CHECK(ctx, cudaMemcpyAsync(ctx->d_grads + offset, host, bytes,
                                      cudaMemcpyHostToDevice, ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

static int32_t grads_read(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                          float *dst) {
    return grads_copy(ctx, offset, count, dst, 1);
}

static int32_t grads_write(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                           const float *src) {
    return grads_copy(ctx, offset, count, (float *)src, 0);
}

/* ------------------------------------------------------------------------- */
/* Training and evaluation                                                    */
/* ------------------------------------------------------------------------- */

/* forward_backward and (ABI 1.3) forward_backward_notify: ready NULL is
 * plain forward_backward; each reported range is final on the device (the
 * stream was synchronised) when ready runs. */
static int32_t forward_backward_notify(orch_engine_ctx *ctx, const int32_t *tokens,
                                       const int32_t *targets, uint32_t batch,
                                       uint32_t seq_len, float grad_scale,
                                       float *out_loss, orch_grad_ready_fn ready,
                                       void *user) {
    ENTER(ctx);
    uint64_t n_valid = 0;
    CU_TRY(engine_check_train_call(ready ? "forward_backward_notify" : "forward_backward",
                                   tokens, targets, batch, seq_len, grad_scale, out_loss,
                                   &ctx->train_lim, &n_valid, ENGINE_ERRBUF(ctx)));
    const cu_grad_notify n = { ready, user };
    float loss = 0.0f;
    CU_TRY(cu_model_train_step(ctx, tokens, targets, batch, seq_len, n_valid, grad_scale,
                               1, &loss, ready ? &n : NULL));
    *out_loss = loss;
    return ORCH_OK;
}

static int32_t forward_backward(orch_engine_ctx *ctx, const int32_t *tokens,
                                const int32_t *targets, uint32_t batch, uint32_t seq_len,
                                float grad_scale, float *out_loss) {
    return forward_backward_notify(ctx, tokens, targets, batch, seq_len, grad_scale,
                                   out_loss, NULL, NULL);
}

static int32_t eval_loss(orch_engine_ctx *ctx, const int32_t *tokens,
                         const int32_t *targets, uint32_t batch, uint32_t seq_len,
                         float *out_loss) {
    ENTER(ctx);
    uint64_t n_valid = 0;
    CU_TRY(engine_check_train_call("eval_loss", tokens, targets, batch, seq_len, 0.0f,
                                   out_loss, &ctx->train_lim, &n_valid,
                                   ENGINE_ERRBUF(ctx)));
    float loss = 0.0f;
    CU_TRY(cu_model_train_step(ctx, tokens, targets, batch, seq_len, n_valid, 0.0f, 0,
                               &loss, NULL));
    *out_loss = loss;
    return ORCH_OK;
}

static int32_t optimizer_step(orch_engine_ctx *ctx, const orch_adamw_params *params,
                              float *out_grad_norm) {
    ENTER(ctx);
    orch_adamw_params p;
    CU_TRY(engine_check_adamw(params, &p, ENGINE_ERRBUF(ctx)));
    if (sharded(ctx)) return shard_refusal(ctx, "optimizer_step");
    return cu_model_adamw(ctx, &p, out_grad_norm);
}

/* ------------------------------------------------------------------------- */
/* ABI 1.2: flat parameters, the optimizer shard, the ranged step             */
/* ------------------------------------------------------------------------- */

/* Copy count floats between host and dev (synchronous on the stream). */
static int32_t flat_copy(orch_engine_ctx *ctx, float *dev, float *host, uint64_t count,
                         int to_host) {
    if (count == 0) return ORCH_OK;
    size_t bytes = (size_t)count * sizeof(float);
    if (to_host)
        CU_CHECK(ctx,
                 cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    else
        CU_CHECK(ctx,
                 cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

static int32_t param_read(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                          float *dst) {
    ENTER(ctx);
    CU_TRY(engine_check_flat_range("param_read", offset, count, ctx->n_params, dst,
                                   ENGINE_ERRBUF(ctx)));
    return flat_copy(ctx, ctx->d_params + offset, dst, count, 1);
}

static int32_t param_write(orch_engine_ctx *ctx, uint64_t offset, uint64_t count,
                           const float *src) {
    ENTER(ctx);
    CU_TRY(engine_check_flat_range("param_write", offset, count, ctx->n_params, src,
                                   ENGINE_ERRBUF(ctx)));
    return flat_copy(ctx, ctx->d_params + offset, (float *)src, count, 0);
}

static int32_t optimizer_shard(orch_engine_ctx *ctx, uint64_t offset, uint64_t count) {
    ENTER(ctx);
    CU_TRY(engine_check_shard(offset, count, ctx->n_params, ENGINE_ERRBUF(ctx)));
    if (offset == ctx->sh_off && count == ctx->sh_count) return ORCH_OK;
    float *mom = NULL;
    CU_TRY(mom_alloc(ctx, count, &mom));
    float *m = mom, *v = mom + mom_stride(count);
    /* keep the overlap of the old and the new range */
    uint64_t a = offset > ctx->sh_off ? offset : ctx->sh_off;
    uint64_t e1 = offset + count, e0 = ctx->sh_off + ctx->sh_count;
    uint64_t b = e1 < e0 ? e1 : e0;
    cudaError_t e = cudaSuccess;
    if (a < b) {
        size_t bytes = (size_t)(b - a) * sizeof(float);
        e = cudaMemcpyAsync(m + (a - offset), ctx->d_m + (a - ctx->sh_off), bytes,
                            cudaMemcpyDeviceToDevice, ctx->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(v + (a - offset), ctx->d_v + (a - ctx->sh_off), bytes,
                                cudaMemcpyDeviceToDevice, ctx->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    }
    if (e != cudaSuccess) {
        cudaFree(mom);
        return cu_cuda_error(ctx, e, "optimizer_shard: moment copy");
    }
    cudaFree(ctx->d_mom);
    ctx->d_mom = mom;
    ctx->d_m = m;
    ctx->d_v = v;
    ctx->sh_off = offset;
    ctx->sh_count = count;
    return ORCH_OK;
}

static int32_t moments_copy(orch_engine_ctx *ctx, const char *fn, uint32_t kind,
                            uint64_t offset, uint64_t count, float *host, int to_host) {
    ENTER(ctx);
    CU_TRY(engine_check_moment_range(fn, kind, offset, count, ctx->n_params, ctx->sh_off,
                                     ctx->sh_count, host, ENGINE_ERRBUF(ctx)));
    float *dev =
        (kind == ORCH_TENSOR_ADAM_M ? ctx->d_m : ctx->d_v) + (offset - ctx->sh_off);
    return flat_copy(ctx, dev, host, count, to_host);
}

static int32_t moments_read(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                            uint64_t count, float *dst) {
    return moments_copy(ctx, "moments_read", kind, offset, count, dst, 1);
}

static int32_t moments_write(orch_engine_ctx *ctx, uint32_t kind, uint64_t offset,
                             uint64_t count, const float *src) {
    return moments_copy(ctx, "moments_write", kind, offset, count, (float *)src, 0);
}

static int32_t optimizer_step_range(orch_engine_ctx *ctx, const orch_adamw_params *params,
                                    uint64_t offset, uint64_t count,
                                    float global_grad_norm) {
    ENTER(ctx);
    orch_adamw_params p;
    CU_TRY(engine_check_step_range(params, offset, count, ctx->n_params, ctx->sh_off,
                                   ctx->sh_count, global_grad_norm, &p,
                                   ENGINE_ERRBUF(ctx)));
    if (count == 0) return ORCH_OK;
    return cu_model_adamw_range(ctx, &p, offset, count, global_grad_norm);
}

static int32_t optimizer_bytes(orch_engine_ctx *ctx, uint64_t *out_bytes) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    if (!out_bytes)
        return cu_set_error(ctx, ORCH_ERR_INVALID_ARGUMENT, "out_bytes is NULL");
    *out_bytes = 2 * mom_stride(ctx->sh_count) * sizeof(float);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* Inference                                                                  */
/* ------------------------------------------------------------------------- */

static int32_t kv_block_bytes(orch_engine_ctx *ctx, uint32_t block_size, uint64_t *out) {
    if (!ctx) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(engine_check_kv_block_bytes(block_size, out, ENGINE_ERRBUF(ctx)));
    *out = (uint64_t)ctx->L * 2 * block_size * ctx->kvC * sizeof(float);
    return ORCH_OK;
}

static int32_t kv_configure(orch_engine_ctx *ctx, uint32_t block_size,
                            uint32_t num_blocks) {
    ENTER(ctx);
    CU_TRY(engine_check_kv_configure(block_size, num_blocks, CU_MAX_BLOCK_SIZE,
                                     ENGINE_ERRBUF(ctx)));
    uint64_t block_bytes = (uint64_t)ctx->L * 2 * block_size * ctx->kvC * sizeof(float);
    uint64_t slots = (uint64_t)block_size * num_blocks;
    if (block_bytes > UINT64_MAX / num_blocks)
        return cu_set_error(
            ctx, ORCH_ERR_OUT_OF_MEMORY,
            "kv_configure: a pool of %u blocks of %u positions is too large", num_blocks,
            block_size);
    uint64_t total = block_bytes * num_blocks;
    engine_kv_mark *marks = (engine_kv_mark *)calloc(num_blocks, sizeof *marks);
    uint8_t *written = (uint8_t *)calloc((size_t)slots, 1);
    if (!marks || !written) {
        free(marks);
        free(written);
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "kv_configure: out of host memory for %u blocks", num_blocks);
    }
    /* The new pool is allocated before the old one goes, so a failure leaves
     * the old pool in place - unless only freeing it makes room. */
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, total);
    if (e == cudaErrorMemoryAllocation && ctx->d_kv) {
        (void)cudaGetLastError();
        cudaFree(ctx->d_kv);
        ctx->d_kv = NULL;
        ctx->kv_block_size = ctx->kv_num_blocks = 0;
        e = cudaMalloc(&p, total);
    }
    if (e != cudaSuccess) {
        free(marks);
        free(written);
        if (e == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                                "kv_configure: out of device memory: %u blocks x %u "
                                "positions need %.1f MiB%s",
                                num_blocks, block_size, (double)total / (1024.0 * 1024.0),
                                ctx->d_kv ? "" : " (the previous pool was released)");
        }
        return cu_cuda_error(ctx, e, "cudaMalloc(KV pool)");
    }
    if (ctx->d_kv) cudaFree(ctx->d_kv);
    free(ctx->h_kv_marks);
    free(ctx->h_kv_written);
    ctx->d_kv = (float *)p;
    ctx->h_kv_marks = marks;
    ctx->kv_epoch = 0;
    ctx->h_kv_written = written;
    ctx->kv_block_size = block_size;
    ctx->kv_num_blocks = num_blocks;
    /* zeroed so that nothing ever reads NaN garbage, even after misuse */
    CU_CHECK(ctx, cudaMemsetAsync(ctx->d_kv, 0, total, ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

/* The KV pool as the engines/common checks see it. */
engine_kv_view cu_kv_view(orch_engine_ctx *ctx) {
    engine_kv_view v = { ctx->kv_block_size, ctx->d_kv ? ctx->kv_num_blocks : 0,
                         ctx->h_kv_marks, &ctx->kv_epoch, ctx->h_kv_written };
    return v;
}

/* Validate the whole batch (no device work) and flatten it into *plan, whose
 * arrays live in one malloc'd block returned in *mem (caller frees). */
int32_t cu_plan_batch(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                      const float *logits, uint64_t logits_cap, cu_infer_plan *plan,
                      int32_t **mem) {
    const engine_kv_view kv = cu_kv_view(ctx);
    uint64_t n_tokens = 0, n_rows = 0, n_table = 0;
    CU_TRY(engine_infer_check_lora(batch, logits, logits_cap, ctx->V, ctx->T,
                                   CU_MAX_TOKENS, "the cuda engine's per-call maximum",
                                   &kv, cu_lora_known, ctx, &n_tokens, &n_rows,
                                   ENGINE_ERRBUF(ctx)));
    const uint32_t bs = ctx->kv_block_size;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *q = engine_batch_seq(batch, i);
        n_table += ((uint64_t)q->start_pos + q->n_tokens + bs - 1) / bs;
    }
    size_t ints = 3 * (size_t)n_tokens + n_rows + batch->n_seqs + n_table + 1;
    int32_t *m = (int32_t *)malloc(ints * sizeof(int32_t));
    if (!m) return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "out of host memory");
    int32_t *tok = m, *pos = tok + n_tokens, *seq = pos + n_tokens,
            *rows = seq + n_tokens;
    int32_t *bt_off = rows + n_rows, *bt_all = bt_off + batch->n_seqs;
    uint32_t t = 0, r = 0, o = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *q = engine_batch_seq(batch, i);
        uint32_t need = (q->start_pos + q->n_tokens + bs - 1) / bs;
        bt_off[i] = (int32_t)o;
        for (uint32_t j = 0; j < need; j++) bt_all[o++] = q->block_table[j];
        for (uint32_t k = 0; k < q->n_tokens; k++) {
            tok[t] = q->tokens[k];
            pos[t] = (int32_t)(q->start_pos + k);
            seq[t] = (int32_t)i;
            if (q->logits_mode == ORCH_LOGITS_ALL ||
                (q->logits_mode == ORCH_LOGITS_LAST && k + 1 == q->n_tokens))
                rows[r++] = (int32_t)t;
            t++;
        }
    }
    plan->n_tokens = (uint32_t)n_tokens;
    plan->n_rows = (uint32_t)n_rows;
    plan->n_seqs = batch->n_seqs;
    plan->n_table = (uint32_t)n_table;
    plan->tokens = tok;
    plan->pos = pos;
    plan->seq = seq;
    plan->rows = rows;
    plan->bt_off = bt_off;
    plan->bt_all = bt_all;
    *mem = m;
    return ORCH_OK;
}

static int32_t infer_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                             float *logits, uint64_t logits_cap) {
    ENTER(ctx);
    cu_infer_plan plan;
    int32_t *mem = NULL;
    CU_TRY(cu_plan_batch(ctx, batch, logits, logits_cap, &plan, &mem));
    int32_t st = cu_infer_planned(ctx, batch, &plan, logits);
    free(mem);
    return st;
}

int32_t cu_infer_planned(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                         const cu_infer_plan *plan, float *logits) {
    int32_t st = cu_lora_infer_begin(ctx, batch); /* the sequences' adapters */
    if (st == ORCH_OK) st = cu_model_infer(ctx, plan, logits);
    cu_lora_infer_end(ctx);
    if (st == ORCH_OK) {
        const engine_kv_view kv = cu_kv_view(ctx);
        engine_kv_mark_written(batch, &kv);
    }
    return st;
}

static int32_t kv_copy_blocks(orch_engine_ctx *ctx, const int32_t *src,
                              const int32_t *dst, uint32_t n) {
    ENTER(ctx);
    const engine_kv_view kv = cu_kv_view(ctx);
    CU_TRY(engine_kv_copy_check(src, dst, n, &kv, ENGINE_ERRBUF(ctx)));
    if (n == 0) return ORCH_OK;
    size_t block_bytes =
        (size_t)ctx->L * 2 * ctx->kv_block_size * ctx->kvC * sizeof(float);
    size_t block_elems = block_bytes / sizeof(float);
    for (uint32_t i = 0; i < n; i++)
        CU_CHECK(ctx,
                 cudaMemcpyAsync(ctx->d_kv + (size_t)dst[i] * block_elems,
                                 ctx->d_kv + (size_t)src[i] * block_elems, block_bytes,
                                 cudaMemcpyDeviceToDevice, ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    engine_kv_copy_written(src, dst, n, &kv);
    return ORCH_OK;
}

/* ------------------------------------------------------------------------- */
/* ABI 1.4: LoRA adapters (cuda_lora.cu)                                      */
/* ------------------------------------------------------------------------- */

static int32_t adapter_create(orch_engine_ctx *ctx, const orch_lora_desc *desc,
                              uint32_t *out_id) {
    ENTER(ctx);
    return cu_lora_create(ctx, desc, out_id);
}

/* ORCH_ERR_STATE while a fine-tuning stream is open on the adapter (ABI 1.5:
 * its parameters must not change under the stream). */
static int32_t adapter_busy(orch_engine_ctx *ctx, const char *fn, uint32_t adapter_id) {
    const uint32_t stream = cu_ft_adapter_stream(ctx, adapter_id);
    if (stream == 0) return ORCH_OK;
    return cu_set_error(ctx, ORCH_ERR_STATE,
                        "%s: adapter %u has an open fine-tuning stream (stream %u); "
                        "close it first",
                        fn, adapter_id, stream);
}

static int32_t adapter_destroy(orch_engine_ctx *ctx, uint32_t adapter_id) {
    ENTER(ctx);
    if (cu_lora_known(ctx, adapter_id))
        CU_TRY(adapter_busy(ctx, "adapter_destroy", adapter_id));
    return cu_lora_destroy(ctx, adapter_id);
}

static int32_t adapter_tensor_count(orch_engine_ctx *ctx, uint32_t adapter_id,
                                    uint32_t kind, uint32_t *out_count) {
    ENTER(ctx);
    CU_TRY(engine_check_tensor_count(kind, out_count, ENGINE_ERRBUF(ctx)));
    const cu_lora *lo = cu_lora_find(ctx, "adapter_tensor_count", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    *out_count = lo->n_tensors;
    return ORCH_OK;
}

static int32_t adapter_tensor_info(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint32_t kind, uint32_t index, orch_tensor_info *out) {
    ENTER(ctx);
    const cu_lora *lo = cu_lora_find(ctx, "adapter_tensor_info", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(engine_check_tensor_info(kind, index, lo->n_tensors, out, ENGINE_ERRBUF(ctx)));
    engine_tensor_info_fill(&lo->tensors[index], out);
    return ORCH_OK;
}

static float *adapter_kind_buffer(cu_lora *lo, uint32_t kind) {
    return kind == ORCH_TENSOR_PARAM    ? lo->d_params
           : kind == ORCH_TENSOR_ADAM_M ? lo->d_m
                                        : lo->d_v;
}

/* adapter_tensor_read / write: one synchronous copy. Nothing is derived from
 * an adapter's parameters (the products read them), so a write refreshes
 * nothing. */
static int32_t adapter_tensor_copy(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint32_t kind, uint32_t index, void *host,
                                   uint64_t bytes, int to_host) {
    ENTER(ctx);
    const char *fn = to_host ? "adapter_tensor_read" : "adapter_tensor_write";
    cu_lora *lo = cu_lora_find(ctx, fn, adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(engine_check_tensor_io(fn, kind, index, lo->tensors, lo->n_tensors, host,
                                  bytes, ENGINE_ERRBUF(ctx)));
    if (!to_host && kind == ORCH_TENSOR_PARAM) CU_TRY(adapter_busy(ctx, fn, adapter_id));
    float *dev = adapter_kind_buffer(lo, kind) + lo->tensors[index].offset;
    if (to_host)
        CU_CHECK(ctx,
                 cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    else
        CU_CHECK(ctx,
                 cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

static int32_t adapter_tensor_read(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint32_t kind, uint32_t index, void *dst,
                                   uint64_t dst_bytes) {
    return adapter_tensor_copy(ctx, adapter_id, kind, index, dst, dst_bytes, 1);
}

static int32_t adapter_tensor_write(orch_engine_ctx *ctx, uint32_t adapter_id,
                                    uint32_t kind, uint32_t index, const void *src,
                                    uint64_t src_bytes) {
    return adapter_tensor_copy(ctx, adapter_id, kind, index, (void *)src, src_bytes, 0);
}

static int32_t adapter_grads_zero(orch_engine_ctx *ctx, uint32_t adapter_id) {
    ENTER(ctx);
    cu_lora *lo = cu_lora_find(ctx, "adapter_grads_zero", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    CU_CHECK(ctx,
             cudaMemsetAsync(lo->d_grads, 0, lo->n_params * sizeof(float), ctx->stream));
    CU_CHECK(ctx, cudaStreamSynchronize(ctx->stream));
    return ORCH_OK;
}

static int32_t adapter_grads_copy(orch_engine_ctx *ctx, uint32_t adapter_id,
                                  uint64_t offset, uint64_t count, float *host,
                                  int to_host) {
    ENTER(ctx);
    const char *fn = to_host ? "adapter_grads_read" : "adapter_grads_write";
    cu_lora *lo = cu_lora_find(ctx, fn, adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(engine_check_grad_range(fn, offset, count, lo->n_params, host,
                                   ENGINE_ERRBUF(ctx)));
    return flat_copy(ctx, lo->d_grads + offset, host, count, to_host);
}

static int32_t adapter_grads_read(orch_engine_ctx *ctx, uint32_t adapter_id,
                                  uint64_t offset, uint64_t count, float *dst) {
    return adapter_grads_copy(ctx, adapter_id, offset, count, dst, 1);
}

static int32_t adapter_grads_write(orch_engine_ctx *ctx, uint32_t adapter_id,
                                   uint64_t offset, uint64_t count, const float *src) {
    return adapter_grads_copy(ctx, adapter_id, offset, count, (float *)src, 0);
}

/* forward_backward (grad 1) or eval_loss (0) through base + adapter: the
 * passes run with ctx->lora_cur set (the base frozen). */
static int32_t adapter_run(orch_engine_ctx *ctx, const char *fn, uint32_t adapter_id,
                           const int32_t *tokens, const int32_t *targets, uint32_t batch,
                           uint32_t seq_len, float grad_scale, int grad,
                           float *out_loss) {
    ENTER(ctx);
    uint64_t n_valid = 0;
    CU_TRY(engine_check_train_call(fn, tokens, targets, batch, seq_len, grad_scale,
                                   out_loss, &ctx->train_lim, &n_valid,
                                   ENGINE_ERRBUF(ctx)));
    cu_lora *lo = cu_lora_find(ctx, fn, adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    float loss = 0.0f;
    ctx->lora_cur = lo;
    int32_t st = cu_model_train_step(ctx, tokens, targets, batch, seq_len, n_valid,
                                     grad_scale, grad, &loss, NULL);
    ctx->lora_cur = NULL;
    if (st == ORCH_OK) *out_loss = loss;
    return st;
}

static int32_t adapter_forward_backward(orch_engine_ctx *ctx, uint32_t adapter_id,
                                        const int32_t *tokens, const int32_t *targets,
                                        uint32_t batch, uint32_t seq_len,
                                        float grad_scale, float *out_loss) {
    return adapter_run(ctx, "adapter_forward_backward", adapter_id, tokens, targets,
                       batch, seq_len, grad_scale, 1, out_loss);
}

static int32_t adapter_eval_loss(orch_engine_ctx *ctx, uint32_t adapter_id,
                                 const int32_t *tokens, const int32_t *targets,
                                 uint32_t batch, uint32_t seq_len, float *out_loss) {
    return adapter_run(ctx, "adapter_eval_loss", adapter_id, tokens, targets, batch,
                       seq_len, 0.0f, 0, out_loss);
}

static int32_t adapter_optimizer_step(orch_engine_ctx *ctx, uint32_t adapter_id,
                                      const orch_adamw_params *params,
                                      float *out_grad_norm) {
    ENTER(ctx);
    orch_adamw_params p;
    CU_TRY(engine_check_adamw(params, &p, ENGINE_ERRBUF(ctx)));
    cu_lora *lo = cu_lora_find(ctx, "adapter_optimizer_step", adapter_id);
    if (!lo) return ORCH_ERR_INVALID_ARGUMENT;
    CU_TRY(adapter_busy(ctx, "adapter_optimizer_step", adapter_id));
    return cu_lora_optimizer_step(ctx, lo, &p, out_grad_norm);
}

static int32_t coserve_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                               float *logits, uint64_t logits_cap,
                               const orch_finetune_batch *ft, uint32_t n_finetune,
                               uint32_t ft_stride, float *out_losses) {
    ENTER(ctx);
    return cu_coserve_forward(ctx, batch, logits, logits_cap, ft, n_finetune, ft_stride,
                              out_losses);
}

/* ------------------------------------------------------------------------- */
/* ABI 1.5: token-level fine-tuning streams (cuda_ft_stream.cu)               */
/* ------------------------------------------------------------------------- */

static int32_t ft_stream_open(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                              uint32_t *out_stream) {
    ENTER(ctx);
    return cu_ft_stream_open(ctx, ft, out_stream);
}

static int32_t ft_stream_close(orch_engine_ctx *ctx, uint32_t stream) {
    ENTER(ctx);
    return cu_ft_stream_close(ctx, stream);
}

static int32_t coserve_step(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                            float *logits, uint64_t logits_cap, uint32_t stream,
                            uint32_t ft_rows, orch_ft_progress *progress) {
    ENTER(ctx);
    return cu_ft_coserve_step(ctx, batch, logits, logits_cap, stream, ft_rows, progress);
}

/* ------------------------------------------------------------------------- */
/* The table                                                                  */
/* ------------------------------------------------------------------------- */

static const orch_engine_api cuda_api = {
    ORCH_ENGINE_ABI_MAJOR,
    ORCH_ENGINE_ABI_MINOR,
    (uint32_t)sizeof(orch_engine_api),
    0,
    "cuda",
    CU_ENGINE_VERSION,
    ORCH_CAP_TRAIN | ORCH_CAP_INFER | ORCH_CAP_KV_COPY | ORCH_CAP_EVAL |
        ORCH_CAP_DETERMINISTIC | ORCH_CAP_GPU | ORCH_CAP_LORA | ORCH_CAP_COSERVE |
        ORCH_CAP_FT_STREAM,
    probe,
    engine_status_string,
    context_create,
    context_destroy,
    last_error,
    tensor_count,
    tensor_info,
    tensor_read,
    tensor_write,
    grads_zero,
    grads_read,
    grads_write,
    forward_backward,
    optimizer_step,
    eval_loss,
    kv_block_bytes,
    kv_configure,
    infer_forward,
    kv_copy_blocks,
    param_read,
    param_write,
    optimizer_shard,
    moments_read,
    moments_write,
    optimizer_step_range,
    optimizer_bytes,
    forward_backward_notify,
    /* 1.4 LoRA adapters (ORCH_CAP_LORA, cuda_lora.cu) */
    adapter_create,
    adapter_destroy,
    adapter_tensor_count,
    adapter_tensor_info,
    adapter_tensor_read,
    adapter_tensor_write,
    adapter_grads_zero,
    adapter_grads_read,
    adapter_grads_write,
    adapter_forward_backward,
    adapter_eval_loss,
    adapter_optimizer_step,
    /* 1.4 co-serving (ORCH_CAP_COSERVE, cuda_coserve.cu) */
    coserve_forward,
    /* 1.5 token-level fine-tuning (ORCH_CAP_FT_STREAM, cuda_ft_stream.cu) */
    ft_stream_open,
    ft_stream_close,
    coserve_step,
};

extern "C" ORCH_ENGINE_EXPORT const orch_engine_api *
orch_engine_get_api(uint32_t abi_major);

extern "C" ORCH_ENGINE_EXPORT const orch_engine_api *
orch_engine_get_api(uint32_t abi_major) {
    (void)abi_major; /* the loader compares the major itself and names both */
    return &cuda_api;
}
