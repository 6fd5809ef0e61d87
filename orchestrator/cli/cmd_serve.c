/*
 * cmd_serve.c - `orch serve`: load a model (a checkpoint through an engine,
 * or the mock engine's built-in model), start the scheduler and the
 * OpenAI-compatible HTTP server, and run until SIGTERM/SIGINT, then drain:
 * stop accepting, let running requests finish within --drain-timeout, cancel
 * what is left (503), exit 0.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/infer/generate.h"
#include "orchestrator/core/metrics.h"
#include "orchestrator/serve/scheduler.h"
#include "orchestrator/serve/server.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/core/util.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: orch serve [--checkpoint DIR] [options]\n"
        "\n"
        "Serve a model over an OpenAI-compatible HTTP API: /v1/completions,\n"
        "/v1/chat/completions, /v1/models, /health, /metrics. With --engine=mock\n"
        "and no checkpoint the mock engine's built-in model is served (byte\n"
        "tokenizer, vocabulary 256, context 1024). Runs until SIGTERM or SIGINT,\n"
        "then drains and exits 0.\n"
        "\noptions:\n"
        "  --checkpoint DIR        run or checkpoint directory (required unless\n"
        "                          --engine=mock)\n"
        "  --engine E              mock|cpu|cuda|FILE.so (default: the checkpoint\n"
        "                          config's engine)\n"
        "  --engine-options S      engine options, e.g. sleep_ms=5 for the mock\n"
        "  --threads N             engine threads (default: the config's; 0 = all)\n"
        "  --host ADDR             IPv4 address to bind (default 127.0.0.1)\n"
        "  --port N                TCP port (default 8080; 0 = any free port)\n"
        "  --model-name NAME       model id in the API (default: the checkpoint's\n"
        "                          run directory name, or mock-gpt2)\n"
        "  --api-key KEY           require 'Authorization: Bearer KEY' on /v1/\n"
        "                          (default: $ORCH_API_KEY; none when unset)\n"
        "  --max-seqs N            sequences running at once (default 64)\n"
        "  --max-batch-tokens N    tokens per scheduler iteration (default 2048)\n"
        "  --max-waiting N         waiting sequences before 429 (default 1024)\n"
        "  --kv-blocks N           KV pool size in 16-token blocks (default: from\n"
        "                          --kv-memory, at most what --max-seqs full\n"
        "                          contexts need)\n"
        "  --kv-memory MIB         KV pool memory budget (default 1024)\n"
        "  --max-body BYTES        request body limit (default 4194304)\n"
        "  --http-threads N        HTTP polling threads (default 1)\n"
        "  --drain-timeout S       seconds running requests get after SIGTERM\n"
        "                          (default 30)\n"
        "\nexit status: 0 after a clean shutdown, 1 runtime failure, 2 bad usage,\n"
        "checkpoint or engine.\n");
}

typedef struct serve_opts {
    const char *ckpt, *engine, *engine_options, *host, *model_name, *api_key;
    int threads;
    uint64_t port, max_seqs, max_batch_tokens, max_waiting, kv_blocks,
        kv_memory_mib, max_body, http_threads, drain_timeout;
} serve_opts;

static int parse_args(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->threads = -1;
    o->port = 8080;
    o->max_seqs = 64;
    o->max_batch_tokens = 2048;
    o->max_waiting = 1024;
    o->kv_memory_mib = 1024;
    o->max_body = 4u << 20;
    o->http_threads = 1;
    o->drain_timeout = 30;
    o->api_key = getenv("ORCH_API_KEY");
    struct {
        const char *name;
        uint64_t *dst;
        uint64_t lo, hi;
    } nums[] = {
        {"--port", &o->port, 0, 65535},
        {"--max-seqs", &o->max_seqs, 1, 65536},
        {"--max-batch-tokens", &o->max_batch_tokens, 1, 1u << 24},
        {"--max-waiting", &o->max_waiting, 1, 1u << 24},
        {"--kv-blocks", &o->kv_blocks, 1, INT32_MAX},
        {"--kv-memory", &o->kv_memory_mib, 1, 1u << 24},
        {"--max-body", &o->max_body, 64, 1ull << 32},
        {"--http-threads", &o->http_threads, 1, 64},
        {"--drain-timeout", &o->drain_timeout, 0, 86400},
    };
    for (int i = 1; i < argc; i++) {
        const char *v;
        int matched = 0;
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
            if ((v = util_flag_value(nums[k].name, argc, argv, &i))) {
                uint64_t u;
                if (util_parse_u64(v, &u) != 0 || u < nums[k].lo || u > nums[k].hi) {
                    util_error("serve: %s: '%s' is not an integer in [%llu, %llu]", nums[k].name, v,
                               (unsigned long long)nums[k].lo, (unsigned long long)nums[k].hi);
                    return -1;
                }
                *nums[k].dst = u;
                matched = 1;
                break;
            }
        }
        if (matched) continue;
        if ((v = util_flag_value("--checkpoint", argc, argv, &i))) o->ckpt = v;
        else if ((v = util_flag_value("--engine-options", argc, argv, &i))) o->engine_options = v;
        else if ((v = util_flag_value("--engine", argc, argv, &i))) o->engine = v;
        else if ((v = util_flag_value("--host", argc, argv, &i))) o->host = v;
        else if ((v = util_flag_value("--model-name", argc, argv, &i))) o->model_name = v;
        else if ((v = util_flag_value("--api-key", argc, argv, &i))) o->api_key = v;
        else if ((v = util_flag_value("--threads", argc, argv, &i))) {
            uint64_t u;
            if (util_parse_u64(v, &u) != 0 || u > 4096) {
                util_error("serve: --threads: '%s' is not a thread count", v);
                return -1;
            }
            o->threads = (int)u;
        } else {
            util_error("serve: unknown or incomplete option '%s' (see orch serve --help)", argv[i]);
            return -1;
        }
    }
    if (o->model_name && !*o->model_name) {
        util_error("serve: --model-name must not be empty");
        return -1;
    }
    if (o->max_batch_tokens < o->max_seqs) {
        util_error("serve: --max-batch-tokens (%llu) must be at least --max-seqs (%llu)",
                   (unsigned long long)o->max_batch_tokens, (unsigned long long)o->max_seqs);
        return -1;
    }
    if (!o->ckpt && !(o->engine && strcmp(o->engine, "mock") == 0)) {
        util_error("serve: --checkpoint DIR is required (or --engine=mock for the mock model)");
        return -1;
    }
    return 0;
}

/* A pending SIGTERM/SIGINT (blocked in every thread), waiting up to ms. */
static int got_signal(const sigset_t *set, long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig == SIGTERM || sig == SIGINT;
}

/* Default model name: the last path component of the run/checkpoint path. */
static void default_name(const char *path, char *out, size_t cap) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%.4000s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
    const char *base = strrchr(tmp, '/');
    base = base ? base + 1 : tmp;
    if (strncmp(base, "ckpt-", 5) == 0 && base != tmp) { /* use the run dir */
        tmp[base - tmp - 1] = '\0';
        const char *b2 = strrchr(tmp, '/');
        base = b2 ? b2 + 1 : tmp;
    }
    snprintf(out, cap, "%.200s", *base && strcmp(base, ".") != 0 ? base : "orch-model");
}

int cmd_serve(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return ORCH_EXIT_OK;
    }
    serve_opts o;
    if (parse_args(argc, argv, &o) != 0) return ORCH_EXIT_USAGE;

    /* Signals are taken synchronously by this thread; every thread started
     * from here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = ORCH_EXIT_USAGE;
    char err[2048], warn[2048];
    char name[256];
    if (o.model_name) snprintf(name, sizeof name, "%.200s", o.model_name);
    else if (o.ckpt) default_name(o.ckpt, name, sizeof name);
    else snprintf(name, sizeof name, "mock-gpt2");

    metrics_registry *reg = metrics_registry_create();
    server *srv = NULL;
    scheduler *sched = NULL;
    inference_model gm;
    memset(&gm, 0, sizeof gm);
    engine_handle mock_engine;
    memset(&mock_engine, 0, sizeof mock_engine);
    orch_engine_ctx *mock_ctx = NULL;
    tokenizer *mock_tok = NULL;
    if (!reg) {
        util_error("serve: out of memory");
        return ORCH_EXIT_FAILURE;
    }
    server_config sc = {
        .host = o.host, .port = (uint16_t)o.port, .api_key = o.api_key, .model_name = name,
        .max_body = (size_t)o.max_body, .http_threads = (uint32_t)o.http_threads,
        .metrics = reg,
    };
    if (server_start(&sc, &srv, err, sizeof err) != 0) {
        util_error("serve: %s", err);
        goto out;
    }
    fprintf(stderr, "orch serve: listening on http://%s:%u (loading the model)\n",
            o.host ? o.host : "127.0.0.1", (unsigned)server_port(srv));

    /* ---- load the model ---- */
    const engine_handle *eh;
    orch_engine_ctx *ctx;
    const tokenizer *tok;
    orch_model_desc desc;
    if (o.ckpt) {
        inference_model_opts mo = {o.ckpt, o.engine, o.threads, o.engine_options, 1};
        if (inference_model_open(&mo, &gm, warn, sizeof warn, err, sizeof err) != 0) {
            util_error("serve: %s", err);
            goto out;
        }
        if (warn[0]) util_warn("serve: %s", warn);
        eh = &gm.engine;
        ctx = gm.ctx;
        tok = gm.tok;
        desc = gm.desc;
    } else {
        memset(&desc, 0, sizeof desc);
        desc.struct_size = sizeof desc;
        desc.arch = ORCH_ARCH_GPT2;
        desc.vocab_size = 256;
        desc.context = 1024;
        desc.layers = 2;
        desc.heads = 2;
        desc.width = 64;
        desc.mlp_width = 256;
        if (engine_load("mock", &mock_engine, err, sizeof err) != 0 ||
            engine_create_context(&mock_engine, &desc, o.threads < 0 ? 1 : (uint32_t)o.threads, 1,
                                  o.engine_options, &mock_ctx, err, sizeof err) != 0 ||
            tokenizer_open("byte", NULL, &mock_tok, err, sizeof err) != 0) {
            util_error("serve: %s", err);
            goto out;
        }
        eh = &mock_engine;
        ctx = mock_ctx;
        tok = mock_tok;
    }
    if (!(eh->api->capabilities & ORCH_CAP_INFER)) {
        util_error("serve: engine %s cannot run inference", eh->api->name);
        goto out;
    }
    uint32_t per_ctx = (desc.context + 15) / 16;
    uint64_t blocks = o.kv_blocks;
    if (!blocks) {
        uint64_t bytes = 0;
        int32_t st = eh->api->kv_block_bytes(ctx, 16, &bytes);
        if (st != ORCH_OK || bytes == 0) {
            engine_format_error(eh, ctx, st, err, sizeof err);
            util_error("serve: kv_block_bytes: %s", err);
            goto out;
        }
        blocks = (o.kv_memory_mib << 20) / bytes;
        uint64_t cap = o.max_seqs * per_ctx;
        if (blocks > cap) blocks = cap;
        if (blocks < per_ctx) {
            util_error("serve: --kv-memory %llu MiB holds %llu KV blocks of %llu bytes, but one "
                       "full context (%u tokens) needs %u blocks",
                       (unsigned long long)o.kv_memory_mib, (unsigned long long)blocks,
                       (unsigned long long)bytes, desc.context, per_ctx);
            goto out;
        }
        if (blocks > INT32_MAX) blocks = INT32_MAX;
    }
    if (got_signal(&sigs, 0)) {
        rc = ORCH_EXIT_OK;
        goto out;
    }
    scheduler_config scfg = {
        .engine = eh, .ctx = ctx, .tok = tok, .vocab_size = desc.vocab_size,
        .context = desc.context, .block_size = 16, .num_blocks = (uint32_t)blocks,
        .max_seqs = (uint32_t)o.max_seqs, .max_batch_tokens = (uint32_t)o.max_batch_tokens,
        .max_waiting = (uint32_t)o.max_waiting, .metrics = reg,
        .poll = server_poll_disconnects, .poll_arg = srv,
    };
    if (scheduler_create(&scfg, &sched, err, sizeof err) != 0) {
        util_error("serve: %s", err);
        goto out;
    }
    server_set_ready(srv, sched, tok, desc.vocab_size, desc.context);
    fprintf(stderr,
            "orch serve: ready: model %s (engine %s, vocab %u, context %u), %llu KV blocks "
            "of 16 tokens, max %llu sequences, %llu tokens per iteration\n",
            name, eh->api->name, desc.vocab_size, desc.context, (unsigned long long)blocks,
            (unsigned long long)o.max_seqs, (unsigned long long)o.max_batch_tokens);

    /* ---- serve until a signal ---- */
    while (!got_signal(&sigs, 1000)) {
    }
    fprintf(stderr, "orch serve: draining (%u sequences active, %u HTTP requests in flight)\n",
            scheduler_active(sched), server_inflight(srv));
    server_drain_begin(srv);
    scheduler_stop_accepting(sched);
    double deadline = util_now() + (double)o.drain_timeout;
    int forced = 0;
    while ((scheduler_active(sched) > 0 || server_inflight(srv) > 0) && util_now() < deadline) {
        if (got_signal(&sigs, 10)) { /* a second signal: stop now */
            forced = 1;
            break;
        }
    }
    if (scheduler_active(sched) > 0)
        fprintf(stderr, "orch serve: %s: cancelling %u sequences\n",
                forced ? "second signal" : "drain timeout", scheduler_active(sched));
    rc = ORCH_EXIT_OK;
out:
    /* The scheduler goes first: its destroy finishes (cancels, 503) whatever
     * is left, and no notify can reach the HTTP side after it returns. */
    server_detach_scheduler(srv);
    scheduler_destroy(sched);
    for (double end = util_now() + 5.0; server_inflight(srv) > 0 && util_now() < end;) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    server_stop(srv);
    if (mock_ctx) mock_engine.api->context_destroy(mock_ctx);
    engine_unload(&mock_engine);
    tokenizer_free(mock_tok);
    inference_model_close(&gm);
    metrics_registry_free(reg);
    if (rc == ORCH_EXIT_OK) fprintf(stderr, "orch serve: stopped\n");
    return rc;
}
