/*
 * cmd_serve.c - `orch serve`: flags -> serve_options -> serve_run (serve.h),
 * which loads the model, starts the scheduler and the OpenAI-compatible HTTP
 * server and runs until SIGTERM/SIGINT, then drains: stop accepting, let
 * running requests finish within --drain-timeout, cancel what is left (503),
 * exit 0. This file owns the flags, the signals and the output lines.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/util.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/serve/serve.h"

static const char usage_text[] =
    "usage: orch serve [MODEL] [options]\n"
    "\n"
    "Serve a model over an OpenAI-compatible HTTP API: /v1/completions,\n"
    "/v1/chat/completions, /v1/models, /health, /metrics. MODEL (or\n"
    "-m/--model, or --checkpoint DIR) is an orch run or checkpoint directory,\n"
    "a Hugging Face model directory (config.json + safetensors) or a GGUF\n"
    "file; the last two are imported on the fly (as orch import hf / gguf do)\n"
    "into a temporary checkpoint that is removed at exit. With --engine=mock\n"
    "and no model the mock engine's built-in model is served (byte\n"
    "tokenizer, vocabulary 256, context 1024). /v1/models reports the\n"
    "served name, max_model_len and the architecture. Runs until SIGTERM or\n"
    "SIGINT, then drains and exits 0.\n"
    "\n"
    "Slow or many clients: connections past --max-connections (or\n"
    "--max-connections-per-ip from one address) get 503 at once; each phase\n"
    "of a request has a deadline that trickled bytes do not extend (head,\n"
    "body, keep-alive idle: 408 and close); request bodies share\n"
    "--max-body-memory-mib. Bound to loopback, only loopback Host names (and\n"
    "--allowed-host) are accepted; POST bodies must be application/json.\n"
    "\noptions:\n";

/* Flags into o; 0, or 1 with the exit status in *st. */
static int parse_args(int argc, char **argv, serve_options *o, int *st) {
    serve_options_default(o);
    const char *pos_model = NULL, *flag_model = NULL;
    size_t n_pos = 0;
    const char *quantize = NULL, *kv_dtype = NULL;
    static char options_buf[4096]; /* o->engine_options with --quantize */
    /* the fine-tuning and co-serving flags, in the table's order below */
    static const char *const ft_flags[] = { "--ft-lr",           "--ft-rank",
                                            "--ft-alpha",        "--ft-targets",
                                            "--ft-seq-len",      "--ft-micro-batch",
                                            "--ft-no-packing",   "--ft-checkpoint-every",
                                            "--coserve-mode",    "--ft-granularity",
                                            "--ft-chunk-tokens", "--slo-tpot-ms",
                                            "--slo-ttft-ms" };
    int ft_seen[sizeof ft_flags / sizeof ft_flags[0]] = { 0 };
    o->api_key = getenv("ORCH_API_KEY");
    const flag_spec flags[] = {
        { "-m", FLAG_STRING, &flag_model, "MODEL", .help = "the same as --model" },
        { "--model", FLAG_STRING, &flag_model, "MODEL",
          .help = "the model to serve (instead of the MODEL\nargument)" },
        { "--checkpoint", FLAG_STRING, &o->ckpt, "DIR",
          .help = "run or checkpoint directory (an orch MODEL)" },
        { "--tokenizer", FLAG_STRING, &o->tokenizer, "T",
          .help = "byte|gpt2: the tokenizer of a Hugging Face MODEL\n"
                  "that has no tokenizer.json (default: its own)" },
        { "--engine", FLAG_STRING, &o->engine, "E",
          .help = "mock|cpu|cuda|FILE.so (default: the checkpoint\nconfig's engine)" },
        { "--trust-config-engine", FLAG_TRUE, &o->trust_config_engine, NULL,
          .help = "load the checkpoint config's engine even when it\n"
                  "is a library file or path (default: only mock,\n"
                  "cpu and cuda)" },
        { "--engine-options", FLAG_STRING, &o->engine_options, "S",
          .help = "engine options, e.g. sleep_ms=5 for the mock" },
        { "--quantize", FLAG_STRING, &quantize, "FMT",
          .help = "weights as FMT for inference: int8 (engine option\n"
                  "weights=int8: int8 blocks of 32, fp32 scales) or\n"
                  "fp32 (default)" },
        { "--kv-cache-dtype", FLAG_STRING, &kv_dtype, "T",
          .help = "KV cache storage: auto (default: the engine's;\n"
                  "cpu: bf16 with --quantize int8, else f32), f32,\n"
                  "bf16 or int8 (int8 values, one fp32 scale per\n"
                  "head vector; engine option kv=T)" },
        { "--threads", FLAG_INT, &o->threads, "N",
          .help = "engine threads (default: the config's; 0 = all)", .min = 0,
          .max = 4096 },
        { "--host", FLAG_STRING, &o->host, "ADDR",
          .help = "IPv4 address to bind (default 127.0.0.1)" },
        { "--port", FLAG_U64, &o->port, "N",
          .help = "TCP port (default 8080; 0 = any free port)", .min = 0, .max = 65535 },
        { "--served-model-name", FLAG_STRING, &o->model_name, "NAME",
          .help = "model id in /v1/models and the accepted \"model\"\n"
                  "field (default: MODEL's last path component, the\n"
                  "run directory's for a ckpt-* directory, or\nmock-gpt2)" },
        { "--model-name", FLAG_STRING, &o->model_name, "NAME",
          .help = "the same as --served-model-name" },
        { "--max-model-len", FLAG_U64, &o->max_model_len, "N",
          .help = "cap on prompt + completion tokens (at most the\n"
                  "model's context; default the context)",
          .min = 1, .max = UINT32_MAX },
        { "--chat-template", FLAG_STRING, &o->chat_template, "NAME|FILE",
          .help = "chat template: chatml, llama-2, llama-3,\n"
                  "orch-plain-v1 or a Jinja file (default: the\n"
                  "checkpoint's tokenizer_config.json template, else\n"
                  "orch-plain-v1)" },
        { "--api-key", FLAG_STRING, &o->api_key, "KEY",
          .help = "require 'Authorization: Bearer KEY' on /v1/\n"
                  "(default: $ORCH_API_KEY; none when unset)" },
        { "--max-seqs", FLAG_U64, &o->max_seqs, "N",
          .help = "sequences running at once (default 64)", .min = 1, .max = 65536 },
        { "--max-batch-tokens", FLAG_U64, &o->max_batch_tokens, "N",
          .help = "tokens per scheduler iteration (default 2048)", .min = 1,
          .max = 1 << 24 },
        { "--max-waiting", FLAG_U64, &o->max_waiting, "N",
          .help = "waiting sequences before 429 (default 1024)", .min = 1,
          .max = 1 << 24 },
        { "--no-prefix-cache", FLAG_TRUE, &o->no_prefix_cache, NULL,
          .help = "compute every prompt in full instead of reusing\n"
                  "the KV blocks of a cached common prefix" },
        { "--kv-blocks", FLAG_U64, &o->kv_blocks, "N",
          .help = "KV pool size in 16-token blocks (default: from\n"
                  "--kv-memory, at most what --max-seqs full\n"
                  "contexts need)",
          .min = 1, .max = INT32_MAX },
        { "--kv-memory", FLAG_U64, &o->kv_memory_mib, "MIB",
          .help = "KV pool memory budget (default 1024)", .min = 1, .max = 1 << 24 },
        { "--lora", FLAG_LIST, o->loras, "NAME=DIR",
          .help = "serve the LoRA adapter in DIR (a PEFT directory:\n"
                  "adapter_config.json, adapter_model.safetensors)\n"
                  "as model NAME, next to the base (repeatable)",
          .max = SERVE_MAX_LIST, .count = &o->n_loras },
        { "--enable-lora-loading", FLAG_TRUE, &o->enable_lora_loading, NULL,
          .help = "allow POST /v1/load_lora_adapter and\n"
                  "/v1/unload_lora_adapter (they read server paths)" },
        { "--max-loras", FLAG_U64, &o->max_loras, "N",
          .help = "adapters loaded at once (default 64)", .min = 1, .max = 64 },
        { "--ft-lr", FLAG_DOUBLE, &o->ft_lr, "X",
          .help = "fine-tuning jobs: base learning rate (times the\n"
                  "job's learning_rate_multiplier; default 2e-4)",
          .dmin = 1e-9, .dmax = 1.0, .seen = &ft_seen[0] },
        { "--ft-rank", FLAG_U64, &o->ft_rank, "R",
          .help = "fine-tuning jobs: LoRA rank (default 8)", .min = 1, .max = 4096,
          .seen = &ft_seen[1] },
        { "--ft-alpha", FLAG_DOUBLE, &o->ft_alpha, "A",
          .help = "fine-tuning jobs: LoRA alpha (default 16)", .dmin = 1e-6, .dmax = 1e6,
          .seen = &ft_seen[2] },
        { "--ft-targets", FLAG_STRING, &o->ft_targets, "LIST",
          .help = "fine-tuning jobs: adapted matrices (orch finetune's\n"
                  "--targets; default qkv)",
          .seen = &ft_seen[3] },
        { "--ft-seq-len", FLAG_U64, &o->ft_seq_len, "T",
          .help = "fine-tuning jobs: positions per row (default: the\n"
                  "model's context)",
          .min = 1, .max = 1 << 20, .seen = &ft_seen[4] },
        { "--ft-micro-batch", FLAG_U64, &o->ft_micro_batch, "N",
          .help = "fine-tuning jobs: rows per micro-batch, the unit\n"
                  "that rides in an iteration (default 1); a job's\n"
                  "batch_size must be a multiple",
          .min = 1, .max = 256, .seen = &ft_seen[5] },
        { "--ft-no-packing", FLAG_TRUE, &o->ft_no_packing, NULL,
          .help = "fine-tuning jobs: one example per row (orch\nfinetune --no-packing)",
          .seen = &ft_seen[6] },
        { "--ft-checkpoint-every", FLAG_U64, &o->ft_checkpoint_every, "N",
          .help = "fine-tuning jobs: checkpoint every N steps, to\n"
                  "resume after a restart (default: once an epoch)",
          .min = 1, .max = 1 << 30, .seen = &ft_seen[7] },
        { "--coserve-mode", FLAG_STRING, &o->coserve_mode, "MODE",
          .help = "shared (default): fine-tuning tokens ride in the\n"
                  "inference iterations, in the same pass over the\n"
                  "weights; temporal: time sharing (the baseline):\n"
                  "after each inference pass one micro-batch runs\n"
                  "alone while inference waits",
          .seen = &ft_seen[8] },
        { "--ft-granularity", FLAG_STRING, &o->ft_granularity, "G",
          .help = "token: a micro-batch's forward and backward are\n"
                  "split into chunks of rows over many iterations\n"
                  "(FlexLLM's token-level fine-tuning, ABI 1.5);\n"
                  "sequence: whole micro-batches; auto (default):\n"
                  "token where the engine has it, under shared",
          .seen = &ft_seen[9] },
        { "--ft-chunk-tokens", FLAG_U64, &o->ft_chunk_tokens, "N",
          .help = "token level: the budget's unit in rows (default 8)", .min = 1,
          .max = 1 << 20, .seen = &ft_seen[10] },
        { "--slo-tpot-ms", FLAG_DOUBLE, &o->slo_tpot_ms, "MS",
          .help = "co-serving: p99 time per output token to keep;\n"
                  "fine-tuning gets what is left, and pauses when\n"
                  "inference alone needs it all (default 0: no\n"
                  "target, fine-tuning takes the whole budget)",
          .dmin = 0, .dmax = 1e6, .seen = &ft_seen[11] },
        { "--slo-ttft-ms", FLAG_DOUBLE, &o->slo_ttft_ms, "MS",
          .help = "co-serving: time to first token to keep (default\n"
                  "0: none)",
          .dmin = 0, .dmax = 1e7, .seen = &ft_seen[12] },
        { "--state-dir", FLAG_STRING, &o->state_dir, "DIR",
          .help = "keep uploaded files (OpenAI's /v1/files) in DIR,\n"
                  "across restarts (default: none; the files API is\n"
                  "off)" },
        { "--max-upload-mib", FLAG_U64, &o->max_upload_mib, "MIB",
          .help = "size limit of one uploaded file (default 512)", .min = 1,
          .max = 1 << 20 },
        { "--max-body", FLAG_U64, &o->max_body, "BYTES",
          .help = "request body limit (default 4194304)", .min = 64,
          .max = (int64_t)1 << 32 },
        { "--max-body-memory-mib", FLAG_U64, &o->max_body_memory_mib, "MIB",
          .help = "memory for all request bodies in flight; past it\n"
                  "503 with Retry-After (default 256)",
          .min = 1, .max = 1 << 20 },
        { "--http-threads", FLAG_U64, &o->http_threads, "N",
          .help = "HTTP polling threads (default 1)", .min = 1, .max = 64 },
        { "--http-workers", FLAG_U64, &o->http_workers, "N",
          .help = "threads that parse, tokenize and render off the\n"
                  "HTTP threads (default 2)",
          .min = 1, .max = 64 },
        { "--max-connections", FLAG_U64, &o->max_connections, "N",
          .help = "open connections; past it 503 at once (default\n"
                  "4096; the open-file limit is raised to fit)",
          .min = 1, .max = 1 << 20 },
        { "--max-connections-per-ip", FLAG_U64, &o->max_connections_per_ip, "N",
          .help = "open connections from one client address; past\n"
                  "it 503 at once (default 1024)",
          .min = 1, .max = 1 << 20 },
        { "--header-timeout-s", FLAG_U64, &o->header_timeout_s, "S",
          .help = "the whole request head must arrive within S s of\n"
                  "the connection (a deadline, not reset by each\n"
                  "byte; 408 and close; default 10)",
          .min = 1, .max = 86400 },
        { "--body-timeout-s", FLAG_U64, &o->body_timeout_s, "S",
          .help = "the whole body within S s of its head (default 60)", .min = 1,
          .max = 86400 },
        { "--idle-timeout-s", FLAG_U64, &o->idle_timeout_s, "S",
          .help = "a kept-alive connection must send its next request\n"
                  "head within S s of the last answer (default 15)",
          .min = 1, .max = 86400 },
        { "--allowed-host", FLAG_LIST, o->allowed_hosts, "NAME",
          .help = "also accept this Host name (any port); bound to\n"
                  "loopback only localhost, 127.0.0.1 and [::1] are\n"
                  "accepted otherwise (repeatable)",
          .max = SERVE_MAX_LIST, .count = &o->n_allowed_hosts },
        { "--cors-origin", FLAG_LIST, o->cors_origins, "ORIGIN",
          .help = "send CORS headers to, and answer preflight from,\n"
                  "this Origin ('*' = any; default none; repeatable)",
          .max = SERVE_MAX_LIST, .count = &o->n_cors_origins },
        { "--drain-timeout", FLAG_U64, &o->drain_timeout, "S",
          .help = "seconds running requests get after SIGTERM\n(default 30)", .min = 0,
          .max = 86400 },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "serve",
        .usage = usage_text,
        .flags = flags,
        .footer = "\nexit status: 0 after a clean shutdown, 1 runtime failure, 2 bad "
                  "usage,\ncheckpoint or engine.\n",
        .pos = &pos_model,
        .max_pos = 1,
        .n_pos = &n_pos,
        .pos_name = "MODEL",
    };
    if (flags_parse(&cmd, argc, argv, st)) return 1;
    for (size_t i = 0; i < sizeof ft_flags / sizeof ft_flags[0] && !o->ft_flag_given; i++)
        if (ft_seen[i]) o->ft_flag_given = ft_flags[i];
    *st = ORCH_EXIT_USAGE;
    int given = (pos_model != NULL) + (flag_model != NULL) + (o->ckpt != NULL);
    if (given > 1) {
        util_error("serve: give the model once (MODEL, -m/--model or --checkpoint)");
        return 1;
    }
    o->model = pos_model ? pos_model : flag_model;
    if (o->tokenizer && !o->model) {
        util_error(
            "serve: --tokenizer applies to a Hugging Face MODEL imported on the fly "
            "(a checkpoint names its own)");
        return 1;
    }
    if (o->model_name && !*o->model_name) {
        util_error("serve: --served-model-name must not be empty");
        return 1;
    }
    if (o->max_batch_tokens < o->max_seqs) {
        util_error("serve: --max-batch-tokens (%llu) must be at least --max-seqs (%llu)",
                   (unsigned long long)o->max_batch_tokens,
                   (unsigned long long)o->max_seqs);
        return 1;
    }
    if (o->max_body > (o->max_body_memory_mib << 20)) {
        util_error("serve: --max-body (%llu) must not exceed --max-body-memory-mib (%llu "
                   "MiB)",
                   (unsigned long long)o->max_body,
                   (unsigned long long)o->max_body_memory_mib);
        return 1;
    }
    if (!o->ckpt && !o->model && !(o->engine && strcmp(o->engine, "mock") == 0)) {
        util_error(
            "serve: MODEL is required (orch serve MODEL, -m/--model or --checkpoint "
            "DIR: an orch checkpoint, a Hugging Face model directory or a GGUF "
            "file), or --engine=mock for the mock model");
        return 1;
    }
    if (quantize || (kv_dtype && strcmp(kv_dtype, "auto") != 0)) {
        /* Without a checkpoint there is no config to append to. */
        const char *base = o->engine_options       ? o->engine_options
                           : (o->ckpt || o->model) ? NULL
                                                   : "";
        char qerr[256];
        const char *opts = inference_model_quantize_options(
            quantize, base, options_buf, sizeof options_buf, qerr, sizeof qerr);
        if (opts || !quantize)
            opts = inference_model_kv_options(kv_dtype, opts, options_buf,
                                              sizeof options_buf, qerr, sizeof qerr);
        if (!opts) {
            util_error("serve: %s", qerr);
            return 1;
        }
        o->engine_options = opts;
    }
    return 0;
}

/* serve_hooks.wait_stop: a pending SIGTERM/SIGINT (blocked in every
 * thread), waiting up to ms. */
static int got_signal(void *arg, long ms) {
    const sigset_t *set = arg;
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    int sig = sigtimedwait(set, NULL, &ts);
    return sig == SIGTERM || sig == SIGINT;
}

/* serve_hooks.log: progress on stderr. */
static void log_line(void *arg, int warning, const char *msg) {
    (void)arg;
    if (warning)
        util_warn("serve: %s", msg);
    else
        fprintf(stderr, "orch serve: %s\n", msg);
}

/* Raise the open-file limit to what --max-connections needs (the
 * connections, refused sockets still being answered, the rest of the
 * process); warn when the hard limit is lower. */
static void raise_fd_limit(const serve_options *o) {
    struct rlimit rl;
    rlim_t need = (rlim_t)o->max_connections + 256 + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need) return;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need ? rl.rlim_max : need;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < need)
        util_warn(
            "serve: the open-file limit (%llu) is below what --max-connections %llu "
            "needs (%llu); connections past it are answered 503",
            (unsigned long long)rl.rlim_cur, (unsigned long long)o->max_connections,
            (unsigned long long)need);
}

int cmd_serve(int argc, char **argv) {
    serve_options o;
    int st;
    if (parse_args(argc, argv, &o, &st)) return st;
    raise_fd_limit(&o);

    /* Signals are taken synchronously by this thread; every thread started
     * from here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    serve_hooks hooks = { .log = log_line, .wait_stop = got_signal, .arg = &sigs };
    char err[2048];
    int rc = serve_run(&o, &hooks, err, sizeof err);
    if (rc != ORCH_EXIT_OK) util_error("serve: %s", err);
    return rc;
}
