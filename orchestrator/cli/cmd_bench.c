/*
 * cmd_bench.c - `orch bench train|infer`: training and inference speed of an
 * engine on the model of a config file, next to the machine limits measured
 * in the same process (see bench.h). Prints a table, or one JSON line with
 * --json.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/bench/bench.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/core/config.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"

#define BENCH_DEFAULT_CONFIG "configs/bench-gpt2-124m.json"

static void usage(void) {
    printf(
        "usage: orch bench train [--engine=E] [--config FILE] [--batch B] [--seq T]\n"
        "                        [--steps N] [--warmup N] [--threads N]\n"
        "                        [--options S] [--seed N] [--peak-gflops G]\n"
        "                        [--json]\n"
        "       orch bench infer [--engine=E] [--config FILE] [--prompt N]\n"
        "                        [--decode-prompt N] [--decode-steps N]\n"
        "                        [--block-size N] [--threads N] [--options S]\n"
        "                        [--seed N] [--json]\n"
        "\n"
        "Benchmarks an engine on the model of FILE's \"model\" section (default\n"
        "%s; random weights). Engine, threads and options default to\n"
        "the config's \"engine\" section, batch and seq to train.micro_batch and\n"
        "train.seq_len. --json prints one JSON line instead of the table.\n"
        "\n"
        "train: grads_zero + forward_backward + optimizer_step (AdamW, clip 1.0)\n"
        "  per step; --warmup untimed steps (2) then --steps timed ones (10).\n"
        "  Fields: tokens_per_s, ms_per_step (median step), model_gflops_per_s,\n"
        "  sgemm_peak_gflops_per_s, mfu.\n"
        "  Model FLOPs per training token = 6*N + 12*layers*seq*width, where N\n"
        "  counts every parameter except the position embedding (wpe).\n"
        "  mfu = model FLOP/s / sgemm peak; the peak is the best OpenBLAS sgemm\n"
        "  rate over the model's training shapes ([batch*seq, out, in] of c_attn,\n"
        "  c_fc, mlp.c_proj and the LM head), measured in this process with the\n"
        "  same threads, each running single-threaded sgemm on a column slice.\n"
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
        "Exit status: 0 done, 1 engine failure, 2 bad usage, config or engine.\n",
        BENCH_DEFAULT_CONFIG);
}

static int parse_u32(const char *flag, const char *v, uint32_t *out) {
    uint64_t x;
    if (util_parse_u64(v, &x) != 0 || x > UINT32_MAX) {
        util_error("bench: %s expects a non-negative integer, got '%s'", flag, v);
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

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

int cmd_bench(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage();
        return ORCH_EXIT_OK;
    }
    if (argc < 2 || (strcmp(argv[1], "train") != 0 && strcmp(argv[1], "infer") != 0)) {
        util_error("bench: expected 'train' or 'infer' (see orch bench --help)");
        return ORCH_EXIT_USAGE;
    }
    const int train = strcmp(argv[1], "train") == 0;
    const char *engine = NULL, *config = BENCH_DEFAULT_CONFIG, *options = NULL;
    uint32_t batch = 0, seq = 0, steps = 10, warmup = 2, threads = 0;
    uint32_t prompt = 512, dprompt = 32, dsteps = 64, block = 16;
    int have_threads = 0, have_seed = 0, json = 0;
    double peak_given = 0;
    uint64_t seed = 0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if ((v = util_flag_value("--engine", argc, argv, &i))) engine = v;
        else if ((v = util_flag_value("--config", argc, argv, &i))) config = v;
        else if ((v = util_flag_value("--options", argc, argv, &i))) options = v;
        else if ((v = util_flag_value("--threads", argc, argv, &i))) {
            if (parse_u32("--threads", v, &threads)) return ORCH_EXIT_USAGE;
            have_threads = 1;
        } else if ((v = util_flag_value("--seed", argc, argv, &i))) {
            if (util_parse_u64(v, &seed) != 0) {
                util_error("bench: --seed expects an integer, got '%s'", v);
                return ORCH_EXIT_USAGE;
            }
            have_seed = 1;
        } else if (train && (v = util_flag_value("--batch", argc, argv, &i))) {
            if (parse_u32("--batch", v, &batch) || batch == 0) {
                if (batch == 0) util_error("bench: --batch must be > 0");
                return ORCH_EXIT_USAGE;
            }
        } else if (train && (v = util_flag_value("--seq", argc, argv, &i))) {
            if (parse_u32("--seq", v, &seq) || seq == 0) {
                if (seq == 0) util_error("bench: --seq must be > 0");
                return ORCH_EXIT_USAGE;
            }
        } else if (train && (v = util_flag_value("--steps", argc, argv, &i))) {
            if (parse_u32("--steps", v, &steps) || steps == 0) {
                if (steps == 0) util_error("bench: --steps must be > 0");
                return ORCH_EXIT_USAGE;
            }
        } else if (train && (v = util_flag_value("--warmup", argc, argv, &i))) {
            if (parse_u32("--warmup", v, &warmup)) return ORCH_EXIT_USAGE;
        } else if (!train && (v = util_flag_value("--prompt", argc, argv, &i))) {
            if (parse_u32("--prompt", v, &prompt)) return ORCH_EXIT_USAGE;
        } else if (!train && (v = util_flag_value("--decode-prompt", argc, argv, &i))) {
            if (parse_u32("--decode-prompt", v, &dprompt)) return ORCH_EXIT_USAGE;
        } else if (!train && (v = util_flag_value("--decode-steps", argc, argv, &i))) {
            if (parse_u32("--decode-steps", v, &dsteps)) return ORCH_EXIT_USAGE;
        } else if (!train && (v = util_flag_value("--block-size", argc, argv, &i))) {
            if (parse_u32("--block-size", v, &block) || block == 0) {
                if (block == 0) util_error("bench: --block-size must be > 0");
                return ORCH_EXIT_USAGE;
            }
        } else if (train && (v = util_flag_value("--peak-gflops", argc, argv, &i))) {
            if (util_parse_double(v, &peak_given) != 0 || !(peak_given > 0)) {
                util_error("bench: --peak-gflops expects a number > 0, got '%s'", v);
                return ORCH_EXIT_USAGE;
            }
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            util_error("bench %s: unknown argument '%s' (see orch bench --help)",
                       argv[1], argv[i]);
            return ORCH_EXIT_USAGE;
        }
    }

    char err[2048];
    orch_config *cfg = NULL;
    if (config_load_file(config, &cfg, err, sizeof err) != 0) {
        util_error("bench: %s", err);
        return ORCH_EXIT_USAGE;
    }
    orch_model_desc model;
    config_model_desc(cfg, &model);
    if (!engine) engine = cfg->engine.name;
    if (!have_threads) threads = cfg->engine.threads;
    if (!options && cfg->engine.options[0]) options = cfg->engine.options;
    if (!have_seed) seed = cfg->train.seed;
    if (!batch) batch = cfg->train.micro_batch;
    if (!seq) seq = cfg->train.seq_len;
    char engine_buf[CONFIG_PATH_MAX], options_buf[1024];
    snprintf(engine_buf, sizeof engine_buf, "%s", engine);
    snprintf(options_buf, sizeof options_buf, "%s", options ? options : "");
    config_free(cfg);

    if (train && seq > model.context) {
        util_error("bench train: --seq %u exceeds the model context %u", seq,
                   model.context);
        return ORCH_EXIT_USAGE;
    }
    if (!train && (prompt == 0 || dprompt == 0 || dsteps == 0 ||
                   (uint64_t)dprompt + dsteps + 1 > model.context)) {
        util_error("bench infer: --prompt, --decode-prompt and --decode-steps must "
                   "be > 0 and decode-prompt + decode-steps must stay below the "
                   "model context %u",
                   model.context);
        return ORCH_EXIT_USAGE;
    }
    engine_handle h;
    if (engine_load(engine_buf, &h, err, sizeof err) != 0) {
        util_error("%s", err);
        return ORCH_EXIT_USAGE;
    }
    int rc = ORCH_EXIT_OK;
    const char *opts = options_buf[0] ? options_buf : NULL;
    if (train) {
        bench_train_opts o = {batch, seq, steps, warmup, threads, seed, opts};
        bench_train_result r;
        if (bench_train(&h, &model, &o, &r, err, sizeof err) != 0) {
            util_error("bench train: %s", err);
            engine_unload(&h);
            return ORCH_EXIT_FAILURE;
        }
        const int peak = r.sgemm_peak_gflops_per_s > 0;
        if (peak_given > 0) r.mfu = r.model_gflops_per_s / peak_given;
        if (json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "bench", "train");
            cJSON_AddStringToObject(j, "engine", h.api->name);
            cJSON_AddNumberToObject(j, "params", (double)r.params);
            cJSON_AddNumberToObject(j, "batch", r.batch);
            cJSON_AddNumberToObject(j, "seq_len", r.seq_len);
            cJSON_AddNumberToObject(j, "steps", r.steps);
            cJSON_AddNumberToObject(j, "threads", r.threads);
            cJSON_AddNumberToObject(j, "tokens_per_s", r.tokens_per_s);
            cJSON_AddNumberToObject(j, "ms_per_step", r.ms_per_step);
            cJSON_AddNumberToObject(j, "ms_per_step_mean", r.ms_per_step_mean);
            cJSON_AddNumberToObject(j, "flops_per_token", r.flops_per_token);
            cJSON_AddNumberToObject(j, "model_gflops_per_s", r.model_gflops_per_s);
            add_num_or_null(j, "sgemm_peak_gflops_per_s", r.sgemm_peak_gflops_per_s, peak);
            if (peak_given > 0) {
                cJSON_AddNumberToObject(j, "peak_gflops_per_s", peak_given);
                cJSON_AddNumberToObject(j, "mfu", r.mfu);
                cJSON_AddStringToObject(j, "mfu_peak", "given");
            } else {
                add_num_or_null(j, "mfu", r.mfu, peak);
                cJSON_AddStringToObject(j, "mfu_peak", "sgemm");
            }
            cJSON_AddNumberToObject(j, "first_loss", r.first_loss);
            cJSON_AddNumberToObject(j, "last_loss", r.last_loss);
            print_json(j);
        } else {
            printf("engine %s, %.1fM parameters, batch %u x seq %u, %u threads, "
                   "%u timed steps\n",
                   h.api->name, r.params / 1e6, r.batch, r.seq_len, r.threads,
                   r.steps);
            printf("  ms_per_step (median)     %10.1f   (mean %.1f)\n", r.ms_per_step,
                   r.ms_per_step_mean);
            printf("  tokens_per_s             %10.1f\n", r.tokens_per_s);
            printf("  model_gflops_per_s       %10.1f   (%.3g FLOPs/token)\n",
                   r.model_gflops_per_s, r.flops_per_token);
            if (peak)
                printf("  sgemm_peak_gflops_per_s  %10.1f\n", r.sgemm_peak_gflops_per_s);
            if (peak_given > 0) {
                printf("  peak (given)             %10.1f\n", peak_given);
                printf("  mfu                      %10.3f   (against the given peak)\n", r.mfu);
            } else if (peak) {
                printf("  mfu                      %10.3f\n", r.mfu);
            } else {
                printf("  sgemm peak               n/a (no OpenBLAS in this process)\n");
            }
            printf("  loss                     %10.4f -> %.4f\n", r.first_loss,
                   r.last_loss);
        }
    } else {
        bench_infer_opts o = {prompt, dprompt, dsteps, block, threads, seed, opts};
        bench_infer_result r;
        if (bench_infer(&h, &model, &o, &r, err, sizeof err) != 0) {
            util_error("bench infer: %s", err);
            engine_unload(&h);
            return ORCH_EXIT_FAILURE;
        }
        const double ratio = r.decode_tokens_per_s[0] > 0
                                 ? r.decode_tokens_per_s[2] / r.decode_tokens_per_s[0]
                                 : 0.0;
        if (json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "bench", "infer");
            cJSON_AddStringToObject(j, "engine", h.api->name);
            cJSON_AddNumberToObject(j, "threads", r.threads);
            cJSON_AddNumberToObject(j, "prompt_len", r.prompt_len);
            cJSON_AddNumberToObject(j, "prefill_tokens_per_s", r.prefill_tokens_per_s);
            cJSON_AddNumberToObject(j, "decode_prompt", r.decode_prompt);
            cJSON_AddNumberToObject(j, "decode_steps", r.decode_steps);
            cJSON_AddNumberToObject(j, "decode_tokens_per_s_1", r.decode_tokens_per_s[0]);
            cJSON_AddNumberToObject(j, "decode_tokens_per_s_4", r.decode_tokens_per_s[1]);
            cJSON_AddNumberToObject(j, "decode_tokens_per_s_16", r.decode_tokens_per_s[2]);
            cJSON_AddNumberToObject(j, "decode_speedup_16", ratio);
            cJSON_AddNumberToObject(j, "read_gb_per_s", r.read_gb_per_s);
            cJSON_AddNumberToObject(j, "triad_gb_per_s", r.triad_gb_per_s);
            cJSON_AddNumberToObject(j, "mem_bw_gb_per_s", r.mem_bw_gb_per_s);
            cJSON_AddNumberToObject(j, "weight_bytes", r.weight_bytes);
            cJSON_AddNumberToObject(j, "decode_bw_fraction", r.decode_bw_fraction);
            print_json(j);
        } else {
            printf("engine %s, %u threads, KV blocks of %u\n", h.api->name, r.threads,
                   block);
            printf("  prefill_tokens_per_s     %10.1f   (%u-token prompt)\n",
                   r.prefill_tokens_per_s, r.prompt_len);
            for (int k = 0; k < BENCH_DECODE_BATCHES; k++)
                printf("  decode_tokens_per_s_%-4u %10.1f\n", bench_decode_batches[k],
                       r.decode_tokens_per_s[k]);
            printf("  decode 16 / decode 1     %10.2fx\n", ratio);
            printf("  mem_bw_gb_per_s          %10.1f   (read %.1f, triad %.1f)\n",
                   r.mem_bw_gb_per_s, r.read_gb_per_s, r.triad_gb_per_s);
            printf("  decode_bw_fraction       %10.3f   (%.0f MB of weights/step)\n",
                   r.decode_bw_fraction, r.weight_bytes / 1e6);
        }
    }
    engine_unload(&h);
    return rc;
}
