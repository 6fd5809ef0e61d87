/*
 * serve.c - the start, drain and shutdown sequence of `orch serve`, the
 * built-in mock model and KV pool sizing. See serve.h.
 */
#include "orchestrator/serve/serve.h"

#include <stdarg.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/metrics.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/infer/inference_model.h"
#include "orchestrator/serve/block_manager.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/ft_runner.h"
#include "orchestrator/serve/http.h"
#include "orchestrator/serve/scheduler.h"
#include "orchestrator/store/model_source.h"
#include "orchestrator/store/peft_adapter.h"

void serve_options_default(serve_options *o) {
    memset(o, 0, sizeof *o);
    o->threads = -1;
    o->port = 8080;
    o->max_seqs = 64;
    o->max_batch_tokens = 2048;
    o->max_waiting = 1024;
    o->kv_memory_mib = 1024;
    o->max_body = HTTP_DEFAULT_MAX_BODY;
    o->max_body_memory_mib = HTTP_DEFAULT_MAX_BODY_MEMORY >> 20;
    o->max_upload_mib = FILE_STORE_DEFAULT_MAX >> 20;
    o->ft_lr = 2e-4;
    o->ft_rank = 8;
    o->ft_alpha = 16;
    o->ft_micro_batch = 1;
    o->http_threads = 1;
    o->http_workers = HTTP_DEFAULT_WORKERS;
    o->drain_timeout = 30;
    o->max_connections = HTTP_DEFAULT_MAX_CONNECTIONS;
    o->max_connections_per_ip = HTTP_DEFAULT_MAX_CONNECTIONS_IP;
    o->header_timeout_s = HTTP_DEFAULT_HEADER_TIMEOUT_S;
    o->body_timeout_s = HTTP_DEFAULT_BODY_TIMEOUT_S;
    o->idle_timeout_s = HTTP_DEFAULT_IDLE_TIMEOUT_S;
}

void serve_default_model_name(const char *path, char *out, size_t cap) {
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

orch_model_desc serve_mock_model_desc(void) {
    orch_model_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.arch = ORCH_ARCH_GPT2;
    d.vocab_size = 256;
    d.context = 1024;
    d.layers = 2;
    d.heads = 2;
    d.width = 64;
    d.mlp_width = 256;
    return d;
}

int serve_kv_pool_blocks(uint64_t kv_memory_mib, uint64_t block_bytes, uint32_t context,
                         uint64_t max_seqs, uint64_t *blocks, char *err, size_t err_cap) {
    uint32_t per_ctx = (context + ORCH_KV_BLOCK_TOKENS - 1) / ORCH_KV_BLOCK_TOKENS;
    uint64_t n = block_bytes ? (kv_memory_mib << 20) / block_bytes : 0;
    uint64_t cap = max_seqs * per_ctx;
    if (n > cap) n = cap;
    if (n < per_ctx) {
        util_set_err(
            err, err_cap,
            "--kv-memory %llu MiB holds %llu KV blocks of %llu bytes, but one full "
            "context (%u tokens) needs %u blocks",
            (unsigned long long)kv_memory_mib, (unsigned long long)n,
            (unsigned long long)block_bytes, context, per_ctx);
        return -1;
    }
    if (n > INT32_MAX) n = INT32_MAX;
    *blocks = n;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* The model                                                                  */
/* ------------------------------------------------------------------------- */
typedef struct serve_model {
    model_source src;          /* what MODEL named (its import owned) */
    inference_model gm;        /* a checkpoint (owned) */
    engine_handle mock_engine; /* or the mock's built-in model (owned) */
    orch_engine_ctx *mock_ctx;
    tokenizer *mock_tok;
    const engine_handle *eh; /* what is served (borrowed from the above) */
    orch_engine_ctx *ctx;
    const tokenizer *tok;
    orch_model_desc desc;
    uint32_t context; /* served: desc.context or the --max-model-len cap */
} serve_model;

static void say(const serve_hooks *h, int warning, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(const serve_hooks *h, int warning, const char *fmt, ...) {
    if (!h->log) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    h->log(h->arg, warning, msg);
}

static int model_open(const serve_options *o, const serve_hooks *h, serve_model *m,
                      char *err, size_t err_cap) {
    const char *ckpt = o->ckpt;
    if (o->model) {
        int kind;
        if (model_source_open(o->model, NULL, o->tokenizer, &m->src, &kind, err,
                              err_cap) != 0)
            return -1;
        if (m->src.tmp_dir[0])
            say(h, 0, "imported the %s %s into %s", m->src.kind_name, o->model,
                m->src.ckpt);
        ckpt = m->src.ckpt;
    }
    if (ckpt) {
        char warn[2048];
        unsigned flags = INFERENCE_MODEL_TOKENIZER;
        if (o->trust_config_engine) flags |= INFERENCE_MODEL_TRUST_CONFIG_ENGINE;
        inference_model_opts mo = { ckpt, o->engine, o->threads, o->engine_options,
                                    flags };
        if (inference_model_open(&mo, &m->gm, warn, sizeof warn, err, err_cap) != 0)
            return -1;
        if (warn[0]) say(h, 1, "%s", warn);
        m->eh = &m->gm.engine;
        m->ctx = m->gm.ctx;
        m->tok = m->gm.tok;
        m->desc = m->gm.desc;
    } else {
        m->desc = serve_mock_model_desc();
        uint32_t threads = o->threads < 0 ? 1 : (uint32_t)o->threads;
        if (engine_load("mock", &m->mock_engine, err, err_cap) != 0 ||
            engine_create_context(&m->mock_engine, &m->desc, threads, 1,
                                  o->engine_options, &m->mock_ctx, err, err_cap) != 0 ||
            tokenizer_open("byte", NULL, &m->mock_tok, err, err_cap) != 0)
            return -1;
        m->eh = &m->mock_engine;
        m->ctx = m->mock_ctx;
        m->tok = m->mock_tok;
    }
    if (!(m->eh->api->capabilities & ORCH_CAP_INFER)) {
        util_set_err(err, err_cap, "engine %s cannot run inference", m->eh->api->name);
        return -1;
    }
    m->context = m->desc.context;
    if (o->max_model_len) {
        if (o->max_model_len > m->desc.context) {
            util_set_err(err, err_cap,
                         "--max-model-len %llu exceeds the model's context (%u tokens, "
                         "model.context)",
                         (unsigned long long)o->max_model_len, m->desc.context);
            return -1;
        }
        m->context = (uint32_t)o->max_model_len;
    }
    return 0;
}

static void model_close(serve_model *m, const serve_hooks *h) {
    if (m->mock_ctx) m->mock_engine.api->context_destroy(m->mock_ctx);
    engine_unload(&m->mock_engine);
    tokenizer_free(m->mock_tok);
    inference_model_close(&m->gm);
    char err[1024];
    if (model_source_close(&m->src, err, sizeof err) != 0)
        say(h, 1, "removing the imported model: %s", err);
}

/* The architecture's name in the API. */
static const char *arch_name(uint32_t arch) {
    return arch == ORCH_ARCH_LLAMA  ? "llama"
           : arch == ORCH_ARCH_GPT2 ? "gpt2"
                                    : "unknown";
}

/* --kv-blocks, or the --kv-memory budget over the engine's block size. */
static int kv_blocks(const serve_options *o, const serve_model *m, uint64_t *blocks,
                     char *err, size_t err_cap) {
    if (o->kv_blocks) {
        *blocks = o->kv_blocks;
        return 0;
    }
    uint64_t bytes = 0;
    int32_t st = m->eh->api->kv_block_bytes(m->ctx, ORCH_KV_BLOCK_TOKENS, &bytes);
    if (st != ORCH_OK || bytes == 0) {
        char msg[512];
        engine_format_error(m->eh, m->ctx, st, msg, sizeof msg);
        util_set_err(err, err_cap, "kv_block_bytes: %s", msg);
        return -1;
    }
    return serve_kv_pool_blocks(o->kv_memory_mib, bytes, m->context, o->max_seqs, blocks,
                                err, err_cap);
}

/* ------------------------------------------------------------------------- */
/* Start, drain, shutdown                                                     */
/* ------------------------------------------------------------------------- */
typedef struct serve_state {
    metrics_registry *reg;
    http_server *srv;
    scheduler *sched;
    serve_model m;
    chat_template_choice chat; /* borrowed by the HTTP server */
    file_store *files;         /* --state-dir; borrowed by the HTTP server */
    coserve *cs;               /* adapters; borrowed by the HTTP server */
    ft_jobs *jobs;             /* --state-dir fine-tuning jobs */
    ft_runner *runner;         /* runs them (an engine with LoRA adapters) */
    char ft_disabled[256];     /* why there is no runner */
} serve_state;

/* The fine-tuning runner of --state-dir jobs (fine-tuning inside the
 * server), its hooks shared through coserve. */
static int start_runner(const serve_options *o, const serve_model *m, const char *name,
                        serve_state *st, char *err, size_t err_cap) {
    uint32_t targets = 0;
    char terr[512];
    if (peft_targets_parse(m->desc.arch, o->ft_targets ? o->ft_targets : "qkv", &targets,
                           terr, sizeof terr) != 0) {
        util_set_err(err, err_cap, "--ft-targets: %s", terr);
        return -1;
    }
    int temporal = 0;
    if (o->coserve_mode && strcmp(o->coserve_mode, "temporal") == 0)
        temporal = 1;
    else if (o->coserve_mode && strcmp(o->coserve_mode, "shared") != 0) {
        util_set_err(
            err, err_cap,
            "--coserve-mode '%s': expected shared (fine-tuning rides in inference "
            "iterations) or temporal (only in iterations without inference)",
            o->coserve_mode);
        return -1;
    }
    const char *gran = o->ft_granularity ? o->ft_granularity : "auto";
    const int streams = (m->eh->api->capabilities & ORCH_CAP_FT_STREAM) != 0;
    int token_level;
    if (strcmp(gran, "auto") == 0)
        token_level = streams && !temporal;
    else if (strcmp(gran, "token") == 0 || strcmp(gran, "sequence") == 0)
        token_level = gran[0] == 't';
    else {
        util_set_err(err, err_cap,
                     "--ft-granularity '%s': expected auto, token or sequence", gran);
        return -1;
    }
    if (token_level && temporal) {
        util_set_err(err, err_cap,
                     "--ft-granularity token with --coserve-mode temporal: time sharing "
                     "runs whole micro-batches (use --ft-granularity sequence)");
        return -1;
    }
    if (!token_level && o->ft_chunk_tokens) {
        util_set_err(err, err_cap,
                     "--ft-chunk-tokens applies to token-level fine-tuning only; this "
                     "server runs whole micro-batches (%s)",
                     temporal ? "--coserve-mode temporal"
                     : strcmp(gran, "sequence") == 0
                         ? "--ft-granularity sequence"
                         : "the engine has no ABI 1.5 streams");
        return -1;
    }
    uint32_t seq_len = o->ft_seq_len ? (uint32_t)o->ft_seq_len : m->context;
    if (seq_len > m->context) {
        util_set_err(err, err_cap, "--ft-seq-len %u is over the model's context (%u)",
                     seq_len, m->context);
        return -1;
    }
    ft_runner_config rc = {
        .engine = m->eh,
        .ctx = m->ctx,
        .model = &m->desc,
        .base_name = name,
        .tok = m->tok,
        .tmpl = st->chat.tmpl,
        .tmpl_error = st->chat.error,
        .jobs = st->jobs,
        .files = st->files,
        .cs = st->cs,
        .metrics = st->reg,
        .state_dir = o->state_dir,
        .lr = o->ft_lr,
        .rank = (uint32_t)o->ft_rank,
        .alpha = o->ft_alpha,
        .targets = targets,
        .seq_len = seq_len,
        .micro_batch = (uint32_t)o->ft_micro_batch,
        .checkpoint_every = o->ft_checkpoint_every,
        .temporal = temporal,
        .token_level = token_level,
        .chunk_tokens = o->ft_chunk_tokens ? (uint32_t)o->ft_chunk_tokens : 8,
        .no_packing = o->ft_no_packing,
        .slo = { .slo_tpot_ms = o->slo_tpot_ms,
                 .slo_ttft_ms = o->slo_ttft_ms,
                 .max_tokens = (uint32_t)o->max_batch_tokens },
    };
    char rerr[1024];
    st->runner = ft_runner_create(&rc, rerr, sizeof rerr);
    if (!st->runner) {
        util_set_err(err, err_cap, "fine-tuning: %s", rerr);
        return -1;
    }
    coserve_set_runner(st->cs, st->runner);
    /* the adapters of jobs that succeeded before a restart are served again */
    ft_job done[COSERVE_MAX_ADAPTERS];
    size_t n = ft_jobs_in_status(st->jobs, FT_JOB_SUCCEEDED, done, COSERVE_MAX_ADAPTERS);
    for (size_t i = 0; i < n; i++) {
        char dir[4200], aerr[1024] = "no name recorded";
        snprintf(dir, sizeof dir, "%s/adapters/%s", o->state_dir, done[i].id);
        if (!done[i].fine_tuned_model[0] ||
            coserve_add_now(st->cs, done[i].fine_tuned_model, dir, aerr, sizeof aerr) !=
                0)
            util_warn("serve: fine-tuned model %s (job %s) is not served: %s",
                      done[i].fine_tuned_model, done[i].id, aerr);
    }
    return 0;
}

/* Listen, load, size, start the scheduler, set ready. Returns 0 when ready,
 * 1 when a stop request came before the scheduler started, -1 on failure. */
static int serve_start(const serve_options *o, const serve_hooks *h, const char *name,
                       serve_state *st, char *err, size_t err_cap) {
    http_server_config sc = {
        .host = o->host,
        .port = (uint16_t)o->port,
        .api_key = o->api_key,
        .model_name = name,
        .max_body = (size_t)o->max_body,
        .max_body_memory = (size_t)(o->max_body_memory_mib << 20),
        .http_threads = (uint32_t)o->http_threads,
        .workers = (uint32_t)o->http_workers,
        .max_connections = (uint32_t)o->max_connections,
        .max_connections_per_ip = (uint32_t)o->max_connections_per_ip,
        .header_timeout_s = (uint32_t)o->header_timeout_s,
        .body_timeout_s = (uint32_t)o->body_timeout_s,
        .idle_timeout_s = (uint32_t)o->idle_timeout_s,
        .allowed_hosts = o->allowed_hosts,
        .n_allowed_hosts = o->n_allowed_hosts,
        .cors_origins = o->cors_origins,
        .n_cors_origins = o->n_cors_origins,
        .metrics = st->reg,
    };
    if (o->state_dir) {
        char ferr[1024];
        st->files =
            file_store_open(o->state_dir, o->max_upload_mib << 20, ferr, sizeof ferr);
        if (!st->files) {
            util_set_err(err, err_cap, "--state-dir %s: %s", o->state_dir, ferr);
            return -1;
        }
        sc.files = st->files;
    }
    if (o->chat_template && /* a bad name fails before anything starts */
        chat_template_choose(o->chat_template, NULL, 0, &st->chat, err, err_cap) != 0)
        return -1;
    if (http_server_start(&sc, &st->srv, err, err_cap) != 0) return -1;
    say(h, 0, "listening on http://%s:%u (loading the model)",
        o->host ? o->host : "127.0.0.1", (unsigned)http_server_port(st->srv));
    serve_model *m = &st->m;
    uint64_t blocks = 0;
    if (model_open(o, h, m, err, err_cap) != 0 ||
        kv_blocks(o, m, &blocks, err, err_cap) != 0)
        return -1;
    if (h->wait_stop(h->arg, 0)) return 1;
    /* The template directories: the checkpoint used (an imported MODEL's
     * temporary checkpoint holds the copied tokenizer_config.json), then the
     * directory given (not a GGUF file). */
    const char *given = o->model ? o->model : o->ckpt;
    struct stat given_st;
    if (given && (stat(given, &given_st) != 0 || !S_ISDIR(given_st.st_mode)))
        given = NULL;
    const char *dirs[2] = { (o->ckpt || o->model) ? m->gm.ckpt_dir : NULL, given };
    chat_template_choice_free(&st->chat);
    if (chat_template_choose(o->chat_template, dirs, 2, &st->chat, err, err_cap) != 0)
        return -1;
    if (st->chat.tmpl)
        say(h, 0, "chat template %s (%s)", st->chat.tmpl->name, st->chat.source);
    else
        say(h, 1, "%s; /v1/chat/completions is refused", st->chat.error);
    int lora_engine = (m->eh->api->capabilities & ORCH_CAP_LORA) != 0;
    if (o->state_dir) {
        char jerr[1024];
        st->jobs = ft_jobs_open(o->state_dir, jerr, sizeof jerr);
        if (!st->jobs) {
            util_set_err(err, err_cap, "--state-dir %s: %s", o->state_dir, jerr);
            return -1;
        }
    }
    int runner = st->jobs && lora_engine;
    if (o->n_loras || o->enable_lora_loading || runner) {
        coserve_config cc = { .engine = m->eh,
                              .ctx = m->ctx,
                              .model = &m->desc,
                              .base_name = name,
                              .allow_runtime_load = o->enable_lora_loading,
                              .max_adapters = (uint32_t)o->max_loras,
                              .fingerprint_now = runner };
        if (!lora_engine) {
            util_set_err(err, err_cap,
                         "--lora/--enable-lora-loading: engine '%s' (ABI %u.%u) has no "
                         "LoRA adapters (capability lora)",
                         m->eh->api->name, m->eh->api->abi_major, m->eh->api->abi_minor);
            return -1;
        }
        char cerr[1024];
        st->cs = coserve_create(&cc, cerr, sizeof cerr);
        if (!st->cs) {
            util_set_err(err, err_cap, "adapters: %s", cerr);
            return -1;
        }
        for (size_t i = 0; i < o->n_loras; i++) {
            const char *eq = strchr(o->loras[i], '=');
            if (!eq || eq == o->loras[i] || !eq[1]) {
                util_set_err(err, err_cap, "--lora '%s': expected NAME=DIR", o->loras[i]);
                return -1;
            }
            char lname[COSERVE_NAME_MAX];
            snprintf(lname, sizeof lname, "%.*s", (int)(eq - o->loras[i]), o->loras[i]);
            if (coserve_add_now(st->cs, lname, eq + 1, cerr, sizeof cerr) != 0) {
                util_set_err(err, err_cap, "--lora %s: %s", o->loras[i], cerr);
                return -1;
            }
            say(h, 0, "adapter %s from %s", lname, eq + 1);
        }
    }
    if (!runner && o->ft_flag_given) {
        util_set_err(
            err, err_cap,
            "%s: no fine-tuning jobs on this server (they need --state-dir and an "
            "engine with LoRA adapters; engine '%s' ABI %u.%u%s)",
            o->ft_flag_given, m->eh->api->name, m->eh->api->abi_major,
            m->eh->api->abi_minor,
            m->eh->api->capabilities & ORCH_CAP_LORA ? "" : " has none");
        return -1;
    }
    if (runner && start_runner(o, m, name, st, err, err_cap) != 0) return -1;
    if (st->jobs && !runner)
        snprintf(st->ft_disabled, sizeof st->ft_disabled,
                 "engine '%s' (ABI %u.%u) has no LoRA adapters (capability lora)",
                 m->eh->api->name, m->eh->api->abi_major, m->eh->api->abi_minor);
    scheduler_config scfg = {
        .engine = m->eh,
        .ctx = m->ctx,
        .tok = m->tok,
        .vocab_size = m->desc.vocab_size,
        .context = m->context,
        .block_size = ORCH_KV_BLOCK_TOKENS,
        .num_blocks = (uint32_t)blocks,
        .max_seqs = (uint32_t)o->max_seqs,
        .max_batch_tokens = (uint32_t)o->max_batch_tokens,
        .max_waiting = (uint32_t)o->max_waiting,
        .no_prefix_cache = o->no_prefix_cache,
        .metrics = st->reg,
        .poll = http_server_poll_disconnects,
        .poll_arg = st->srv,
        .coserve = st->cs ? coserve_hooks(st->cs) : NULL,
    };
    if (scheduler_create(&scfg, &st->sched, err, err_cap) != 0) return -1;
    if (st->cs) {
        coserve_attach(st->cs, st->sched);
        http_server_set_coserve(st->srv, st->cs);
    }
    if (st->runner) ft_runner_attach(st->runner, st->sched);
    if (st->jobs)
        http_server_set_finetune(st->srv, st->runner ? st->jobs : NULL, st->runner,
                                 st->runner ? NULL : st->ft_disabled);
    http_server_set_chat_template(st->srv, st->chat.tmpl,
                                  st->chat.tmpl ? NULL : st->chat.error);
    http_server_set_ready(st->srv, st->sched, m->tok, m->desc.vocab_size, m->context,
                          arch_name(m->desc.arch));
    say(h, 0,
        "ready: model %s (%s, engine %s, vocab %u, context %u), %llu KV blocks of %u "
        "tokens, max %llu sequences, %llu tokens per iteration, prefix cache %s",
        name, arch_name(m->desc.arch), m->eh->api->name, m->desc.vocab_size, m->context,
        (unsigned long long)blocks, ORCH_KV_BLOCK_TOKENS, (unsigned long long)o->max_seqs,
        (unsigned long long)o->max_batch_tokens, o->no_prefix_cache ? "off" : "on");
    return 0;
}

/* Stop accepting; wait for running requests (drain_timeout, or a second stop
 * request). What is left is cancelled by the shutdown. */
static void serve_drain(const serve_options *o, const serve_hooks *h, serve_state *st) {
    say(h, 0, "draining (%u sequences active, %u HTTP requests in flight)",
        scheduler_active(st->sched), http_server_inflight(st->srv));
    http_server_drain_begin(st->srv);
    scheduler_stop_accepting(st->sched);
    double deadline = util_now() + (double)o->drain_timeout;
    int forced = 0;
    while ((scheduler_active(st->sched) > 0 || http_server_inflight(st->srv) > 0) &&
           util_now() < deadline) {
        if (h->wait_stop(h->arg, 10)) { /* a second stop request: stop now */
            forced = 1;
            break;
        }
    }
    if (scheduler_active(st->sched) > 0)
        say(h, 0, "%s: cancelling %u sequences",
            forced ? "second signal" : "drain timeout", scheduler_active(st->sched));
}

/* The scheduler goes first: its destroy finishes (cancels, 503) whatever is
 * left, and no notify can reach the HTTP side after it returns. */
static void serve_shutdown(serve_state *st, const serve_hooks *h) {
    http_server_detach_scheduler(st->srv);
    scheduler_destroy(st->sched);
    for (double end = util_now() + 5.0;
         http_server_inflight(st->srv) > 0 && util_now() < end;) {
        struct timespec ts = { 0, 10000000 };
        nanosleep(&ts, NULL);
    }
    http_server_stop(st->srv);
    ft_runner_destroy(st->runner); /* the scheduler is gone: engine calls are ours */
    coserve_destroy(st->cs);
    ft_jobs_close(st->jobs);
    model_close(&st->m, h);
    chat_template_choice_free(&st->chat);
    file_store_close(st->files);
    metrics_registry_free(st->reg);
}

int serve_run(const serve_options *o, const serve_hooks *h, char *err, size_t err_cap) {
    char name[256];
    if (o->model_name)
        snprintf(name, sizeof name, "%.200s", o->model_name);
    else if (o->model || o->ckpt)
        serve_default_model_name(o->model ? o->model : o->ckpt, name, sizeof name);
    else
        snprintf(name, sizeof name, "mock-gpt2");
    serve_state st;
    memset(&st, 0, sizeof st);
    st.reg = metrics_registry_create();
    if (!st.reg) {
        util_set_err(err, err_cap, "out of memory");
        return ORCH_EXIT_FAILURE;
    }
    int started = serve_start(o, h, name, &st, err, err_cap);
    if (started == 0) {
        while (!h->wait_stop(h->arg, 1000)) {
        }
        serve_drain(o, h, &st);
    }
    serve_shutdown(&st, h);
    if (started < 0) return ORCH_EXIT_USAGE;
    say(h, 0, "stopped");
    return ORCH_EXIT_OK;
}
