/*
 * cmd_config.c - `orch config check|show FILE [--set KEY=VALUE ...]`:
 * validate a run configuration (with overrides) without running it, or print
 * the merged config with every default filled in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/core/config.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/core/util.h"

#define MAX_SETS 256

static const char usage_text[] =
    "usage: orch config check FILE [--set KEY=VALUE ...] [--engine E]\n"
    "       orch config show FILE [--set KEY=VALUE ...]\n"
    "\n"
    "check: validate a run configuration without running it; prints\n"
    "  a one-line summary, or one error line naming the JSON path and\n"
    "  the problem (exit 2). A llama model is also checked against the\n"
    "  configured engine (engine.name, a built-in one): it is loaded and\n"
    "  asked for a one-layer context of the model's shape, and a refusal\n"
    "  (an engine that runs gpt2 only, or of ABI 1.0) is the error line.\n"
    "show: print the merged configuration (defaults filled in; the\n"
    "  model section as given) as JSON.\n"
    "\n";

/* The configured engine runs m's architecture (llama): 0, or -1 with one
 * line in err. The probe model keeps the heads, kv_heads, width, MLP, RoPE
 * and head flags and shrinks what does not decide support (1 layer, vocab and
 * context capped), so the check stays cheap for a large model. */
static int engine_runs_model(const orch_config *cfg, const char *file, const char *engine,
                             char *err, size_t cap) {
    char why[2048];
    /* --engine came from the command line: trusted as orch train trusts it. */
    if (!engine &&
        engine_check_config_name(cfg->engine.name, file, 0, why, sizeof why) != 0) {
        util_set_err(err, cap, "%s", why);
        return -1;
    }
    if (!engine) engine = cfg->engine.name;
    engine_handle h;
    if (engine_load(engine, &h, why, sizeof why) != 0) {
        util_set_err(err, cap,
                     "%s: model.arch: '%s' cannot be checked: engine '%s' does not load "
                     "here: %s",
                     file, cfg->model.arch, engine, why);
        return -1;
    }
    orch_model_desc d;
    config_model_desc(cfg, &d);
    d.layers = 1;
    if (d.vocab_size > 256) d.vocab_size = 256;
    if (d.context > 64) d.context = 64;
    if (d.rope_original_context > d.context) d.rope_original_context = d.context;
    orch_engine_ctx *ctx = NULL;
    int rc =
        engine_create_context(&h, &d, 1, 1, cfg->engine.options, &ctx, why, sizeof why);
    if (rc == 0) {
        h.api->context_destroy(ctx);
    } else {
        util_set_err(err, cap, "%s: model.arch: '%s' is not run by engine '%s': %s", file,
                     cfg->model.arch, engine, why);
    }
    engine_unload(&h);
    return rc;
}

int cmd_config(int argc, char **argv) {
    const char *sets[MAX_SETS], *file = NULL, *engine = NULL;
    size_t n_sets = 0, n_files = 0;
    const flag_spec flags[] = {
        { "--set", FLAG_LIST, sets, "KEY=VALUE",
          .help = "override a key as `orch train` does (VALUE is JSON when it\n"
                  "parses, else a string; null restores the default); repeatable",
          .max = MAX_SETS, .count = &n_sets },
        { "--engine", FLAG_STRING, &engine, "E",
          .help = "check a llama model against this engine\n(mock|cpu|cuda|FILE.so) "
                  "instead of engine.name" },
        { NULL },
    };
    flags_cmd cmd = { .name = "config", .usage = usage_text, .flags = flags };
    if (flags_wants_help(argc, argv)) { /* before the subcommand is known */
        flags_print_usage(&cmd, stdout);
        return ORCH_EXIT_OK;
    }
    if (argc < 2) {
        util_error("config: missing subcommand (check or show; see orch config "
                   "--help)");
        return ORCH_EXIT_USAGE;
    }
    const char *sub = argv[1];
    int show = 0;
    if (strcmp(sub, "show") == 0) {
        show = 1;
    } else if (strcmp(sub, "check") != 0) {
        util_error("config: unknown subcommand '%s' (check or show)", sub);
        return ORCH_EXIT_USAGE;
    }
    char name[32];
    snprintf(name, sizeof name, "config %s", sub);
    cmd.name = name;
    cmd.pos = &file;
    cmd.max_pos = 1;
    cmd.n_pos = &n_files;
    cmd.pos_name = "FILE";
    int rc;
    if (flags_parse(&cmd, argc - 1, argv + 1, &rc)) return rc;
    if (!file) {
        util_error("config %s: missing FILE", sub);
        return ORCH_EXIT_USAGE;
    }
    char err[2048];
    orch_config *cfg = NULL;
    if (config_load_file(file, &cfg, err, sizeof err) != 0) {
        util_error("%s", err);
        return ORCH_EXIT_USAGE;
    }
    if (config_apply_overrides(cfg, sets, n_sets, err, sizeof err) != 0) {
        util_error("%s: %s", file, err);
        config_free(cfg);
        return ORCH_EXIT_USAGE;
    }
    if (show) {
        char *text = config_to_json(cfg);
        if (!text) {
            config_free(cfg);
            util_error("config: out of memory");
            return ORCH_EXIT_FAILURE;
        }
        printf("%s\n", text);
        free(text);
    } else {
        const config_model *m = &cfg->model;
        const config_train *t = &cfg->train;
        double C = m->width, M = m->mlp_width, L = m->layers, V = m->vocab_size;
        double params;
        char shape[128] = "";
        if (strcmp(m->arch, "llama") == 0) {
            /* The config is well-formed; does the configured engine run it? */
            if (engine_runs_model(cfg, file, engine, err, sizeof err) != 0) {
                util_error("%s", err);
                config_free(cfg);
                return ORCH_EXIT_USAGE;
            }
            /* Embedding (+ untied head), blocks (2 norms, q, k, v, o, SwiGLU),
             * final norm. */
            double KV = (double)m->kv_heads * (C / m->heads);
            params = V * C * (m->tie_embeddings ? 1 : 2) +
                     L * (2 * C + 2 * C * C + 2 * KV * C + 3 * M * C) + C;
            snprintf(shape, sizeof shape, " (kv %u, %s head, rope theta %g%s%s)",
                     m->kv_heads, m->tie_embeddings ? "tied" : "untied", m->rope_theta,
                     m->rope_type[0] ? ", scaling " : "", m->rope_type);
        } else {
            /* GPT-2 parameter count: embeddings, blocks, final LayerNorm. */
            params = V * C + (double)m->context * C +
                     L * (4 * C + 3 * C * C + 3 * C + C * C + C + M * C + M + C * M + C) +
                     2 * C;
        }
        printf("%s: ok: %s, %u layers, %u heads%s, width %u, context %u, "
               "vocab %u (%.2fM parameters); batch %u x %u x %u accum, ",
               file, m->arch, m->layers, m->heads, shape, m->width, m->context,
               m->vocab_size, params / 1e6, t->micro_batch, t->seq_len, t->grad_accum);
        if (t->max_steps)
            printf("%llu steps", (unsigned long long)t->max_steps);
        else
            printf("%g epochs", t->epochs);
        printf(", %s schedule, engine %s\n", t->schedule,
               engine ? engine : cfg->engine.name);
    }
    config_free(cfg);
    return ORCH_EXIT_OK;
}
