/*
 * cmd_train.c - `orch train`: command line, config resolution (file, built-in
 * default, checkpoint), default-corpus preparation, signal handling, and the
 * final summary around train_run (train.h).
 */
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/store/checkpoint.h"
#include "orchestrator/cli/commands.h"
#include "orchestrator/core/config.h"
#include "orchestrator/data/corpus.h"
#include "orchestrator/train/dist.h"
#include "orchestrator/train/train.h"
#include "orchestrator/core/util.h"

#define MAX_SETS 256

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: orch train [--config FILE] [--engine E] [--steps N] [--out DIR]\n"
        "                  [--resume[=DIR] | --init DIR] [--set KEY=VALUE ...]\n"
        "                  [--metrics-port N] [--stop-after N]\n"
        "\n"
        "Trains a GPT-style model. Without --config it trains the built-in\n"
        "default (configs/default.json next to the orch binary, else\n"
        "./configs/default.json) on the King James Bible, preparing the\n"
        "corpus once, into runs/default (continuing it if it exists).\n"
        "\n"
        "options:\n"
        "  --config FILE      run configuration (JSON; see `orch config check`)\n"
        "  --engine E         engine: mock | cpu | cuda | FILE.so (engine.name)\n"
        "  --steps N          train to step N (train.max_steps)\n"
        "  --out DIR          run directory (default runs/<config name>, or\n"
        "                     runs/finetune with --init and no --config)\n"
        "  --resume[=DIR]     continue from the newest complete checkpoint of\n"
        "                     DIR (a run or checkpoint directory; default the\n"
        "                     --out directory), with its saved config unless\n"
        "                     --config is given (the model must match)\n"
        "  --init DIR         start a new run from the weights of checkpoint DIR\n"
        "                     (e.g. from `orch import-gpt2`: fine-tuning), with\n"
        "                     its config unless --config is given\n"
        "  --set KEY=VALUE    override any config key, e.g. --set train.lr=3e-4\n"
        "                     (VALUE is JSON when it parses, else a string;\n"
        "                     null restores the default); repeatable\n"
        "  --metrics-port N   serve Prometheus metrics on 127.0.0.1:N/metrics\n"
        "                     (0 picks a free port)\n"
        "  --stop-after N     stop after N steps of this invocation with a\n"
        "                     checkpoint (exit 0), e.g. to split a run\n"
        "\n"
        "Writes DIR/ckpt-NNNNNNNN/ checkpoints, DIR/latest, DIR/config.json and\n"
        "DIR/metrics.jsonl (plot it with tools/plot_loss).\n"
        "\n"
        "signals: SIGINT, SIGTERM or SIGUSR1 finish the current step, write a\n"
        "checkpoint and exit with status 3 (requeue, then --resume); a second\n"
        "SIGINT exits at once with status 130, leaving the last good checkpoint.\n"
        "\n"
        "data parallel: `mpirun -np N orch train ...` or `srun orch train ...`\n"
        "runs N ranks (one micro-batch each per accumulation step, gradients\n"
        "averaged over ranks); rank 0 logs and checkpoints. A rank that dies or\n"
        "hangs stops the others after ORCH_DIST_TIMEOUT seconds (default 60).\n"
        "\n"
        "exit status: 0 done (or early-stopped, or --stop-after reached),\n"
        "1 runtime failure, 2 bad usage, config, data or engine, 3 stopped by a\n"
        "signal after writing a checkpoint, 130 second SIGINT.\n");
}

/* ------------------------------------------------------------------------- */
/* Signals                                                                    */
/* ------------------------------------------------------------------------- */
static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_sigints;
static volatile sig_atomic_t g_live; /* a progress line may be open: start messages on a new line */

static void on_signal(int sig) {
    if (sig == SIGINT && ++g_sigints >= 2) {
        static const char m[] = "\norch: second SIGINT: exiting now\n";
        ssize_t w = write(STDERR_FILENO, m + !g_live, sizeof m - 1 - !g_live);
        (void)w;
        _exit(130);
    }
    if (!g_stop) {
        static const char m[] =
            "\norch: signal received: finishing this step, then writing a "
            "checkpoint (Ctrl-C again to quit at once)\n";
        ssize_t w = write(STDERR_FILENO, m + !g_live, sizeof m - 1 - !g_live);
        (void)w;
    }
    g_stop = 1;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

static void restore_signals(void) {
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
}

/* ------------------------------------------------------------------------- */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------- */
static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Find configs/default.json: <exe dir>/../configs, then ./configs. root
 * receives the directory holding configs/ (for relative data paths). */
static int find_default_config(char *path, size_t cap, char *root,
                               size_t root_cap) {
    char exe[PATH_MAX];
    if (util_exe_dir(exe, sizeof exe) == 0) {
        char r[PATH_MAX + 8];
        snprintf(r, sizeof r, "%s/..", exe);
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s/configs/default.json", r);
        if (is_file(cand)) {
            char real[PATH_MAX + 16];
            if (!realpath(r, real)) snprintf(real, sizeof real, "%.*s", PATH_MAX, r);
            if (strlen(real) + 24 > cap || strlen(real) >= root_cap) return -1;
            memcpy(root, real, strlen(real) + 1);
            memcpy(path, real, strlen(real));
            memcpy(path + strlen(real), "/configs/default.json", 22);
            return 0;
        }
    }
    if (is_file("configs/default.json")) {
        snprintf(root, root_cap, ".");
        snprintf(path, cap, "configs/default.json");
        return 0;
    }
    return -1;
}

static int glob_matches(const char *pattern) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    size_t n = rc == 0 ? g.gl_pathc : 0;
    if (rc == 0) globfree(&g);
    return n > 0;
}

/* Config basename without directory and .json: "configs/x.json" -> "x". */
static void config_stem(const char *path, char *out, size_t cap) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && strcmp(out + n - 5, ".json") == 0) out[n - 5] = '\0';
}

static void prep_progress(void *user, uint64_t done, uint64_t total) {
    int live = *(int *)user;
    if (!total) return;
    if (live)
        printf("\rpreparing the KJV corpus: %3.0f%%", 100.0 * done / total);
    if (done == total) printf(live ? "\n" : "preparing the KJV corpus: done\n");
    fflush(stdout);
}

/* When data.train matches nothing and looks like DATA/kjv-<tokenizer>/...,
 * fetch and prepare the default corpus there (once). */
static int ensure_kjv(const orch_config *cfg, int live, char *err, size_t cap) {
    if (glob_matches(cfg->data.train) && glob_matches(cfg->data.val)) return 0;
    char want[64];
    snprintf(want, sizeof want, "kjv-%s", cfg->data.tokenizer);
    char dir[CONFIG_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", cfg->data.train);
    char *slash = strrchr(dir, '/');
    if (!slash) return 0; /* not ours: dataset_open will explain */
    *slash = '\0';
    char *base = strrchr(dir, '/');
    const char *leaf = base ? base + 1 : dir;
    if (strcmp(leaf, want) != 0) return 0;
    char data_dir[CONFIG_PATH_MAX];
    if (base) {
        *base = '\0';
        snprintf(data_dir, sizeof data_dir, "%s", *dir ? dir : "/");
    } else {
        snprintf(data_dir, sizeof data_dir, ".");
    }
    printf("train: %s has no shards yet: preparing the King James Bible "
           "(once)\n",
           cfg->data.train);
    fflush(stdout);
    char tg[CONFIG_PATH_MAX], vg[CONFIG_PATH_MAX];
    int prepared = 0;
    if (corpus_prepare_kjv(data_dir, cfg->data.tokenizer, prep_progress, &live,
                           tg, sizeof tg, vg, sizeof vg, &prepared, err,
                           cap) != 0)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* The command                                                                */
/* ------------------------------------------------------------------------- */
int cmd_train(int argc, char **argv) {
    if (cmd_wants_help(argc, argv)) {
        usage(stdout);
        return ORCH_EXIT_OK;
    }
    const char *config_path = NULL, *engine = NULL, *out_dir = NULL;
    const char *resume_arg = NULL, *init_arg = NULL;
    int resume = 0;
    uint64_t steps = 0, stop_after = 0;
    int metrics_port = -1;
    const char *sets[MAX_SETS + 4];
    size_t n_sets = 0;
    char err[4096];

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--resume") == 0) {
            resume = 1;
        } else if (strncmp(a, "--resume=", 9) == 0) {
            resume = 1;
            resume_arg = a + 9;
            if (!*resume_arg) {
                util_error("train: --resume= needs a directory");
                return ORCH_EXIT_USAGE;
            }
        } else if ((v = util_flag_value("--init", argc, argv, &i))) {
            init_arg = v;
        } else if ((v = util_flag_value("--config", argc, argv, &i))) {
            config_path = v;
        } else if ((v = util_flag_value("--engine", argc, argv, &i))) {
            engine = v;
        } else if ((v = util_flag_value("--out", argc, argv, &i))) {
            out_dir = v;
        } else if ((v = util_flag_value("--steps", argc, argv, &i))) {
            if (util_parse_u64(v, &steps) != 0 || steps == 0 ||
                steps > (1ull << 53)) {
                util_error("train: --steps '%s': expected a positive integer", v);
                return ORCH_EXIT_USAGE;
            }
        } else if ((v = util_flag_value("--stop-after", argc, argv, &i))) {
            if (util_parse_u64(v, &stop_after) != 0 || stop_after == 0) {
                util_error("train: --stop-after '%s': expected a positive "
                           "integer",
                           v);
                return ORCH_EXIT_USAGE;
            }
        } else if ((v = util_flag_value("--metrics-port", argc, argv, &i))) {
            uint64_t p;
            if (util_parse_u64(v, &p) != 0 || p > 65535) {
                util_error("train: --metrics-port '%s': expected 0..65535", v);
                return ORCH_EXIT_USAGE;
            }
            metrics_port = (int)p;
        } else if ((v = util_flag_value("--set", argc, argv, &i))) {
            if (n_sets >= MAX_SETS) {
                util_error("train: too many --set options");
                return ORCH_EXIT_USAGE;
            }
            sets[n_sets++] = v;
        } else {
            util_error("train: unknown argument '%s' (see orch train --help)", a);
            return ORCH_EXIT_USAGE;
        }
    }

    if (init_arg && resume) {
        util_error("train: --init starts a new run; it cannot be combined with "
                   "--resume");
        return ORCH_EXIT_USAGE;
    }
    int live = isatty(STDOUT_FILENO) && !(getenv("TERM") &&
                                          strcmp(getenv("TERM"), "dumb") == 0);
    orch_config *cfg = NULL, *ckpt_cfg = NULL;
    int rc = ORCH_EXIT_USAGE;
    int trained = 0; /* train_run succeeded (on every rank) */
    char run_dir[PATH_MAX], ckpt_dir[PATH_MAX] = "", init_dir[PATH_MAX] = "";
    char default_root[PATH_MAX] = "";
    int using_default = config_path == NULL && !resume && !init_arg;
    char data_sets[2][CONFIG_PATH_MAX + 16];
    const char *root_sets[2];

    /* Where the run lives. */
    if (out_dir) {
        snprintf(run_dir, sizeof run_dir, "%s", out_dir);
    } else if (resume_arg) {
        /* A checkpoint directory (holds state.json) belongs to its parent. */
        char sj[PATH_MAX + 16];
        snprintf(sj, sizeof sj, "%s/state.json", resume_arg);
        if (is_file(sj)) {
            snprintf(run_dir, sizeof run_dir, "%s", resume_arg);
            char *s = strrchr(run_dir, '/');
            while (s && s[1] == '\0' && s > run_dir) { /* trailing slash */
                *s = '\0';
                s = strrchr(run_dir, '/');
            }
            if (s)
                *s = '\0';
            else
                snprintf(run_dir, sizeof run_dir, ".");
        } else {
            snprintf(run_dir, sizeof run_dir, "%s", resume_arg);
        }
    } else if (config_path) {
        char stem[256];
        config_stem(config_path, stem, sizeof stem);
        snprintf(run_dir, sizeof run_dir, "runs/%s", stem);
    } else if (init_arg) {
        snprintf(run_dir, sizeof run_dir, "runs/finetune");
    } else {
        snprintf(run_dir, sizeof run_dir, "runs/default");
    }

    /* The built-in default continues its own run when one exists. */
    if (using_default && !out_dir) {
        char w[1024] = "", e2[1024];
        if (is_dir(run_dir) &&
            ckpt_find_latest(run_dir, ckpt_dir, sizeof ckpt_dir, w, sizeof w, e2,
                             sizeof e2) == 0) {
            resume = 1;
            using_default = 0; /* take the checkpoint's config */
        }
    }

    /* The checkpoint to resume from. */
    if (resume) {
        char w[1024] = "";
        const char *from = resume_arg ? resume_arg : run_dir;
        if (!ckpt_dir[0] && ckpt_find_latest(from, ckpt_dir, sizeof ckpt_dir, w,
                                             sizeof w, err, sizeof err) != 0) {
            util_error("train: --resume: %s", err);
            return ORCH_EXIT_USAGE;
        }
        if (w[0]) util_warn("%s", w);
        if (train_read_checkpoint_config(ckpt_dir, &ckpt_cfg, NULL, 0, err,
                                         sizeof err) != 0) {
            util_error("train: --resume: %s", err);
            return ORCH_EXIT_USAGE;
        }
    }

    /* The checkpoint whose weights start a new run. */
    if (init_arg) {
        char w[1024] = "";
        if (ckpt_find_latest(init_arg, init_dir, sizeof init_dir, w, sizeof w,
                             err, sizeof err) != 0) {
            util_error("train: --init: %s", err);
            return ORCH_EXIT_USAGE;
        }
        if (w[0]) util_warn("%s", w);
        if (train_read_checkpoint_config(init_dir, &ckpt_cfg, NULL, 0, err,
                                         sizeof err) != 0) {
            util_error("train: --init: %s", err);
            return ORCH_EXIT_USAGE;
        }
    }

    /* The base config. */
    if (config_path) {
        if (config_load_file(config_path, &cfg, err, sizeof err) != 0) {
            util_error("%s", err);
            goto done;
        }
        if (ckpt_cfg && !config_same_model(cfg, ckpt_cfg)) {
            util_error("train: %s: the model section of %s differs from "
                       "the one in %s/state.json",
                       init_arg ? "--init" : "--resume", config_path,
                       init_arg ? init_dir : ckpt_dir);
            goto done;
        }
    } else if (ckpt_cfg) {
        cfg = ckpt_cfg;
        ckpt_cfg = NULL;
    } else {
        char path[PATH_MAX + 64];
        if (find_default_config(path, sizeof path, default_root,
                                sizeof default_root) != 0) {
            util_error("train: no --config given and the built-in default "
                       "(configs/default.json next to orch or in the current "
                       "directory) is missing");
            goto done;
        }
        if (config_load_file(path, &cfg, err, sizeof err) != 0) {
            util_error("%s", err);
            goto done;
        }
        /* Relative data paths of the built-in default live under its root. */
        size_t n = 0;
        const char *keys[2] = {"data.train", "data.val"};
        const char *vals[2] = {cfg->data.train, cfg->data.val};
        for (int k = 0; k < 2; k++) {
            if (vals[k][0] == '/' || strcmp(default_root, ".") == 0) continue;
            snprintf(data_sets[n], sizeof data_sets[n], "%s=%s/%s", keys[k],
                     default_root, vals[k]);
            root_sets[n] = data_sets[n];
            n++;
        }
        if (config_apply_overrides(cfg, root_sets, n, err, sizeof err) != 0) {
            util_error("train: %s", err);
            goto done;
        }
    }

    /* Overrides: --set first, then the dedicated flags. */
    char steps_set[64], engine_set[CONFIG_PATH_MAX + 16];
    if (steps) {
        sets[n_sets++] = "train.epochs=null";
        snprintf(steps_set, sizeof steps_set, "train.max_steps=%llu",
                 (unsigned long long)steps);
        sets[n_sets++] = steps_set;
    }
    if (engine) {
        snprintf(engine_set, sizeof engine_set, "engine.name=%s", engine);
        sets[n_sets++] = engine_set;
    }
    if (config_apply_overrides(cfg, sets, n_sets, err, sizeof err) != 0) {
        util_error("train: %s", err);
        goto done;
    }
    if (resume || init_arg) {
        const char *from = resume ? ckpt_dir : init_dir;
        orch_config *check = NULL;
        if (train_read_checkpoint_config(from, &check, NULL, 0, err,
                                         sizeof err) == 0) {
            int same = config_same_model(cfg, check);
            config_free(check);
            if (!same) {
                util_error("train: %s: the model section cannot change (it "
                           "differs from %s/state.json)",
                           resume ? "--resume" : "--init", from);
                goto done;
            }
        }
    }

    /* A fresh run must not silently mix with an existing one. */
    if (!resume && is_dir(run_dir)) {
        char w[1024], e2[1024], found[PATH_MAX];
        if (ckpt_find_latest(run_dir, found, sizeof found, w, sizeof w, e2,
                             sizeof e2) == 0) {
            util_error("train: %s already holds checkpoints (newest %s): use "
                       "--resume to continue it or --out for a new run",
                       run_dir, found);
            goto done;
        }
    }

    /* Data parallel under mpirun/srun (dist.h): from here on every rank
     * takes part; rank 0 alone prepares data, prints and serves metrics. */
    if (dist_init(err, sizeof err) != 0) {
        util_error("train: %s", err);
        goto done;
    }
    if (dist_world() > 1) {
        char *cj = config_to_json(cfg);
        int oom = cj == NULL;
        int same = cj && dist_check_same(cj, strlen(cj), "the merged config",
                                         err, sizeof err) == 0 &&
                   dist_check_same(ckpt_dir, strlen(ckpt_dir),
                                   "the checkpoint to resume from", err,
                                   sizeof err) == 0;
        free(cj);
        if (!same) {
            util_error("train: rank %d: %s", dist_rank(),
                       oom ? "out of memory" : err);
            goto done;
        }
    }

    /* The default corpus, prepared on first use. */
    err[0] = '\0';
    int prep = dist_is_root() ? ensure_kjv(cfg, live, err, sizeof err) : 0;
    if (dist_share_status(&prep, err, sizeof err, err, sizeof err) != 0 ||
        prep != 0) {
        util_error("train: %s", err);
        rc = ORCH_EXIT_FAILURE;
        goto done;
    }

    train_opts o;
    memset(&o, 0, sizeof o);
    o.cfg = cfg;
    o.run_dir = run_dir;
    o.resume_ckpt = resume ? ckpt_dir : NULL;
    o.init_ckpt = init_arg ? init_dir : NULL;
    o.stop_after = stop_after;
    o.metrics_port = dist_is_root() ? metrics_port : -1;
    o.stop_flag = &g_stop;
    o.out = dist_is_root() ? stdout : NULL;
    o.live = live && dist_world() == 1; /* launchers fake a terminal */
    train_result res;
    int kind = TRAIN_ERR_RUNTIME;
    g_stop = 0;
    g_sigints = 0;
    g_live = live;
    install_signals();
    if (dist_world() > 1 && dist_is_root()) {
        printf("train: data parallel over %d ranks (MPI); rank 0 logs and "
               "writes checkpoints\n",
               dist_world());
        fflush(stdout);
    }
    int trc = train_run(&o, &res, &kind, err, sizeof err);
    restore_signals();
    if (trc != 0) {
        if (dist_world() > 1)
            util_error("train: rank %d of %d: %s", dist_rank(), dist_world(), err);
        else
            util_error("train: %s", err);
        rc = kind == TRAIN_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
        goto done;
    }

    trained = 1;
    if (!dist_is_root()) { /* rank 0 prints the summary */
        rc = res.outcome == TRAIN_INTERRUPTED ? TRAIN_EXIT_INTERRUPTED
                                              : ORCH_EXIT_OK;
        goto done;
    }

    /* Summary. */
    char el[32], run[32];
    long e = (long)(res.elapsed_s + 0.5), r = (long)(res.run_s + 0.5);
    snprintf(el, sizeof el, "%ldm%02lds", e / 60, e % 60);
    snprintf(run, sizeof run, "%ldm%02lds", r / 60, r % 60);
    switch (res.outcome) {
    case TRAIN_ALREADY_DONE:
        printf("train: %s is already at step %llu of %llu: nothing to do "
               "(raise it with --steps)\n",
               ckpt_dir, (unsigned long long)res.step,
               (unsigned long long)res.total_steps);
        break;
    case TRAIN_COMPLETED:
    case TRAIN_EARLY_STOPPED:
    case TRAIN_PAUSED:
    case TRAIN_INTERRUPTED:
        printf("%s at step %llu/%llu after %s (this run %s, %.0f tok/s)\n",
               res.outcome == TRAIN_COMPLETED       ? "done"
               : res.outcome == TRAIN_EARLY_STOPPED ? "stopped early"
               : res.outcome == TRAIN_PAUSED        ? "paused"
                                                    : "interrupted",
               (unsigned long long)res.step, (unsigned long long)res.total_steps,
               el, run, res.tokens_per_s);
        printf("  train loss %.4f", res.last_loss);
        if (isfinite(res.last_val_loss))
            printf(" | val loss %.4f (perplexity %.2f)", res.last_val_loss,
                   exp(res.last_val_loss));
        if (isfinite(res.best_val_loss))
            printf(" | best val %.4f at step %llu", res.best_val_loss,
                   (unsigned long long)res.best_val_step);
        printf("\n  checkpoint %s\n", res.checkpoint);
        if (res.outcome == TRAIN_PAUSED || res.outcome == TRAIN_INTERRUPTED)
            printf("  continue with: orch train --resume=%s\n", run_dir);
        break;
    }
    fflush(stdout);
    rc = res.outcome == TRAIN_INTERRUPTED ? TRAIN_EXIT_INTERRUPTED
                                          : ORCH_EXIT_OK;
done:
    config_free(cfg);
    config_free(ckpt_cfg);
    /* Every rank that finished train_run agrees on rc; any other failure
     * stops all ranks (MPI_Abort). */
    return dist_finish(rc, trained);
}
