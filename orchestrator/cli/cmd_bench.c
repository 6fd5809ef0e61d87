/*
 * cmd_bench.c - `orch bench train|infer`: training and inference speed of an
 * engine on the model of a config file, next to the machine limits measured
 * in the same process (see bench.h). Prints a table, or one JSON line with
 * --json.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/bench/bench.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/config.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"

#define BENCH_DEFAULT_CONFIG "configs/bench-gpt2-124m.json"

static const char usage_text[] =
    "usage: orch bench train [--engine=E] [--config FILE] [--batch B] [--seq T]\n"
    "                        [--steps N] [--warmup N] [--threads N]\n"
    "                        [--options S] [--precision fp32|bf16] [--seed N]\n"
    "                        [--peak-gflops G] [--json] [--trust-config-engine]\n"
    "       orch bench infer [--engine=E] [--config FILE] [--prompt N]\n"
    "                        [--decode-prompt N] [--decode-steps N]\n"
    "                        [--block-size N] [--threads N] [--options S]\n"
    "                        [--precision fp32|bf16] [--quantize int8]\n"
    "                        [--kv-cache-dtype f32|bf16|int8]\n"
    "                        [--seed N] [--json] [--trust-config-engine]\n"
    "\n"
    "Benchmarks an engine on the model of FILE's \"model\" section "
    "(default\n" BENCH_DEFAULT_CONFIG
    "; random weights). Engine, threads and options default to\n"
    "the config's \"engine\" section, batch and seq to train.micro_batch and\n"
    "train.seq_len. --json prints one JSON line instead of the table.\n"
    "The config's engine.name must be mock, cpu or cuda unless\n"
    "--trust-config-engine is given (a library file or path is otherwise\n"
    "only taken from --engine).\n"
    "\n"
    "--precision P adds precision=P to the engine options (the cpu engine's\n"
    "  bf16 path: bf16 products, fp32 master weights) and selects the peaks\n"
    "  below; --quantize int8 adds weights=int8 (int8 weights for decoding);\n"
    "  --kv-cache-dtype T adds kv=T (the cpu engine's KV-cache storage; its\n"
    "  default stores bf16 with weights=int8, f32 otherwise).\n"
    "\n"
    "train: grads_zero + forward_backward + optimizer_step (AdamW, clip 1.0)\n"
    "  per step; --warmup untimed steps (2) then --steps timed ones (10).\n"
    "  Fields: tokens_per_s, ms_per_step (median step), model_gflops_per_s,\n"
    "  mfu_physical, physical_peak_gflops, best_gemm_gflops_per_s, mfu,\n"
    "  peak_rss_mb (the process's peak resident memory).\n"
    "  Model FLOPs per training token = 6*N + 12*layers*seq*width, where N\n"
    "  counts every parameter except the position embedding (wpe).\n"
    "  mfu_physical = model FLOP/s / the physical peak of the precision:\n"
    "  cores used x clock x FLOPs per cycle per core, the clock measured here\n"
    "  (dependent integer adds on every thread), FLOPs per cycle from the best\n"
    "  ISA of the CPU: fp32 AVX-512 FMA 64, AVX2 FMA 32, SSE 8; bf16 AMX-BF16\n"
    "  1024, AVX512_BF16 128 (int8 ops: AMX-INT8 2048, AVX512_VNNI 256).\n"
    "  mfu = model FLOP/s / the best GEMM of the precision measured in this\n"
    "  process over the model's training shapes ([batch*seq, out, in] of\n"
    "  c_attn, c_fc, mlp.c_proj and the LM head) with the same threads: fp32\n"
    "  single-threaded OpenBLAS sgemm per thread on column slices\n"
    "  (sgemm_peak_gflops_per_s), bf16 oneDNN's matmul.\n"
    "  --peak-gflops G: compute mfu against G GFLOP/s instead (e.g. a GPU's\n"
    "  dense peak for the math mode used: H200 fp32 67000, tf32 494700,\n"
    "  bf16 989400); the JSON then has peak_gflops_per_s and\n"
    "  mfu_peak = \"given\".\n"
    "\n"
    "infer: prefill_tokens_per_s for one --prompt (512) token prompt;\n"
    "  decode_tokens_per_s_1/_4/_16: aggregate tokens/s of 1, 4 and 16\n"
    "  sequences decoding together (each after a --decode-prompt (32) token\n"
    "  prompt; median of --decode-steps (64) steps); mem_bw_gb_per_s: the\n"
    "  better of a vectorised read-only sum and a STREAM triad over 3 x 128\n"
    "  MiB on all threads, measured right before and after the single-\n"
    "  sequence decode (the better counts); decode_bw_fraction = weight\n"
    "  bytes per step * single-sequence steps/s / mem_bw (weight bytes =\n"
    "  4*(N + width)).\n"
    "\n"
    "Exit status: 0 done, 1 engine failure, 2 bad usage, config or engine.\n";

static void add_num_or_null(cJSON *o, const char *key, double v, int ok) {
    if (ok)
        cJSON_AddNumberToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

static void print_json(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(o);
}

/* Everything `orch bench` was asked for, after the flags and the config. */
typedef struct bench_args {
    int train;
    const char *engine, *config, *options, *precision, *quantize, *kv_dtype;
    uint32_t batch, seq, steps, warmup, threads;
    uint32_t prompt, dprompt, dsteps, block;
    int have_threads, have_seed, json, trust_engine;
    double peak_given;
    uint64_t seed;
    orch_model_desc model;
    char engine_buf[CONFIG_PATH_MAX], options_buf[1024];
} bench_args;

/* Flags of `bench train` or `bench infer` (argv[0] is the kind); 0, or 1 with
 * the exit status in *st. */
static int parse_flags(int argc, char **argv, bench_args *a, int *st) {
    const flag_spec common[] = {
        { "--engine", FLAG_STRING, &a->engine, "E", .help = NULL },
        { "--config", FLAG_STRING, &a->config, "FILE", .help = NULL },
        { "--options", FLAG_STRING, &a->options, "S", .help = NULL },
        { "--threads", FLAG_U32, &a->threads, "N", .help = NULL,
          .seen = &a->have_threads },
        { "--seed", FLAG_U64, &a->seed, "N", .help = NULL, .seen = &a->have_seed },
        { "--json", FLAG_TRUE, &a->json, NULL, .help = NULL },
        { "--trust-config-engine", FLAG_TRUE, &a->trust_engine, NULL, .help = NULL },
        { "--precision", FLAG_STRING, &a->precision, "P", .help = NULL },
    };
    const flag_spec train_only[] = {
        { "--batch", FLAG_U32, &a->batch, "B", .help = NULL, .min = 1 },
        { "--seq", FLAG_U32, &a->seq, "T", .help = NULL, .min = 1 },
        { "--steps", FLAG_U32, &a->steps, "N", .help = NULL, .min = 1 },
        { "--warmup", FLAG_U32, &a->warmup, "N", .help = NULL },
        { "--peak-gflops", FLAG_DOUBLE, &a->peak_given, "G", .help = NULL, .dmin = 0,
          .dmax = HUGE_VAL, .dmin_open = 1 },
    };
    const flag_spec infer_only[] = {
        { "--prompt", FLAG_U32, &a->prompt, "N", .help = NULL },
        { "--decode-prompt", FLAG_U32, &a->dprompt, "N", .help = NULL },
        { "--decode-steps", FLAG_U32, &a->dsteps, "N", .help = NULL },
        { "--block-size", FLAG_U32, &a->block, "N", .help = NULL, .min = 1 },
        { "--quantize", FLAG_STRING, &a->quantize, "int8", .help = NULL },
        { "--kv-cache-dtype", FLAG_STRING, &a->kv_dtype, "T", .help = NULL },
    };
    /* The table of this kind: the common flags, then its own, then the end. */
    flag_spec flags[16];
    size_t n = 0;
    for (size_t k = 0; k < sizeof common / sizeof common[0]; k++) flags[n++] = common[k];
    const flag_spec *own = a->train ? train_only : infer_only;
    size_t n_own = a->train ? sizeof train_only / sizeof train_only[0]
                            : sizeof infer_only / sizeof infer_only[0];
    for (size_t k = 0; k < n_own; k++) flags[n++] = own[k];
    memset(&flags[n], 0, sizeof flags[n]);
    const flags_cmd cmd = {
        .name = a->train ? "bench train" : "bench infer",
        .usage = usage_text,
        .flags = flags,
    };
    return flags_parse(&cmd, argc, argv, st);
}

/* The value of key in an engine options string ("a=1,b=2" or ';'), into out
 * (empty when absent). */
static void option_value(const char *opts, const char *key, char *out, size_t cap) {
    out[0] = '\0';
    const size_t klen = strlen(key);
    for (const char *p = opts; p && *p;) {
        const char *end = p + strcspn(p, ",;");
        if ((size_t)(end - p) > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t n = (size_t)(end - p) - klen - 1;
            if (n >= cap) n = cap - 1;
            memcpy(out, p + klen + 1, n);
            out[n] = '\0';
        }
        p = *end ? end + 1 : end;
    }
}

/* Append key=value (a flag's value, one of the '|' choices) to the engine
 * options; 0, or -1 after a one-line error. */
static int add_option_word(bench_args *a, const char *key, const char *value,
                           const char *choices) {
    if (!value) return 0;
    int ok = 0;
    for (const char *p = choices; *p;) {
        size_t n = strcspn(p, "|");
        if (strlen(value) == n && strncmp(p, value, n) == 0) ok = 1;
        p += n + (p[n] == '|');
    }
    if (!ok) {
        util_error("bench: --%s '%s' is not one of %s",
                   strcmp(key, "weights") == 0 ? "quantize"
                   : strcmp(key, "kv") == 0    ? "kv-cache-dtype"
                                               : key,
                   value, choices);
        return -1;
    }
    size_t used = strlen(a->options_buf);
    int w = snprintf(a->options_buf + used, sizeof a->options_buf - used, "%s%s=%s",
                     used ? "," : "", key, value);
    if (w < 0 || (size_t)w >= sizeof a->options_buf - used) {
        util_error("bench: engine options too long");
        return -1;
    }
    return 0;
}

/* The config's defaults for what the flags left open; 0 or an exit status. */
static int resolve_config(bench_args *a) {
    char err[2048];
    orch_config *cfg = NULL;
    if (config_load_file(a->config, &cfg, err, sizeof err) != 0) {
        util_error("bench: %s", err);
        return ORCH_EXIT_USAGE;
    }
    config_model_desc(cfg, &a->model);
    if (!a->engine && engine_check_config_name(cfg->engine.name, a->config,
                                               a->trust_engine, err, sizeof err) != 0) {
        util_error("bench: %s", err);
        config_free(cfg);
        return ORCH_EXIT_USAGE;
    }
    snprintf(a->engine_buf, sizeof a->engine_buf, "%s",
             a->engine ? a->engine : cfg->engine.name);
    snprintf(a->options_buf, sizeof a->options_buf, "%s",
             a->options ? a->options : cfg->engine.options);
    if (add_option_word(a, "precision", a->precision, "fp32|bf16") != 0 ||
        add_option_word(a, "weights", a->quantize, "int8") != 0 ||
        add_option_word(a, "kv", a->kv_dtype, "f32|bf16|int8") != 0) {
        config_free(cfg);
        return ORCH_EXIT_USAGE;
    }
    if (!a->have_threads) a->threads = cfg->engine.threads;
    if (!a->have_seed) a->seed = cfg->train.seed;
    if (!a->batch) a->batch = cfg->train.micro_batch;
    if (!a->seq) a->seq = cfg->train.seq_len;
    config_free(cfg);
    const uint32_t ctx = a->model.context;
    if (a->train && a->seq > ctx) {
        util_error("bench train: --seq %u exceeds the model context %u", a->seq, ctx);
        return ORCH_EXIT_USAGE;
    }
    if (!a->train && (a->prompt == 0 || a->dprompt == 0 || a->dsteps == 0 ||
                      (uint64_t)a->dprompt + a->dsteps + 1 > ctx)) {
        util_error("bench infer: --prompt, --decode-prompt and --decode-steps must "
                   "be > 0 and decode-prompt + decode-steps must stay below the "
                   "model context %u",
                   ctx);
        return ORCH_EXIT_USAGE;
    }
    return 0;
}

static void print_train(const bench_args *a, const engine_handle *h,
                        bench_train_result *r) {
    const int peak = r->sgemm_peak_gflops_per_s > 0;
    const double given = a->peak_given;
    if (given > 0) r->mfu = r->model_gflops_per_s / given;
    if (a->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "bench", "train");
        cJSON_AddStringToObject(j, "engine", h->api->name);
        cJSON_AddNumberToObject(j, "params", (double)r->params);
        cJSON_AddNumberToObject(j, "batch", r->batch);
        cJSON_AddNumberToObject(j, "seq_len", r->seq_len);
        cJSON_AddNumberToObject(j, "steps", r->steps);
        cJSON_AddNumberToObject(j, "threads", r->threads);
        cJSON_AddNumberToObject(j, "tokens_per_s", r->tokens_per_s);
        cJSON_AddNumberToObject(j, "ms_per_step", r->ms_per_step);
        cJSON_AddNumberToObject(j, "ms_per_step_mean", r->ms_per_step_mean);
        cJSON_AddNumberToObject(j, "flops_per_token", r->flops_per_token);
        cJSON_AddNumberToObject(j, "model_gflops_per_s", r->model_gflops_per_s);
        add_num_or_null(j, "sgemm_peak_gflops_per_s", r->sgemm_peak_gflops_per_s, peak);
        cJSON_AddStringToObject(j, "precision", r->precision);
        cJSON_AddStringToObject(j, "best_gemm", r->best_gemm);
        add_num_or_null(j, "best_gemm_gflops_per_s", r->best_gemm_gflops_per_s,
                        r->best_gemm_gflops_per_s > 0);
        cJSON_AddNumberToObject(j, "cores", r->peak.cores);
        add_num_or_null(j, "clock_ghz", r->peak.ghz, r->peak.ghz > 0);
        cJSON_AddStringToObject(j, "peak_isa",
                                strcmp(r->precision, "bf16") == 0 ? r->peak.bf16.isa
                                                                  : r->peak.fp32.isa);
        add_num_or_null(j, "physical_peak_gflops", r->physical_peak_gflops,
                        r->physical_peak_gflops > 0);
        add_num_or_null(j, "mfu_physical", r->mfu_physical, r->physical_peak_gflops > 0);
        cJSON_AddNumberToObject(j, "peak_rss_mb", r->peak_rss_mb);
        if (given > 0) {
            cJSON_AddNumberToObject(j, "peak_gflops_per_s", given);
            cJSON_AddNumberToObject(j, "mfu", r->mfu);
            cJSON_AddStringToObject(j, "mfu_peak", "given");
        } else {
            add_num_or_null(j, "mfu", r->mfu, peak);
            cJSON_AddStringToObject(j, "mfu_peak", "sgemm");
        }
        cJSON_AddNumberToObject(j, "first_loss", r->first_loss);
        cJSON_AddNumberToObject(j, "last_loss", r->last_loss);
        print_json(j);
        return;
    }
    const machine_peak_path *pp = machine_peak_path_of(&r->peak, r->precision);
    printf("engine %s, %.1fM parameters, batch %u x seq %u, %u threads, "
           "%u timed steps, %s\n",
           h->api->name, r->params / 1e6, r->batch, r->seq_len, r->threads, r->steps,
           r->precision);
    printf("  ms_per_step (median)     %10.1f   (mean %.1f)\n", r->ms_per_step,
           r->ms_per_step_mean);
    printf("  tokens_per_s             %10.1f\n", r->tokens_per_s);
    printf("  model_gflops_per_s       %10.1f   (%.3g FLOPs/token)\n",
           r->model_gflops_per_s, r->flops_per_token);
    if (r->physical_peak_gflops > 0)
        printf("  physical peak            %10.1f   (%d cores x %.2f GHz measured x %.0f "
               "FLOPs/cycle, %s)\n",
               r->physical_peak_gflops, r->peak.cores, r->peak.ghz,
               pp ? pp->per_cycle : 0, pp ? pp->isa : "?");
    else
        printf("  physical peak            n/a (no native %s path or no clock)\n",
               r->precision);
    if (r->physical_peak_gflops > 0)
        printf("  mfu_physical             %10.3f\n", r->mfu_physical);
    if (r->best_gemm_gflops_per_s > 0)
        printf("  best GEMM                %10.1f   (%s, model shapes)\n",
               r->best_gemm_gflops_per_s, r->best_gemm);
    if (peak && strcmp(r->precision, "fp32") != 0)
        printf("  sgemm_peak_gflops_per_s  %10.1f\n", r->sgemm_peak_gflops_per_s);
    printf("  peak RSS                 %10.0f MiB\n", r->peak_rss_mb);
    if (given > 0) {
        printf("  peak (given)             %10.1f\n", given);
        printf("  mfu                      %10.3f   (against the given peak)\n", r->mfu);
    } else if (r->best_gemm_gflops_per_s > 0) {
        printf("  mfu (vs best GEMM)       %10.3f\n", r->mfu);
    } else {
        printf("  best GEMM                n/a (%s not in this process)\n", r->best_gemm);
    }
    printf("  loss                     %10.4f -> %.4f\n", r->first_loss, r->last_loss);
}

static void print_infer(const bench_args *a, const engine_handle *h,
                        const bench_infer_result *r) {
    const double ratio = r->decode_tokens_per_s[0] > 0
                             ? r->decode_tokens_per_s[2] / r->decode_tokens_per_s[0]
                             : 0.0;
    if (a->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "bench", "infer");
        cJSON_AddStringToObject(j, "engine", h->api->name);
        cJSON_AddNumberToObject(j, "threads", r->threads);
        cJSON_AddNumberToObject(j, "prompt_len", r->prompt_len);
        cJSON_AddNumberToObject(j, "prefill_tokens_per_s", r->prefill_tokens_per_s);
        cJSON_AddNumberToObject(j, "decode_prompt", r->decode_prompt);
        cJSON_AddNumberToObject(j, "decode_steps", r->decode_steps);
        cJSON_AddNumberToObject(j, "decode_tokens_per_s_1", r->decode_tokens_per_s[0]);
        cJSON_AddNumberToObject(j, "decode_tokens_per_s_4", r->decode_tokens_per_s[1]);
        cJSON_AddNumberToObject(j, "decode_tokens_per_s_16", r->decode_tokens_per_s[2]);
        cJSON_AddNumberToObject(j, "decode_speedup_16", ratio);
        cJSON_AddNumberToObject(j, "read_gb_per_s", r->read_gb_per_s);
        cJSON_AddNumberToObject(j, "triad_gb_per_s", r->triad_gb_per_s);
        cJSON_AddNumberToObject(j, "mem_bw_gb_per_s", r->mem_bw_gb_per_s);
        cJSON_AddNumberToObject(j, "weight_bytes", r->weight_bytes);
        cJSON_AddStringToObject(j, "weights", r->weights);
        cJSON_AddNumberToObject(j, "decode_bw_fraction", r->decode_bw_fraction);
        print_json(j);
        return;
    }
    printf("engine %s, %u threads, KV blocks of %u\n", h->api->name, r->threads,
           a->block);
    printf("  prefill_tokens_per_s     %10.1f   (%u-token prompt)\n",
           r->prefill_tokens_per_s, r->prompt_len);
    for (int k = 0; k < BENCH_DECODE_BATCHES; k++)
        printf("  decode_tokens_per_s_%-4u %10.1f\n", bench_decode_batches[k],
               r->decode_tokens_per_s[k]);
    printf("  decode 16 / decode 1     %10.2fx\n", ratio);
    printf("  mem_bw_gb_per_s          %10.1f   (read %.1f, triad %.1f)\n",
           r->mem_bw_gb_per_s, r->read_gb_per_s, r->triad_gb_per_s);
    printf("  decode_bw_fraction       %10.3f   (%.0f MB of %s weights/step)\n",
           r->decode_bw_fraction, r->weight_bytes / 1e6, r->weights);
}

int cmd_bench(int argc, char **argv) {
    int train = argc >= 2 && strcmp(argv[1], "train") == 0;
    if (!train && !(argc >= 2 && strcmp(argv[1], "infer") == 0)) {
        if (flags_wants_help(argc, argv)) {
            fputs(usage_text, stdout);
            return ORCH_EXIT_OK;
        }
        util_error("bench: expected 'train' or 'infer' (see orch bench --help)");
        return ORCH_EXIT_USAGE;
    }
    bench_args a;
    memset(&a, 0, sizeof a);
    a.train = train;
    a.config = BENCH_DEFAULT_CONFIG;
    a.steps = 10;
    a.warmup = 2;
    a.prompt = 512;
    a.dprompt = 32;
    a.dsteps = 64;
    a.block = 16;
    int rc;
    if (parse_flags(argc - 1, argv + 1, &a, &rc)) return rc;
    if ((rc = resolve_config(&a)) != 0) return rc;

    char err[2048];
    engine_handle h;
    if (engine_load(a.engine_buf, &h, err, sizeof err) != 0) {
        util_error("%s", err);
        return ORCH_EXIT_USAGE;
    }
    const char *opts = a.options_buf[0] ? a.options_buf : NULL;
    rc = ORCH_EXIT_OK;
    if (train) {
        char precision[16];
        option_value(opts, "precision", precision, sizeof precision);
        if (strcmp(precision, "auto") == 0) { /* the peaks need the path */
            util_error("bench train: precision=auto: name the precision to measure "
                       "(--precision fp32 or bf16)");
            engine_unload(&h);
            return ORCH_EXIT_USAGE;
        }
        bench_train_opts o = { a.batch,   a.seq,  a.steps, a.warmup,
                               a.threads, a.seed, opts,    precision };
        bench_train_result r;
        if (bench_train(&h, &a.model, &o, &r, err, sizeof err) != 0) {
            util_error("bench train: %s", err);
            rc = ORCH_EXIT_FAILURE;
        } else {
            print_train(&a, &h, &r);
        }
    } else {
        char weights[16];
        option_value(opts, "weights", weights, sizeof weights);
        bench_infer_opts o = { a.prompt,  a.dprompt, a.dsteps, a.block,
                               a.threads, a.seed,    opts,     weights };
        bench_infer_result r;
        if (bench_infer(&h, &a.model, &o, &r, err, sizeof err) != 0) {
            util_error("bench infer: %s", err);
            rc = ORCH_EXIT_FAILURE;
        } else {
            print_infer(&a, &h, &r);
        }
    }
    engine_unload(&h);
    return rc;
}
