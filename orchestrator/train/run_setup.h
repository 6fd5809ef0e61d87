/*
 * run_setup.h - what `orch train` decides before it trains: fresh run,
 * --resume or --init; the run directory; the checkpoint to continue or to
 * take weights from; the merged config (a --config file, the checkpoint's
 * config, or the built-in default) with the command-line overrides; and the
 * checks that keep runs apart. Nothing is created or written here: a run that
 * fails these checks leaves no trace.
 *
 * Decisions, in order:
 *   - --init and --resume together are refused.
 *   - Run directory: --out; else for --resume=DIR the run DIR belongs to (a
 *     checkpoint directory, one holding state.json, belongs to its parent);
 *     else runs/<config file name without .json>; else runs/finetune with
 *     --init; else runs/default.
 *   - The built-in default (no --config, --resume or --init) continues
 *     runs/default when that holds a checkpoint (and no --out is given).
 *   - --resume: the newest complete checkpoint of --resume=DIR or of the run
 *     directory (ckpt_find_latest); --init: that of the --init directory.
 *   - Base config: --config FILE (whose model section must equal the
 *     checkpoint's, if any); else the checkpoint's config; else the built-in
 *     default DEFAULT_ROOT/configs/default.json, DEFAULT_ROOT being the
 *     directory above the orch binary's, else "." (relative data.train and
 *     data.val of the default are taken relative to DEFAULT_ROOT).
 *   - Overrides: the --set list first, then --steps (train.epochs=null,
 *     train.max_steps=N) and --engine (engine.name=E). The model section must
 *     still equal the checkpoint's after them.
 *   - A fresh run (not --resume) refuses a run directory that already holds
 *     a checkpoint.
 *   - Engine trust: unless --engine (or --set engine.name=...) names it on
 *     the command line, the merged engine.name comes from a file (the
 *     --config file, the checkpoint's state.json or the built-in default)
 *     and must be a built-in engine name (mock, cpu, cuda) unless
 *     --trust-config-engine is given (engine_check_config_name). So a
 *     config or checkpoint cannot make `orch train` dlopen a library.
 *
 * Memory: run_setup owns its cfg (run_setup_free); opts strings are borrowed.
 * Threads: no shared state (reads the file system and /proc/self/exe).
 * Errors: -1 with one line in err (no "train: " prefix), e.g.
 *   "--init starts a new run; it cannot be combined with --resume"
 *   "--resume: runs/x: no such checkpoint or run directory"
 *   "--resume: the model section of a.json differs from the one in
 *    runs/x/ckpt-00000040/state.json"
 *   "--init: the model section cannot change (it differs from DIR/state.json)"
 *   "runs/t already holds checkpoints (newest runs/t/ckpt-00000040): use
 *    --resume to continue it or --out for a new run"
 *   "runs/x/ckpt-00000040/state.json: config engine.name 'x.so' is a library
 *    path; paths are only accepted from the command line: pass
 *    --engine=x.so, or --trust-config-engine"
 * and config errors as config.h words them; all are bad input (exit 2).
 */
#ifndef ORCH_RUN_SETUP_H
#define ORCH_RUN_SETUP_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/config.h"

typedef struct run_setup_opts {
    const char *config_path; /* --config FILE, or NULL */
    const char *engine;      /* --engine E, or NULL */
    const char *out_dir;     /* --out DIR, or NULL */
    int resume;              /* --resume or --resume=DIR given */
    const char *resume_from; /* the DIR of --resume=DIR, or NULL */
    const char *init_from;   /* --init DIR, or NULL */
    uint64_t steps;          /* --steps N; 0 = the config's */
    const char *const *sets; /* --set KEY=VALUE overrides */
    size_t n_sets;
    const char *default_root; /* holds configs/default.json; NULL = search
                                     (<exe dir>/.., then ".") */
    int trust_config_engine;  /* --trust-config-engine: engine.name from a
                                 file may be a library file or path */
} run_setup_opts;

typedef struct run_setup {
    orch_config *cfg; /* the merged config (owned) */
    char run_dir[PATH_MAX];
    char resume_ckpt[PATH_MAX]; /* checkpoint to continue; "" = fresh run */
    char init_ckpt[PATH_MAX];   /* checkpoint whose weights start the run,
                                     or "" */
    int default_continued;      /* the built-in default found its run */
    char warn[1024];            /* a warning to show (e.g. `latest` was
                                     damaged, an older checkpoint is used), or
                                     "" */
} run_setup;

/* Decide everything above. On success *rs is filled (run_setup_free it); on
 * failure it holds nothing to free. */
int run_setup_prepare(const run_setup_opts *o, run_setup *rs, char *err, size_t err_cap);

void run_setup_free(run_setup *rs);

/* The built-in default corpus: 1 when data.train or data.val match no file
 * and data.train has the form [DATA/]kjv-<tokenizer>/FILE-PATTERN, with
 * DATA (or ".") in data_dir: the King James Bible should be prepared there
 * (corpus_prepare_kjv). 0 when the shards exist or belong to someone else
 * (dataset_open will explain what is missing). */
int run_setup_default_corpus(const orch_config *cfg, char *data_dir, size_t cap);

#endif
