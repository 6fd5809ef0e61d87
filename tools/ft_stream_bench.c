/*
 * ft_stream_bench.c - cost of token-level fine-tuning streams (ABI 1.5,
 * ORCH_CAP_FT_STREAM) of an engine library: one LoRA micro-batch of B x T
 * rows run as adapter_forward_backward, and as a stream in coserve_step
 * calls of --chunk rows (no inference batch): median milliseconds of one
 * forward chunk and of one backward chunk, all the stream's steps (and,
 * apart, its open + close) against the whole adapter_forward_backward; then a decode step of S sequences alone
 * against the same step carrying one forward chunk of the stream.
 * Loads the engine with dlopen and talks to it through
 * engine_api/orch_engine.h only; weights are the engine's random init.
 *
 * usage: ft_stream_bench ENGINE.so [--batch 1] [--seq 64] [--chunk 8]
 *            [--rank 8] [--repeat 5] [--decode 8] [--options S]
 *            [--vocab 256 --context 128 --layers 4 --heads 4 --width 192]
 * (the defaults are configs/default.json's model). Prints one JSON line.
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

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static int fail(const char *what, int32_t st) {
    fprintf(stderr, "ft_stream_bench: %s: %s: %s\n", what, api->status_string(st),
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
        printf("usage: ft_stream_bench ENGINE.so [--batch 1] [--seq 64] [--chunk 8] "
               "[--rank 8] [--repeat 5] [--decode 8]\n"
               "       [--options S] [--vocab N] [--context N] [--layers N] "
               "[--heads N] [--width N]\n");
        return argc < 2 ? 2 : 0;
    }
    uint32_t B = 1, T = 64, chunk = 8, rank = 8, repeat = 5, S = 8;
    const char *options = NULL;
    orch_model_desc m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.arch = ORCH_ARCH_GPT2;
    m.vocab_size = 256;
    m.context = 128;
    m.layers = 4;
    m.heads = 4;
    m.width = 192;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t *dst = strcmp(a, "--batch") == 0     ? &B
                        : strcmp(a, "--seq") == 0     ? &T
                        : strcmp(a, "--chunk") == 0   ? &chunk
                        : strcmp(a, "--rank") == 0    ? &rank
                        : strcmp(a, "--repeat") == 0  ? &repeat
                        : strcmp(a, "--decode") == 0  ? &S
                        : strcmp(a, "--vocab") == 0   ? &m.vocab_size
                        : strcmp(a, "--context") == 0 ? &m.context
                        : strcmp(a, "--layers") == 0  ? &m.layers
                        : strcmp(a, "--heads") == 0   ? &m.heads
                        : strcmp(a, "--width") == 0   ? &m.width
                                                      : NULL;
        if (v && strcmp(a, "--options") == 0) {
            options = v;
            i++;
        } else if (v && dst && bench_parse_u32(v, dst) == 0) {
            i++;
        } else {
            fprintf(stderr, "ft_stream_bench: bad or incomplete argument '%s'\n", a);
            return 2;
        }
    }
    if (!B || !T || !chunk || !rank || !repeat || !S || T + 8 > m.context) {
        fprintf(stderr, "ft_stream_bench: sizes must be > 0 and seq + 8 within the "
                        "context\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "ft_stream_bench: %s\n", dlerror());
        return 2;
    }
    orch_engine_get_api_fn get =
        (orch_engine_get_api_fn)dlsym(lib, ORCH_ENGINE_ENTRY_SYMBOL);
    api = get ? get(ORCH_ENGINE_ABI_MAJOR) : NULL;
    if (!api || api->abi_major != ORCH_ENGINE_ABI_MAJOR ||
        !ORCH_API_HAS(api, coserve_step) || !(api->capabilities & ORCH_CAP_FT_STREAM)) {
        fprintf(stderr, "ft_stream_bench: %s has no ABI 1.5 fine-tuning streams\n",
                argv[1]);
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
        fprintf(stderr, "ft_stream_bench: context_create: %s\n", err);
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
    orch_finetune_batch ft;
    memset(&ft, 0, sizeof ft);
    ft.struct_size = sizeof ft;
    ft.adapter_id = id;
    ft.tokens = tok;
    ft.targets = tgt;
    ft.batch = B;
    ft.seq_len = T;
    ft.grad_scale = 1.0f;
    const size_t nchunks = (BT + chunk - 1) / chunk;
    double *tfb = calloc(repeat, sizeof(double)),
           *tstream = calloc(repeat, sizeof(double));
    double *topen = calloc(repeat, sizeof(double));
    double *tfwd = calloc(repeat * nchunks, sizeof(double));
    double *tbwd = calloc(repeat * nchunks, sizeof(double));
    size_t nf = 0, nb = 0;
    float loss;
    for (uint32_t r = 0; r <= repeat; r++) { /* the first round warms up */
        double t0 = now_ms();
        TRY("adapter_forward_backward",
            api->adapter_forward_backward(ctx, id, tok, tgt, B, T, 1.0f, &loss));
        double t1 = now_ms();
        uint32_t s = 0;
        double to = now_ms();
        TRY("ft_stream_open", api->ft_stream_open(ctx, &ft, &s));
        to = now_ms() - to;
        orch_ft_progress p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        double ts = 0.0;
        while (!p.finished) {
            const uint64_t f0 = p.forward_rows, b0 = p.backward_rows;
            double a = now_ms();
            TRY("coserve_step", api->coserve_step(ctx, NULL, NULL, 0, s, chunk, &p));
            const double dt = now_ms() - a;
            ts += dt;
            if (r == 0) continue;
            /* a chunk entirely forward or entirely backward */
            if (p.backward_rows == 0 && p.forward_rows - f0 == chunk) tfwd[nf++] = dt;
            if (b0 > 0 && p.backward_rows - b0 == chunk) tbwd[nb++] = dt;
        }
        double tc = now_ms();
        TRY("ft_stream_close", api->ft_stream_close(ctx, s));
        tc = now_ms() - tc;
        if (r) {
            tfb[r - 1] = t1 - t0;
            tstream[r - 1] = ts;
            topen[r - 1] = to + tc;
        }
    }
    /* a decode step of S sequences alone, and carrying one forward chunk */
    const uint32_t bs = 16, prompt = 32, nblk = (prompt + 2 * repeat + 4 + bs) / bs + 1;
    TRY("kv_configure", api->kv_configure(ctx, bs, S * nblk));
    int32_t *tables = malloc((size_t)S * nblk * sizeof(int32_t));
    orch_seq_input *seqs = calloc(S, sizeof *seqs);
    float *logits = malloc((size_t)S * m.vocab_size * sizeof(float));
    for (uint32_t i = 0; i < S; i++) {
        for (uint32_t j = 0; j < nblk; j++)
            tables[i * nblk + j] = (int32_t)(i * nblk + j);
        seqs[i].tokens = tok;
        seqs[i].n_tokens = prompt < BT ? prompt : (uint32_t)BT;
        seqs[i].block_table = tables + i * nblk;
        seqs[i].n_blocks = nblk;
        seqs[i].logits_mode = ORCH_LOGITS_LAST;
        seqs[i].adapter_id = i % 2 ? id : 0;
    }
    orch_infer_batch batch = { sizeof batch, S, sizeof(orch_seq_input), 0, seqs };
    const uint64_t cap = (uint64_t)S * m.vocab_size;
    TRY("prefill", api->infer_forward(ctx, &batch, logits, cap));
    uint32_t pos = seqs[0].n_tokens;
    for (uint32_t i = 0; i < S; i++) seqs[i].n_tokens = 1;
    double *tdec = calloc(repeat, sizeof(double)), *tco = calloc(repeat, sizeof(double));
    uint32_t s = 0;
    TRY("ft_stream_open", api->ft_stream_open(ctx, &ft, &s));
    for (uint32_t r = 0; r <= repeat; r++) {
        for (uint32_t i = 0; i < S; i++) seqs[i].start_pos = pos;
        double t0 = now_ms();
        TRY("decode", api->infer_forward(ctx, &batch, logits, cap));
        double t1 = now_ms();
        pos++;
        for (uint32_t i = 0; i < S; i++) seqs[i].start_pos = pos;
        orch_ft_progress p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        double t2 = now_ms();
        TRY("coserve_step", api->coserve_step(ctx, &batch, logits, cap, s, chunk, &p));
        double t3 = now_ms();
        pos++;
        if (p.forward_rows >= BT) { /* keep the steps forward: start again */
            TRY("ft_stream_close", api->ft_stream_close(ctx, s));
            TRY("ft_stream_open", api->ft_stream_open(ctx, &ft, &s));
        }
        if (r) {
            tdec[r - 1] = t1 - t0;
            tco[r - 1] = t3 - t2;
        }
    }
    TRY("ft_stream_close", api->ft_stream_close(ctx, s));
    printf("{\"engine\":\"%s\",\"layers\":%u,\"width\":%u,\"batch\":%u,\"seq\":%u,"
           "\"chunk\":%u,\"rank\":%u,\"adapter_fb_ms\":%.3f,\"stream_steps_ms\":%.3f,"
           "\"open_close_ms\":%.3f,"
           "\"fwd_chunk_ms\":%.3f,\"bwd_chunk_ms\":%.3f,\"decode_seqs\":%u,"
           "\"decode_ms\":%.3f,\"decode_plus_fwd_chunk_ms\":%.3f}\n",
           api->name, m.layers, m.width, B, T, chunk, rank, bench_median(tfb, repeat),
           bench_median(tstream, repeat), bench_median(topen, repeat),
           bench_median(tfwd, nf), bench_median(tbwd, nb), S, bench_median(tdec, repeat),
           bench_median(tco, repeat));
    api->context_destroy(ctx);
    free(tok);
    free(tgt);
    free(tfb);
    free(tstream);
    free(topen);
    free(tfwd);
    free(tbwd);
    free(tables);
    free(seqs);
    free(logits);
    free(tdec);
    free(tco);
    dlclose(lib);
    return 0;
}
