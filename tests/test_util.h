/*
 * test_util.h - what every Check suite of orch needs once: the main that runs
 * a suite, the build directory and engine search path, a model-description
 * builder, and temporary directories that are removed again; for the engine
 * suites also infer_forward inputs, tensor-table reads and writes, AdamW
 * parameters, float comparisons and two small deterministic generators.
 *
 * Header-only (static functions) so each suite stays one .c file linked
 * against the orchestrator objects.
 * Threads: call from the test process's main thread or a Check test body.
 * Memory: returned strings point into static buffers of this file;
 * test_read_kind and test_read_grads return malloc'd arrays the caller frees.
 * Errors: failures abort the current Check test with a message.
 */
#ifndef ORCH_TEST_UTIL_H
#define ORCH_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/util.h"

/* The build directory: $ORCH_BUILD, else the directory above this test
 * binary (build/tests/test_x -> build), else "build". */
static inline const char *test_build_dir(void) {
    static char dir[4096];
    const char *b = getenv("ORCH_BUILD");
    if (b && *b)
        snprintf(dir, sizeof dir, "%s", b);
    else if (util_exe_dir(dir, sizeof dir - 4) == 0)
        strcat(dir, "/..");
    else
        snprintf(dir, sizeof dir, "build");
    return dir;
}

/* Point $ORCH_ENGINE_PATH at the build directory unless it is set, so that
 * engine_load("mock") works when a suite is run by hand. */
static inline void test_default_engine_path(void) {
    if (!getenv("ORCH_ENGINE_PATH")) setenv("ORCH_ENGINE_PATH", test_build_dir(), 1);
}

/* A GPT-2 model description with the given shape (mlp_width 4*width,
 * layernorm_eps 1e-5, kv_heads = heads). */
static inline orch_model_desc test_model_desc(uint32_t vocab, uint32_t context,
                                              uint32_t layers, uint32_t heads,
                                              uint32_t width) {
    orch_model_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.arch = ORCH_ARCH_GPT2;
    d.vocab_size = vocab;
    d.context = context;
    d.layers = layers;
    d.heads = heads;
    d.width = width;
    d.mlp_width = 4 * width;
    d.layernorm_eps = 1e-5f;
    return d;
}

/* TEST_ENGINE_FIXTURE(name): a suite's file-scope engine: H (the loaded
 * engine `name`), A (its API table) and load_engine/unload_engine for
 * tcase_add_unchecked_fixture. The suite includes
 * orchestrator/core/engine_loader.h. */
#define TEST_ENGINE_FIXTURE(name)                                                  \
    static engine_handle H;                                                        \
    static const orch_engine_api *A;                                               \
    static void load_engine(void) {                                                \
        char load_err[1024];                                                       \
        ck_assert_msg(engine_load(name, &H, load_err, sizeof load_err) == 0, "%s", \
                      load_err);                                                   \
        A = H.api;                                                                 \
    }                                                                              \
    static void unload_engine(void) { engine_unload(&H); }

/* TEST_LOAD_CUDA_AND_CPU(suite, gpu, cpu), in main() of the CUDA suites: load
 * the engine ORCH_CUDA_ENGINE names (default "cuda") into the engine_handle
 * gpu and the CPU engine (the parity reference) into cpu; when either cannot
 * be loaded (no device, no library) print "<suite>: skipped: <why>" and
 * return 77 from main. The suite includes orchestrator/core/engine_loader.h. */
#define TEST_LOAD_CUDA_AND_CPU(suite, gpu, cpu)                                    \
    do {                                                                           \
        const char *gpu_value_ = getenv("ORCH_CUDA_ENGINE");                       \
        if (!gpu_value_ || !*gpu_value_) gpu_value_ = "cuda";                      \
        char load_err_[2048];                                                      \
        if (engine_load(gpu_value_, &(gpu), load_err_, sizeof load_err_) != 0) {   \
            printf("%s: skipped: %s\n", suite, load_err_);                         \
            return 77;                                                             \
        }                                                                          \
        if (engine_load("cpu", &(cpu), load_err_, sizeof load_err_) != 0) {        \
            printf("%s: skipped: the CPU engine (the parity reference) cannot be " \
                   "loaded: %s\n",                                                 \
                   suite, load_err_);                                              \
            engine_unload(&(gpu));                                                 \
            return 77;                                                             \
        }                                                                          \
    } while (0)

/* Make a fresh directory /tmp/orch_<tag>_XXXXXX into buf (cap >= 64). */
static inline void test_tmpdir(char *buf, size_t cap, const char *tag) {
    snprintf(buf, cap, "/tmp/orch_%s_XXXXXX", tag);
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp %s failed", buf);
}

/* rm -rf a directory made by test_tmpdir (refuses anything else). */
static inline void test_rmdir(const char *dir) {
    ck_assert_msg(strncmp(dir, "/tmp/orch_", 10) == 0 && !strchr(dir, '\''),
                  "refusing to remove %s", dir);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Run a suite and turn its result into the process exit status. */
static inline int test_run_suite(Suite *s) {
    test_default_engine_path();
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* Engine suites: inference inputs, tensor tables, numbers                    */
/* ------------------------------------------------------------------------- */

/* One sequence of an infer_forward batch (adapter 0). */
/* A LoRA adapter description (ABI 1.4). */
static inline orch_lora_desc test_lora_desc(uint32_t rank, float alpha, uint32_t targets,
                                            uint64_t seed) {
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.rank = rank;
    d.alpha = alpha;
    d.targets = targets;
    d.seed = seed;
    return d;
}

/* A fine-tuning micro-batch (ABI 1.4/1.5) over the caller's arrays. */
static inline orch_finetune_batch test_ft_batch(uint32_t adapter_id,
                                                const int32_t *tokens,
                                                const int32_t *targets, uint32_t batch,
                                                uint32_t seq_len, float grad_scale) {
    orch_finetune_batch f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    f.adapter_id = adapter_id;
    f.tokens = tokens;
    f.targets = targets;
    f.batch = batch;
    f.seq_len = seq_len;
    f.grad_scale = grad_scale;
    return f;
}

static inline orch_seq_input test_seq_input(const int32_t *tokens, uint32_t n_tokens,
                                            uint32_t start_pos,
                                            const int32_t *block_table, uint32_t n_blocks,
                                            uint32_t logits_mode) {
    orch_seq_input s;
    memset(&s, 0, sizeof s);
    s.tokens = tokens;
    s.n_tokens = n_tokens;
    s.start_pos = start_pos;
    s.block_table = block_table;
    s.n_blocks = n_blocks;
    s.logits_mode = logits_mode;
    return s;
}

/* api->infer_forward over seqs[0..n) (stride sizeof(orch_seq_input));
 * returns its status. */
static inline int32_t test_infer(const orch_engine_api *api, orch_engine_ctx *ctx,
                                 const orch_seq_input *seqs, uint32_t n, float *logits,
                                 uint64_t logits_cap) {
    orch_infer_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_seqs = n;
    b.seq_stride = sizeof(orch_seq_input);
    b.seqs = seqs;
    return api->infer_forward(ctx, &b, logits, logits_cap);
}

/* api->coserve_forward (ABI 1.4) over seqs[0..n) (a NULL batch when n is 0)
 * and ft[0..nft) (stride sizeof(orch_finetune_batch)); returns its status. */
static inline int32_t test_coserve(const orch_engine_api *api, orch_engine_ctx *ctx,
                                   const orch_seq_input *seqs, uint32_t n, float *logits,
                                   uint64_t cap, const orch_finetune_batch *ft,
                                   uint32_t nft, float *losses) {
    orch_infer_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_seqs = n;
    b.seq_stride = sizeof(orch_seq_input);
    b.seqs = seqs;
    return api->coserve_forward(ctx, n ? &b : NULL, logits, cap, ft, nft,
                                sizeof(orch_finetune_batch), losses);
}

/* AdamW hyper-parameters of step `step`: beta1 0.9, beta2 0.95, eps 1e-8 and
 * the rest as given. */
static inline orch_adamw_params test_adamw(uint64_t step, float lr, float weight_decay,
                                           float grad_clip) {
    orch_adamw_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.step = step;
    p.lr = lr;
    p.beta1 = 0.9f;
    p.beta2 = 0.95f;
    p.eps = 1e-8f;
    p.weight_decay = weight_decay;
    p.grad_clip = grad_clip;
    return p;
}

/* An engine's tensor table of one kind, as tensor_count / tensor_info give it;
 * total is the sum of numel (the flat buffer's length). */
#define TEST_TABLE_MAX 256
typedef struct test_table {
    uint32_t n;
    uint64_t total;
    orch_tensor_info info[TEST_TABLE_MAX];
} test_table;

/* Read the table of `kind` into *t (every call must succeed). */
static inline void test_read_table(const orch_engine_api *api, orch_engine_ctx *ctx,
                                   uint32_t kind, test_table *t) {
    int32_t st = api->tensor_count(ctx, kind, &t->n);
    ck_assert_msg(st == ORCH_OK, "%s: tensor_count: %s", api->name, api->last_error(ctx));
    ck_assert_msg(t->n <= TEST_TABLE_MAX, "%s: %u tensors", api->name, t->n);
    t->total = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        memset(&t->info[i], 0, sizeof t->info[i]);
        t->info[i].struct_size = sizeof t->info[i];
        st = api->tensor_info(ctx, kind, i, &t->info[i]);
        ck_assert_msg(st == ORCH_OK, "%s: tensor_info %u: %s", api->name, i,
                      api->last_error(ctx));
        t->total += t->info[i].numel;
    }
}

/* Every tensor of `kind`, concatenated at the table's offsets (malloc'd: the
 * caller frees). */
static inline float *test_read_kind(const orch_engine_api *api, orch_engine_ctx *ctx,
                                    uint32_t kind, const test_table *t) {
    float *all = (float *)malloc((t->total ? t->total : 1) * sizeof(float));
    ck_assert_ptr_nonnull(all);
    for (uint32_t i = 0; i < t->n; i++) {
        int32_t st = api->tensor_read(ctx, kind, i, all + t->info[i].offset,
                                      t->info[i].numel * sizeof(float));
        ck_assert_msg(st == ORCH_OK, "%s: tensor_read %s: %s", api->name, t->info[i].name,
                      api->last_error(ctx));
    }
    return all;
}

/* Write every tensor of `kind` from the concatenation `all`. */
static inline void test_write_kind(const orch_engine_api *api, orch_engine_ctx *ctx,
                                   uint32_t kind, const test_table *t, const float *all) {
    for (uint32_t i = 0; i < t->n; i++) {
        int32_t st = api->tensor_write(ctx, kind, i, all + t->info[i].offset,
                                       t->info[i].numel * sizeof(float));
        ck_assert_msg(st == ORCH_OK, "%s: tensor_write %s: %s", api->name,
                      t->info[i].name, api->last_error(ctx));
    }
}

/* The first n gradient elements (malloc'd: the caller frees). */
static inline float *test_read_grads(const orch_engine_api *api, orch_engine_ctx *ctx,
                                     uint64_t n) {
    float *g = (float *)malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(g);
    int32_t st = api->grads_read(ctx, 0, n, g);
    ck_assert_msg(st == ORCH_OK, "%s: grads_read: %s", api->name, api->last_error(ctx));
    return g;
}

/* max |a[i]| over n values. */
static inline double test_max_abs(const float *a, uint64_t n) {
    double m = 0.0;
    for (uint64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
    return m;
}

/* max |a[i] - b[i]| over n values; INFINITY as soon as one is NaN. */
static inline double test_max_diff(const float *a, const float *b, uint64_t n) {
    double m = 0.0;
    for (uint64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        m = fmax(m, d);
    }
    return m;
}

/* |a - b| <= abs_tol + rel * max(|a|, |b|). */
static inline int test_close(double a, double b, double rel, double abs_tol) {
    return fabs(a - b) <= abs_tol + rel * fmax(fabs(a), fabs(b));
}

/* Next value of the xorshift64 generator (13, 7, 17) in *s (not 0). */
static inline uint64_t test_xorshift64(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Next value of the 64-bit LCG s = s * 6364136223846793005 + 1442695040888963407
 * (Knuth's MMIX constants) in *s; the high bits are the useful ones. */
static inline uint64_t test_lcg64(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s;
}

/* ---- ABI 1.3 forward_backward_notify checks ---- */

/* What test_notify_check saw: the ranges in report order. */
#define TEST_NOTIFY_MAX_RANGES 4096
typedef struct test_notify_log {
    const orch_engine_api *api;
    orch_engine_ctx *ctx;
    float *seen;     /* [n]: grads_read of each range inside the callback */
    uint32_t *count; /* [n]: how many reported ranges hold each element */
    uint64_t n;
    uint64_t off[TEST_NOTIFY_MAX_RANGES], cnt[TEST_NOTIFY_MAX_RANGES];
    uint32_t ranges;
    int bad; /* a range out of [0, n), too many ranges, or grads_read failed */
} test_notify_log;

static inline void test_notify_ready(void *user, uint64_t offset, uint64_t count) {
    test_notify_log *lg = (test_notify_log *)user;
    if (lg->ranges >= TEST_NOTIFY_MAX_RANGES || offset > lg->n ||
        count > lg->n - offset) {
        lg->bad = 1;
        return;
    }
    lg->off[lg->ranges] = offset;
    lg->cnt[lg->ranges] = count;
    lg->ranges++;
    for (uint64_t i = offset; i < offset + count; i++) lg->count[i]++;
    if (lg->api->grads_read(lg->ctx, offset, count, lg->seen + offset) != ORCH_OK)
        lg->bad = 1;
}

/* ref and ctx hold the same parameters and gradients. Runs forward_backward
 * on ref and forward_backward_notify on ctx with the same batch, and checks
 * the contract: the ranges are inside the buffer and cover each of the n
 * elements exactly once, what grads_read returned inside the callback for a
 * range is the range's final value, and loss and gradients are the same
 * bits as forward_backward's. Fills *lg (the caller checks the order) and
 * returns the number of ranges. */
static inline uint32_t test_notify_check(const orch_engine_api *api, orch_engine_ctx *ref,
                                         orch_engine_ctx *ctx, const int32_t *tok,
                                         const int32_t *tgt, uint32_t B, uint32_t S,
                                         float grad_scale, uint64_t n,
                                         test_notify_log *lg) {
    memset(lg, 0, sizeof *lg);
    lg->api = api;
    lg->ctx = ctx;
    lg->n = n;
    lg->seen = (float *)calloc(n ? n : 1, sizeof(float));
    lg->count = (uint32_t *)calloc(n ? n : 1, sizeof(uint32_t));
    ck_assert_ptr_nonnull(lg->seen);
    ck_assert_ptr_nonnull(lg->count);
    float l_ref = -1.0f, l = -2.0f;
    int32_t st = api->forward_backward(ref, tok, tgt, B, S, grad_scale, &l_ref);
    ck_assert_msg(st == ORCH_OK, "%s: forward_backward: %s", api->name,
                  api->last_error(ref));
    st = api->forward_backward_notify(ctx, tok, tgt, B, S, grad_scale, &l,
                                      test_notify_ready, lg);
    ck_assert_msg(st == ORCH_OK, "%s: forward_backward_notify: %s", api->name,
                  api->last_error(ctx));
    ck_assert_msg(!lg->bad,
                  "%s: a range outside [0, %llu) or grads_read failed in the "
                  "callback",
                  api->name, (unsigned long long)n);
    ck_assert_msg(memcmp(&l, &l_ref, sizeof l) == 0,
                  "%s: loss %.9g, forward_backward %.9g", api->name, (double)l,
                  (double)l_ref);
    for (uint64_t i = 0; i < n; i++)
        ck_assert_msg(lg->count[i] == 1, "%s: element %llu reported %u times", api->name,
                      (unsigned long long)i, lg->count[i]);
    float *g_ref = test_read_grads(api, ref, n), *g = test_read_grads(api, ctx, n);
    for (uint64_t i = 0; i < n; i++) {
        ck_assert_msg(memcmp(&g[i], &g_ref[i], sizeof(float)) == 0,
                      "%s: gradient %llu is %.9g, forward_backward's %.9g", api->name,
                      (unsigned long long)i, (double)g[i], (double)g_ref[i]);
        ck_assert_msg(memcmp(&g[i], &lg->seen[i], sizeof(float)) == 0,
                      "%s: gradient %llu read in the callback %.9g, final %.9g",
                      api->name, (unsigned long long)i, (double)lg->seen[i],
                      (double)g[i]);
    }
    free(g_ref);
    free(g);
    free(lg->seen);
    free(lg->count);
    lg->seen = NULL;
    lg->count = NULL;
    return lg->ranges;
}

/* The order the header calls typical: every range starts below the one
 * reported before it (the reverse of the forward pass). */
static inline void test_notify_descending(const orch_engine_api *api,
                                          const test_notify_log *lg) {
    for (uint32_t r = 1; r < lg->ranges; r++)
        ck_assert_msg(
            lg->off[r] + lg->cnt[r] <= lg->off[r - 1],
            "%s: range %u [%llu, +%llu) is not below range %u [%llu, +%llu)", api->name,
            r, (unsigned long long)lg->off[r], (unsigned long long)lg->cnt[r], r - 1,
            (unsigned long long)lg->off[r - 1], (unsigned long long)lg->cnt[r - 1]);
}

#endif
