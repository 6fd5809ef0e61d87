/*
 * cmd_config.c - `orch config check|show FILE [--set KEY=VALUE ...]`:
 * validate a run configuration (with overrides) without running it, or print
 * the merged config with every default filled in.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/core/config.h"
#include "orchestrator/core/util.h"

#define MAX_SETS 256

static void usage(FILE *f) {
    fprintf(f,
            "usage: orch config check FILE [--set KEY=VALUE ...]\n"
            "       orch config show FILE [--set KEY=VALUE ...]\n"
            "\n"
            "check: validate a run configuration without running it; prints\n"
            "  a one-line summary, or one error line naming the JSON path and\n"
            "  the problem (exit 2).\n"
            "show: print the merged configuration (defaults filled in; the\n"
            "  model section as given) as JSON.\n"
            "\n"
            "--set KEY=VALUE overrides a key as `orch train` does (VALUE is JSON\n"
            "when it parses, else a string; null restores the default).\n");
}

int cmd_config(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
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
    const char *file = NULL;
    const char *sets[MAX_SETS];
    size_t n_sets = 0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if ((v = util_flag_value("--set", argc, argv, &i))) {
            if (n_sets >= MAX_SETS) {
                util_error("config: too many --set options");
                return ORCH_EXIT_USAGE;
            }
            sets[n_sets++] = v;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            util_error("config: unknown option '%s'", argv[i]);
            return ORCH_EXIT_USAGE;
        } else if (!file) {
            file = argv[i];
        } else {
            util_error("config: more than one FILE given ('%s')", argv[i]);
            return ORCH_EXIT_USAGE;
        }
    }
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
        /* GPT-2 parameter count: embeddings, blocks, final LayerNorm. */
        double C = m->width, M = m->mlp_width, L = m->layers;
        double params = (double)m->vocab_size * C + (double)m->context * C +
                        L * (4 * C + 3 * C * C + 3 * C + C * C + C + M * C +
                             M + C * M + C) +
                        2 * C;
        printf("%s: ok: %s, %u layers, %u heads, width %u, context %u, "
               "vocab %u (%.2fM parameters); batch %u x %u x %u accum, ",
               file, m->arch, m->layers, m->heads, m->width, m->context,
               m->vocab_size, params / 1e6, t->micro_batch, t->seq_len,
               t->grad_accum);
        if (t->max_steps)
            printf("%llu steps", (unsigned long long)t->max_steps);
        else
            printf("%g epochs", t->epochs);
        printf(", %s schedule, engine %s\n", t->schedule, cfg->engine.name);
    }
    config_free(cfg);
    return ORCH_EXIT_OK;
}
