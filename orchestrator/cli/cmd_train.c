/*
 * cmd_train.c - `orch train`: the command line around run_setup (fresh run,
 * --resume or --init, the merged config; train/run_setup.h) and train_run
 * (train/train.h): default-corpus preparation, the data-parallel agreement,
 * signal handling and the final summary.
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "orchestrator/cli/commands.h"
#include "orchestrator/cli/flags.h"
#include "orchestrator/cli/out_dir.h"
#include "orchestrator/core/config.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/corpus.h"
#include "orchestrator/train/dist.h"
#include "orchestrator/train/run_setup.h"
#include "orchestrator/train/train.h"

#define MAX_SETS 256

static const char usage_text[] =
    "usage: orch train [--config FILE] [--engine E] [--steps N] [--out DIR]\n"
    "                  [--resume[=DIR] | --init DIR] [--set KEY=VALUE ...]\n"
    "                  [--metrics-port N] [--stop-after N] [--trust-config-engine]\n"
    "\n"
    "Trains a GPT-style model. Without --config it trains the built-in\n"
    "default (configs/default.json next to the orch binary, else\n"
    "./configs/default.json) on the King James Bible, preparing the\n"
    "corpus once, into runs/default (continuing it if it exists).\n"
    "\n"
    "options:\n";

static const char footer_text[] =
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
    "signal after writing a checkpoint, 130 second SIGINT.\n";

/* The command line: run_setup's options plus what train_run takes. */
typedef struct train_args {
    run_setup_opts setup;
    const char *sets[MAX_SETS];
    uint64_t stop_after;
    int metrics_port;
} train_args;

/* Flags into a; 0, or 1 with the exit status in *st. */
static int parse_args(int argc, char **argv, train_args *a, int *st) {
    memset(a, 0, sizeof *a);
    a->metrics_port = -1;
    run_setup_opts *o = &a->setup;
    const flag_spec flags[] = {
        { "--config", FLAG_STRING, &o->config_path, "FILE",
          .help = "run configuration (JSON; see `orch config check`)" },
        { "--engine", FLAG_STRING, &o->engine, "E",
          .help = "engine: mock | cpu | cuda | FILE.so (engine.name)" },
        { "--trust-config-engine", FLAG_TRUE, &o->trust_config_engine, NULL,
          .help = "load the engine.name of the config or checkpoint\n"
                  "even when it is a library file or path (by default\n"
                  "only mock, cpu and cuda are taken from files)" },
        { "--steps", FLAG_U64, &o->steps, "N",
          .help = "train to step N (train.max_steps)", .min = 1,
          .max = (int64_t)1 << 53 },
        { "--out", FLAG_STRING, &o->out_dir, "DIR",
          .help = "run directory (default runs/<config name>, or\n"
                  "runs/finetune with --init and no --config)" },
        { "--resume", FLAG_OPTIONAL, &o->resume_from, "[=DIR]",
          .help = "continue from the newest complete checkpoint of\n"
                  "DIR (a run or checkpoint directory; default the\n"
                  "--out directory), with its saved config unless\n"
                  "--config is given (the model must match)",
          .seen = &o->resume },
        { "--init", FLAG_STRING, &o->init_from, "DIR",
          .help = "start a new run from the weights of checkpoint DIR\n"
                  "(e.g. from `orch import-gpt2`: fine-tuning), with\n"
                  "its config unless --config is given" },
        { "--set", FLAG_LIST, a->sets, "KEY=VALUE",
          .help = "override any config key, e.g. --set train.lr=3e-4\n"
                  "(VALUE is JSON when it parses, else a string;\n"
                  "null restores the default); repeatable",
          .max = MAX_SETS, .count = &o->n_sets },
        { "--metrics-port", FLAG_INT, &a->metrics_port, "N",
          .help =
              "serve Prometheus metrics on 127.0.0.1:N/metrics\n(0 picks a free port)",
          .min = 0, .max = 65535 },
        { "--stop-after", FLAG_U64, &a->stop_after, "N",
          .help = "stop after N steps of this invocation with a\n"
                  "checkpoint (exit 0), e.g. to split a run",
          .min = 1 },
        { NULL },
    };
    const flags_cmd cmd = {
        .name = "train", .usage = usage_text, .flags = flags, .footer = footer_text
    };
    if (flags_parse(&cmd, argc, argv, st)) return 1;
    o->sets = a->sets;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Signals                                                                    */
/* ------------------------------------------------------------------------- */
static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_sigints;
static volatile sig_atomic_t
    g_live; /* a progress line may be open: start messages on a new line */

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
/* Around train_run                                                           */
/* ------------------------------------------------------------------------- */
static void prep_progress(void *user, uint64_t done, uint64_t total) {
    int live = *(int *)user;
    if (!total) return;
    if (live) printf("\rpreparing the KJV corpus: %3.0f%%", 100.0 * done / total);
    if (done == total) printf(live ? "\n" : "preparing the KJV corpus: done\n");
    fflush(stdout);
}

/* The default corpus, prepared (once) when the config wants it. */
static int ensure_kjv(const orch_config *cfg, int live, char *err, size_t cap) {
    char data_dir[CONFIG_PATH_MAX];
    if (!run_setup_default_corpus(cfg, data_dir, sizeof data_dir)) return 0;
    printf("train: %s has no shards yet: preparing the King James Bible (once)\n",
           cfg->data.train);
    fflush(stdout);
    char tg[CONFIG_PATH_MAX], vg[CONFIG_PATH_MAX];
    int prepared = 0;
    return corpus_prepare_kjv(data_dir, cfg->data.tokenizer, prep_progress, &live, tg,
                              sizeof tg, vg, sizeof vg, &prepared, err, cap);
}

/* Data parallel under mpirun/srun (dist.h): every rank must hold the same
 * merged config and checkpoint. 0, or -1 after printing the error. */
static int dist_agree(const run_setup *rs, char *err, size_t cap) {
    if (dist_init(err, cap) != 0) {
        util_error("train: %s", err);
        return -1;
    }
    if (dist_world() <= 1) return 0;
    char *cj = config_to_json(rs->cfg);
    int oom = cj == NULL;
    int same = cj &&
               dist_check_same(cj, strlen(cj), "the merged config", err, cap) == 0 &&
               dist_check_same(rs->resume_ckpt, strlen(rs->resume_ckpt),
                               "the checkpoint to resume from", err, cap) == 0;
    free(cj);
    if (same) return 0;
    util_error("train: rank %d: %s", dist_rank(), oom ? "out of memory" : err);
    return -1;
}

/* "3m07s" */
static void format_duration(double s, char *out, size_t cap) {
    long t = (long)(s + 0.5);
    snprintf(out, cap, "%ldm%02lds", t / 60, t % 60);
}

static void print_summary(const run_setup *rs, const train_result *res) {
    char el[32], run[32];
    format_duration(res->elapsed_s, el, sizeof el);
    format_duration(res->run_s, run, sizeof run);
    if (res->outcome == TRAIN_ALREADY_DONE) {
        printf("train: %s is already at step %llu of %llu: nothing to do "
               "(raise it with --steps)\n",
               rs->resume_ckpt, (unsigned long long)res->step,
               (unsigned long long)res->total_steps);
        fflush(stdout);
        return;
    }
    printf("%s at step %llu/%llu after %s (this run %s, %.0f tok/s)\n",
           res->outcome == TRAIN_COMPLETED       ? "done"
           : res->outcome == TRAIN_EARLY_STOPPED ? "stopped early"
           : res->outcome == TRAIN_PAUSED        ? "paused"
                                                 : "interrupted",
           (unsigned long long)res->step, (unsigned long long)res->total_steps, el, run,
           res->tokens_per_s);
    printf("  train loss %.4f", res->last_loss);
    if (isfinite(res->last_val_loss))
        printf(" | val loss %.4f (perplexity %.2f)", res->last_val_loss,
               exp(res->last_val_loss));
    if (isfinite(res->best_val_loss))
        printf(" | best val %.4f at step %llu", res->best_val_loss,
               (unsigned long long)res->best_val_step);
    printf("\n  checkpoint %s\n", res->checkpoint);
    if (res->outcome == TRAIN_PAUSED || res->outcome == TRAIN_INTERRUPTED)
        printf("  continue with: orch train --resume=%s\n", rs->run_dir);
    fflush(stdout);
}

/* train_run with the signal handlers installed. Returns the exit status;
 * *trained says it succeeded on this rank. */
static int run_training(const train_args *a, const run_setup *rs, int live,
                        int *trained) {
    char err[4096];
    train_opts o;
    memset(&o, 0, sizeof o);
    o.cfg = rs->cfg;
    o.run_dir = rs->run_dir;
    o.resume_ckpt = rs->resume_ckpt[0] ? rs->resume_ckpt : NULL;
    o.init_ckpt = rs->init_ckpt[0] ? rs->init_ckpt : NULL;
    o.stop_after = a->stop_after;
    o.metrics_port = dist_is_root() ? a->metrics_port : -1;
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
        return kind == TRAIN_ERR_INPUT ? ORCH_EXIT_USAGE : ORCH_EXIT_FAILURE;
    }
    *trained = 1;
    if (dist_is_root()) print_summary(rs, &res); /* rank 0 prints the summary */
    return res.outcome == TRAIN_INTERRUPTED ? TRAIN_EXIT_INTERRUPTED : ORCH_EXIT_OK;
}

int cmd_train(int argc, char **argv) {
    train_args a;
    int rc;
    if (parse_args(argc, argv, &a, &rc)) return rc;
    int live =
        isatty(STDOUT_FILENO) && !(getenv("TERM") && strcmp(getenv("TERM"), "dumb") == 0);
    char err[4096];
    run_setup rs;
    if (run_setup_prepare(&a.setup, &rs, err, sizeof err) != 0) {
        util_error("train: %s", err);
        return ORCH_EXIT_USAGE; /* before dist_init: nothing to finish */
    }
    if (rs.warn[0]) util_warn("%s", rs.warn);
    int trained = 0; /* train_run succeeded (on every rank) */
    rc = ORCH_EXIT_USAGE;
    if (dist_agree(&rs, err, sizeof err) != 0) goto done;
    /* The default corpus, prepared on first use (rank 0; the others wait). */
    err[0] = '\0';
    int prep = dist_is_root() ? ensure_kjv(rs.cfg, live, err, sizeof err) : 0;
    if (dist_share_status(&prep, err, sizeof err, err, sizeof err) != 0 || prep != 0) {
        util_error("train: %s", err);
        rc = ORCH_EXIT_FAILURE;
        goto done;
    }
    /* train_run creates the run directory before it opens the data and the
     * engine: a run that fails removes it again while it is empty. */
    out_dir_guard od;
    out_dir_guard_begin(&od, rs.run_dir);
    rc = run_training(&a, &rs, live, &trained);
    if (!trained) out_dir_guard_undo(&od);
done:
    run_setup_free(&rs);
    /* Every rank that finished train_run agrees on rc; any other failure
     * stops all ranks (MPI_Abort). */
    return dist_finish(rc, trained);
}
