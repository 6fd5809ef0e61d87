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
#include "orchestrator/core/util.h"

#define MAX_SETS 256

static const char usage_text[] =
    "usage: orch config check FILE [--set KEY=VALUE ...]\n"
    "       orch config show FILE [--set KEY=VALUE ...]\n"
    "\n"
    "check: validate a run configuration without running it; prints\n"
    "  a one-line summary, or one error line naming the JSON path and\n"
    "  the problem (exit 2), also for a model no engine of this build\n"
    "  runs (model.arch other than gpt2).\n"
    "show: print the merged configuration (defaults filled in; the\n"
    "  model section as given) as JSON.\n"
    "\n";

int cmd_config(int argc, char **argv) {
    const char *sets[MAX_SETS], *file = NULL;
    size_t n_sets = 0, n_files = 0;
    const flag_spec flags[] = {
        { "--set", FLAG_LIST, sets, "KEY=VALUE",
          .help = "override a key as `orch train` does (VALUE is JSON when it\n"
                  "parses, else a string; null restores the default); repeatable",
          .max = MAX_SETS, .count = &n_sets },
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
        if (strcmp(m->arch, "gpt2") != 0) {
            /* The config is well-formed, but none of this build's engines
             * (engines/common refuses other architectures) would run it. */
            util_error("%s: model.arch: '%s' is not run by any engine of this build "
                       "(mock, cpu and cuda run gpt2); a library that runs it can be "
                       "named with orch train --engine=FILE.so",
                       file, m->arch);
            config_free(cfg);
            return ORCH_EXIT_USAGE;
        }
        /* GPT-2 parameter count: embeddings, blocks, final LayerNorm. */
        double C = m->width, M = m->mlp_width, L = m->layers;
        double params =
            (double)m->vocab_size * C + (double)m->context * C +
            L * (4 * C + 3 * C * C + 3 * C + C * C + C + M * C + M + C * M + C) + 2 * C;
        printf("%s: ok: %s, %u layers, %u heads, width %u, context %u, "
               "vocab %u (%.2fM parameters); batch %u x %u x %u accum, ",
               file, m->arch, m->layers, m->heads, m->width, m->context, m->vocab_size,
               params / 1e6, t->micro_batch, t->seq_len, t->grad_accum);
        if (t->max_steps)
            printf("%llu steps", (unsigned long long)t->max_steps);
        else
            printf("%g epochs", t->epochs);
        printf(", %s schedule, engine %s\n", t->schedule, cfg->engine.name);
    }
    config_free(cfg);
    return ORCH_EXIT_OK;
}
