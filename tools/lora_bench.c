/*
 * lora_bench.c - LoRA and co-serving speed of an engine library (ABI 1.4):
 *   1. base forward_backward vs adapter_forward_backward (base frozen) on
 *      one micro-batch: fine-tuning tokens/s of each and their ratio;
 *   2. a decode step of S sequences (prompt already in the KV cache) alone,
 *      an adapter micro-batch of B2 x T2 tokens (default the batch of 1)
 *      alone, and both in one coserve_forward: the co-served time against
 *      the sum of the two alone.
 * Loads the engine with dlopen and talks to it through
 * engine_api/orch_engine.h only. Weights are the engine's random init (the
 * speed does not depend on them).
 *
 * usage: lora_bench ENGINE.so [--batch 4] [--seq 128] [--rank 8] [--steps 3]
 *            [--decode 16] [--ft-batch B2] [--ft-seq T2] [--options S]
 *            [--vocab 50257 --context 1024 --layers 12 --heads 12 --width 768]
 * Prints one JSON line (median step times and the ratios).
 * Exit status: 0 done, 1 engine failure, 2 bad usage or engine not loadable.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_api/orch_engine.h"
#include "tools/bench_util.h"

static const orch_engine_api *api;
static orch_engine_ctx *ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, int32_t st) {
    fprintf(stderr, "lora_bench: %s: %s: %s\n", what, api->status_string(st),
            ctx ? api->last_error(ctx) : "");
    return 1;
}

#define TRY(what, call)                             \
    do {                                            \
        int32_t st_ = (call);                       \
        if (st_ != ORCH_OK) return fail(what, st_); \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        printf("usage: lora_bench ENGINE.so [--batch 4] [--seq 128] [--rank 8] "
               "[--steps 3] [--decode 16]\n"
               "       [--options S] [--vocab N] [--context N] [--layers N] "
               "[--heads N] [--width N]\n");
        return argc < 2 ? 2 : 0;
    }
    uint32_t B = 4, T = 128, rank = 8, steps = 3, S = 16, B2 = 0, T2 = 0;
    const char *options = NULL;
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.arch = ORCH_ARCH_GPT2;
    m.vocab_size = 50257;
    m.context = 1024;
    m.layers = 12;
    m.heads = 12;
    m.width = 768;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t *dst = strcmp(a, "--batch") == 0      ? &B
                        : strcmp(a, "--seq") == 0      ? &T
                        : strcmp(a, "--rank") == 0     ? &rank
                        : strcmp(a, "--steps") == 0    ? &steps
                        : strcmp(a, "--decode") == 0   ? &S
                        : strcmp(a, "--ft-batch") == 0 ? &B2
                        : strcmp(a, "--ft-seq") == 0   ? &T2
                        : strcmp(a, "--vocab") == 0    ? &m.vocab_size
                        : strcmp(a, "--context") == 0  ? &m.context
                        : strcmp(a, "--layers") == 0   ? &m.layers
                        : strcmp(a, "--heads") == 0    ? &m.heads
                        : strcmp(a, "--width") == 0    ? &m.width
                                                       : NULL;
        if (v && strcmp(a, "--options") == 0) {
            options = v;
            i++;
        } else if (v && dst && bench_parse_u32(v, dst) == 0) {
            i++;
        } else {
            fprintf(stderr, "lora_bench: bad or incomplete argument '%s'\n", a);
            return 2;
        }
    }
    if (!B2) B2 = B;
    if (!T2) T2 = T;
    if (!B || !T || !rank || !steps || !S || T + 1 > m.context || B2 * T2 > B * T ||
        T2 > m.context) {
        fprintf(stderr, "lora_bench: sizes must be > 0 and seq below the context\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "lora_bench: %s\n", dlerror());
        return 2;
    }
    orch_engine_get_api_fn get =
        (orch_engine_get_api_fn)dlsym(lib, ORCH_ENGINE_ENTRY_SYMBOL);
    api = get ? get(ORCH_ENGINE_ABI_MAJOR) : NULL;
    if (!api || api->abi_major != ORCH_ENGINE_ABI_MAJOR ||
        !ORCH_API_HAS(api, coserve_forward) || !(api->capabilities & ORCH_CAP_COSERVE)) {
        fprintf(stderr, "lora_bench: %s has no ABI 1.4 co-serving\n", argv[1]);
        return 2;
    }
    orch_engine_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.seed = 1;
    o.options = options;
    char err[512] = "";
    int32_t st = api->context_create(&m, &o, &ctx, err, sizeof err);
    if (st != ORCH_OK) {
        fprintf(stderr, "lora_bench: context_create: %s\n", err);
        return 1;
    }
    const size_t BT = (size_t)B * T;
    int32_t *tok = malloc((BT + 1) * sizeof(int32_t)),
            *tgt = malloc(BT * sizeof(int32_t));
    uint64_t rng = 12345;
    for (size_t i = 0; i <= BT; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((rng >> 33) % m.vocab_size);
    }
    for (size_t i = 0; i < BT; i++) tgt[i] = tok[i + 1];
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.rank = rank;
    d.alpha = 2.0f * (float)rank;
    d.targets = ORCH_LORA_TARGET_ALL;
    d.seed = 7;
    uint32_t id = 0;
    TRY("adapter_create", api->adapter_create(ctx, &d, &id));
    double *tb = calloc(steps, sizeof(double)), *ta = calloc(steps, sizeof(double));
    double *td = calloc(steps, sizeof(double)), *tc = calloc(steps, sizeof(double));
    float loss;
    /* 1. base vs adapter forward_backward (one warm-up each) */
    for (uint32_t s = 0; s <= steps; s++) {
        double t0 = now_s();
        TRY("forward_backward", api->forward_backward(ctx, tok, tgt, B, T, 1.0f, &loss));
        double t1 = now_s();
        TRY("adapter_forward_backward",
            api->adapter_forward_backward(ctx, id, tok, tgt, B, T, 1.0f, &loss));
        double t2 = now_s();
        if (s) {
            tb[s - 1] = t1 - t0;
            ta[s - 1] = t2 - t1;
        }
    }
    /* 2. decode step of S sequences (prompt 32), alone and co-served */
    const uint32_t bs = 16, prompt = 32, nblk = (prompt + steps + 2 + bs) / bs + 1;
    TRY("kv_configure", api->kv_configure(ctx, bs, S * nblk));
    int32_t *tables = malloc((size_t)S * nblk * sizeof(int32_t));
    orch_seq_input *seqs = calloc(S, sizeof *seqs);
    float *logits = malloc((size_t)S * m.vocab_size * sizeof(float));
    for (uint32_t i = 0; i < S; i++) {
        for (uint32_t j = 0; j < nblk; j++)
            tables[i * nblk + j] = (int32_t)(i * nblk + j);
        seqs[i].tokens = tok + (i * 7) % (BT - prompt);
        seqs[i].n_tokens = prompt;
        seqs[i].block_table = tables + i * nblk;
        seqs[i].n_blocks = nblk;
        seqs[i].logits_mode = ORCH_LOGITS_LAST;
        seqs[i].adapter_id = i % 2 ? id : 0;
    }
    orch_infer_batch batch = { sizeof batch, S, sizeof(orch_seq_input), 0, seqs };
    TRY("prefill", api->infer_forward(ctx, &batch, logits, (uint64_t)S * m.vocab_size));
    for (uint32_t i = 0; i < S; i++) seqs[i].n_tokens = 1;
    orch_finetune_batch ft;
    memset(&ft, 0, sizeof ft);
    ft.struct_size = sizeof ft;
    ft.adapter_id = id;
    ft.tokens = tok;
    ft.targets = tgt;
    ft.batch = B2;
    ft.seq_len = T2;
    ft.grad_scale = 1.0f;
    uint32_t pos = prompt;
    double *tf = calloc(steps, sizeof(double));
    for (uint32_t s = 0; s <= steps; s++) {
        double tf0 = now_s();
        TRY("adapter_forward_backward (ft batch)",
            api->adapter_forward_backward(ctx, id, tok, tgt, B2, T2, 1.0f, &loss));
        if (s) tf[s - 1] = now_s() - tf0;
        for (uint32_t i = 0; i < S; i++) {
            seqs[i].start_pos = pos;
            seqs[i].tokens = tok + (i * 7 + pos) % BT;
        }
        double t0 = now_s();
        TRY("decode",
            api->infer_forward(ctx, &batch, logits, (uint64_t)S * m.vocab_size));
        double t1 = now_s();
        pos++;
        for (uint32_t i = 0; i < S; i++) {
            seqs[i].start_pos = pos;
            seqs[i].tokens = tok + (i * 7 + pos) % BT;
        }
        double t2 = now_s();
        TRY("coserve_forward",
            api->coserve_forward(ctx, &batch, logits, (uint64_t)S * m.vocab_size, &ft, 1,
                                 sizeof ft, &loss));
        double t3 = now_s();
        pos++;
        if (s) {
            td[s - 1] = t1 - t0;
            tc[s - 1] = t3 - t2;
        }
    }
    const double base = bench_median(tb, steps), lora = bench_median(ta, steps);
    const double dec = bench_median(td, steps), co = bench_median(tc, steps),
                 ftb = bench_median(tf, steps);
    printf("{\"engine\":\"%s\",\"batch\":%u,\"seq\":%u,\"rank\":%u,\"targets\":\"all\","
           "\"base_fb_s\":%.4f,\"adapter_fb_s\":%.4f,\"base_fb_tokens_per_s\":%.1f,"
           "\"adapter_fb_tokens_per_s\":%.1f,\"adapter_over_base_speed\":%.3f,"
           "\"decode_seqs\":%u,\"ft_batch\":%u,\"ft_seq\":%u,\"decode_step_s\":%.4f,"
           "\"ft_step_s\":%.4f,\"coserve_step_s\":%.4f,"
           "\"coserve_over_separate_time\":%.3f,\"coserve_ft_tokens_per_s\":%.1f}\n",
           api->name, B, T, rank, base, lora, (double)BT / base, (double)BT / lora,
           base / lora, S, B2, T2, dec, ftb, co, co / (dec + ftb), (double)B2 * T2 / co);
    api->context_destroy(ctx);
    free(tok);
    free(tgt);
    free(tb);
    free(ta);
    free(td);
    free(tc);
    free(tf);
    free(tables);
    free(seqs);
    free(logits);
    dlclose(lib);
    return 0;
}
