/*
 * ckpt_files.h - what saving (ckpt_save.c) and reading (checkpoint.c) a
 * checkpoint share: the names of a checkpoint directory's files, ckpt-STEP
 * directory names, the list of a run directory's checkpoints, removing a
 * directory tree, and access to tensor tables (an engine's PARAM / ADAM_M /
 * ADAM_V tables, or tensors in host memory). Internal to orchestrator/store;
 * other modules use checkpoint.h.
 *
 * Memory: ckpt_list returns a malloc'd array the caller frees.
 * Threads: reentrant (no shared state).
 * Errors: 0 / -1 with a one-line message in err where there is an err
 * argument; nothing is printed.
 */
#ifndef ORCH_CKPT_FILES_H
#define ORCH_CKPT_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/store/ckpt_save.h"

#define CKPT_MODEL_FILE  "model.safetensors"
#define CKPT_OPTIM_FILE  "optimizer.safetensors"
#define CKPT_STATE_FILE  "state.json"
#define CKPT_META_FILE   "meta.json"
#define CKPT_SUMS_FILE   "checksums.sha256"
#define CKPT_LATEST_FILE "latest"
#define CKPT_PREFIX      "ckpt-"
/* Temp names inside a run directory, each ending in "-PID" of the writer. */
#define CKPT_TMP_PREFIX        ".tmp-ckpt-"
#define CKPT_TRASH_PREFIX      ".trash-ckpt-"
#define CKPT_LATEST_TMP_PREFIX ".latest.tmp-"

/* What a checkpoint's safetensors files say about themselves in
 * "__metadata__": "format": "orch", "layout": "orch-ARCH" (ARCH the config's
 * model.arch: orch's tensor names and the [out, in] layout of linear layers,
 * which is not Hugging Face's), "layout_version": "1". Files written before
 * these keys carry "format": "pt" or no metadata and load as layout 1. */
#define CKPT_META_FORMAT    "orch"
#define CKPT_LAYOUT_PREFIX  "orch-"
#define CKPT_LAYOUT_VERSION "1"

struct safetensors_file;
/* 0 when a checkpoint file's metadata is a layout this code reads (above),
 * else -1 with "FPATH: ..." in err. */
int ckpt_check_layout(const char *fpath, const struct safetensors_file *f, char *err,
                      size_t err_cap);

/* Largest state.json read back (it holds the config and the trainer state). */
#define CKPT_STATE_MAX_BYTES ((size_t)1 << 30)
#define CKPT_META_MAX_BYTES  ((size_t)1 << 20)

/* out = DIR/NAME ("DIR/NAME: path too long" when it does not fit). */
int ckpt_path_join(char *out, size_t cap, const char *dir, const char *name, char *err,
                   size_t err_cap);
/* 1 when PATH is a directory / a regular file / anything at all (following
 * symlinks). */
int ckpt_is_dir(const char *path);
int ckpt_is_file(const char *path);
int ckpt_exists(const char *path);
/* "ckpt-DIGITS" -> step: 0, or -1 when the name is not one. */
int ckpt_parse_name(const char *name, uint64_t *step);

/* One ckpt-* directory of a run directory. */
typedef struct ckpt_ent {
    uint64_t step;
    double val_loss; /* NaN until the caller fills it in */
    char name[64];
} ckpt_ent;

/* The ckpt-* directories of run_dir, newest (highest step) first; *out
 * malloc'd (caller frees). -1 (errno set) when run_dir cannot be listed. */
int ckpt_list(const char *run_dir, ckpt_ent **out, size_t *n_out);

/* A tensor table: an engine's (h != NULL: table `kind` of ctx) or host
 * memory (h == NULL: mem[0 .. n_mem)). */
typedef struct ckpt_tsrc {
    const engine_handle *h;
    orch_engine_ctx *ctx;
    uint32_t kind;
    const ckpt_tensor *mem;
    size_t n_mem;
} ckpt_tsrc;

/* Name, dtype, shape and byte size of one tensor of a table. */
typedef struct ckpt_tdesc {
    char name[ORCH_TENSOR_NAME_MAX];
    int dtype;
    uint32_t ndim;
    uint64_t shape[ORCH_TENSOR_MAX_DIMS];
    uint64_t nbytes;
} ckpt_tdesc;

int ckpt_tsrc_count(const ckpt_tsrc *s, size_t *n, char *err, size_t err_cap);
int ckpt_tsrc_desc(const ckpt_tsrc *s, size_t i, ckpt_tdesc *d, char *err,
                   size_t err_cap);
/* err = "WHAT: <the engine's error text for status st>". */
void ckpt_engine_err(const engine_handle *h, orch_engine_ctx *ctx, int32_t st,
                     const char *what, char *err, size_t err_cap);

#endif
