/*
 * engine_decode_bench.c - decode scaling of an engine library: aggregate
 * tokens/s when 1, 4, 16, 64 ... sequences decode together (one token each
 * per infer_forward, logits of every sequence copied back), so the gain of
 * batching can be read directly (the CUDA engine's target: 64 sequences at
 * least 20x the single-sequence rate). Loads the engine with dlopen and talks
 * to it through engine_api/orch_engine.h only (no orchestrator code).
 *
 * usage: engine_decode_bench ENGINE.so [--batches 1,64] [--prompt 32]
 *            [--steps 32] [--warmup 3] [--block-size 16] [--options S]
 *            [--vocab 50257 --context 1024 --layers 12 --heads 12 --width 768]
 * Prints one JSON line: decode_tokens_per_s_<S> for every S (median step),
 * and speedup_<S> = that / the rate of the first batch size.
 * Exit status: 0 done, 1 engine failure, 2 bad usage or engine not loadable.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_api/orch_engine.h"
#include "tools/bench_util.h"

#define MAX_BATCHES 16

static const orch_engine_api *api;
static orch_engine_ctx *ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, int32_t st) {
    fprintf(stderr, "engine_decode_bench: %s: %s: %s\n", what, api->status_string(st),
            ctx ? api->last_error(ctx) : "");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        printf(
            "usage: engine_decode_bench ENGINE.so [--batches 1,64] [--prompt 32] "
            "[--steps 32]\n"
            "       [--warmup 3] [--block-size 16] [--options S] [--vocab N] "
            "[--context N]\n"
            "       [--layers N] [--heads N] [--width N] [--arch gpt2|llama]\n"
            "       [--kv-heads N] [--mlp N]\n"
            "Aggregate decode tokens/s of S sequences decoding together, for each S.\n");
        return argc < 2 ? 2 : 0;
    }
    const char *path = argv[1], *options = NULL;
    uint32_t batches[MAX_BATCHES] = { 1, 64 }, n_batches = 2;
    uint32_t prompt = 32, steps = 32, warmup = 3, bs = 16;
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
        uint32_t *dst = NULL;
        if (strcmp(a, "--prompt") == 0)
            dst = &prompt;
        else if (strcmp(a, "--steps") == 0)
            dst = &steps;
        else if (strcmp(a, "--warmup") == 0)
            dst = &warmup;
        else if (strcmp(a, "--block-size") == 0)
            dst = &bs;
        else if (strcmp(a, "--vocab") == 0)
            dst = &m.vocab_size;
        else if (strcmp(a, "--context") == 0)
            dst = &m.context;
        else if (strcmp(a, "--layers") == 0)
            dst = &m.layers;
        else if (strcmp(a, "--heads") == 0)
            dst = &m.heads;
        else if (strcmp(a, "--width") == 0)
            dst = &m.width;
        else if (strcmp(a, "--kv-heads") == 0)
            dst = &m.kv_heads;
        else if (strcmp(a, "--mlp") == 0)
            dst = &m.mlp_width;
        if (v && dst) {
            if (bench_parse_u32(v, dst) != 0) {
                fprintf(stderr, "engine_decode_bench: %s expects a number, got '%s'\n", a,
                        v);
                return 2;
            }
            i++;
        } else if (v && strcmp(a, "--arch") == 0) {
            if (strcmp(v, "gpt2") != 0 && strcmp(v, "llama") != 0) {
                fprintf(stderr,
                        "engine_decode_bench: --arch is gpt2 or llama, not '%s'\n", v);
                return 2;
            }
            m.arch = strcmp(v, "llama") == 0 ? ORCH_ARCH_LLAMA : ORCH_ARCH_GPT2;
            i++;
        } else if (v && strcmp(a, "--options") == 0) {
            options = v;
            i++;
        } else if (v && strcmp(a, "--batches") == 0) {
            n_batches = 0;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t && n_batches < MAX_BATCHES;
                 t = strtok(NULL, ","))
                if (bench_parse_u32(t, &batches[n_batches++]) != 0 ||
                    batches[n_batches - 1] == 0) {
                    fprintf(stderr, "engine_decode_bench: bad --batches '%s'\n", v);
                    return 2;
                }
            i++;
        } else {
            fprintf(stderr, "engine_decode_bench: unknown or incomplete argument '%s'\n",
                    a);
            return 2;
        }
    }
    if (n_batches == 0 || steps == 0 || bs == 0 || prompt == 0 ||
        prompt + warmup + steps > m.context) {
        fprintf(stderr,
                "engine_decode_bench: need batches, steps, block size and prompt > 0 "
                "and prompt + warmup + steps <= context\n");
        return 2;
    }

    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        fprintf(stderr, "engine_decode_bench: cannot load %s: %s\n", path, dlerror());
        return 2;
    }
    orch_engine_get_api_fn get = NULL;
    void *sym = dlsym(dl, ORCH_ENGINE_ENTRY_SYMBOL);
    memcpy(&get, &sym, sizeof get);
    api = get ? get(ORCH_ENGINE_ABI_MAJOR) : NULL;
    if (!api || api->abi_major != ORCH_ENGINE_ABI_MAJOR ||
        !(api->capabilities & ORCH_CAP_INFER)) {
        fprintf(stderr,
                "engine_decode_bench: %s is not an ABI %u engine with inference\n", path,
                ORCH_ENGINE_ABI_MAJOR);
        return 2;
    }
    char msg[256] = "";
    if (api->probe(msg, sizeof msg) != ORCH_OK) {
        fprintf(stderr, "engine_decode_bench: %s cannot run here: %s\n", path, msg);
        return 2;
    }
    orch_engine_options o = { sizeof o, 0, 1, options };
    char err[1024] = "";
    int32_t st = api->context_create(&m, &o, &ctx, err, sizeof err);
    if (st != ORCH_OK) {
        fprintf(stderr, "engine_decode_bench: context_create: %s: %s\n",
                api->status_string(st), err);
        return 1;
    }
    uint32_t max_s = 0;
    for (uint32_t b = 0; b < n_batches; b++)
        max_s = batches[b] > max_s ? batches[b] : max_s;
    const uint32_t len = prompt + warmup + steps;
    const uint32_t per_seq = (len + bs - 1) / bs;
    if ((st = api->kv_configure(ctx, bs, max_s * per_seq)) != ORCH_OK)
        return fail("kv_configure", st);
    int32_t *tables = malloc((size_t)max_s * per_seq * sizeof(int32_t));
    int32_t *toks = malloc((size_t)max_s * len * sizeof(int32_t));
    orch_seq_input *seqs = calloc(max_s, sizeof(orch_seq_input));
    float *logits = malloc((size_t)max_s * m.vocab_size * sizeof(float));
    double *times = malloc(steps * sizeof(double));
    if (!tables || !toks || !seqs || !logits || !times) {
        fprintf(stderr, "engine_decode_bench: out of memory\n");
        return 1;
    }
    uint64_t rng = 88172645463325252ull;
    for (uint64_t i = 0; i < (uint64_t)max_s * len; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        toks[i] = (int32_t)(rng % m.vocab_size);
    }
    for (uint32_t i = 0; i < max_s * per_seq; i++) tables[i] = (int32_t)i;
    orch_infer_batch batch = { sizeof batch, 0, sizeof(orch_seq_input), 0, seqs };
    double rate[MAX_BATCHES];
    for (uint32_t b = 0; b < n_batches; b++) {
        const uint32_t S = batches[b];
        batch.n_seqs = S;
        for (uint32_t s = 0; s < S; s++) {
            memset(&seqs[s], 0, sizeof seqs[s]);
            seqs[s].tokens = toks + (size_t)s * len;
            seqs[s].n_tokens = prompt;
            seqs[s].start_pos = 0;
            seqs[s].block_table = tables + (size_t)s * per_seq;
            seqs[s].n_blocks = per_seq;
            seqs[s].logits_mode = ORCH_LOGITS_LAST;
        }
        if ((st = api->infer_forward(ctx, &batch, logits, (uint64_t)S * m.vocab_size)) !=
            ORCH_OK)
            return fail("prefill", st);
        for (uint32_t k = 0; k < warmup + steps; k++) {
            for (uint32_t s = 0; s < S; s++) {
                seqs[s].start_pos = prompt + k;
                seqs[s].tokens = toks + (size_t)s * len + prompt + k;
                seqs[s].n_tokens = 1;
            }
            double t0 = now_s();
            st = api->infer_forward(ctx, &batch, logits, (uint64_t)S * m.vocab_size);
            double t1 = now_s();
            if (st != ORCH_OK) return fail("decode", st);
            if (k >= warmup) times[k - warmup] = t1 - t0;
        }
        qsort(times, steps, sizeof(double), bench_cmp_double);
        double med = steps % 2 ? times[steps / 2]
                               : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
        rate[b] = (double)S / med;
    }
    printf("{\"bench\":\"decode_scaling\",\"engine\":\"%s\",\"options\":\"%s\","
           "\"prompt\":%u,"
           "\"steps\":%u,\"block_size\":%u",
           api->name, options ? options : "", prompt, steps, bs);
    for (uint32_t b = 0; b < n_batches; b++)
        printf(",\"decode_tokens_per_s_%u\":%.3f", batches[b], rate[b]);
    for (uint32_t b = 1; b < n_batches; b++)
        printf(",\"speedup_%u\":%.3f", batches[b], rate[b] / rate[0]);
    printf("}\n");
    api->context_destroy(ctx);
    free(tables);
    free(toks);
    free(seqs);
    free(logits);
    free(times);
    return 0;
}
