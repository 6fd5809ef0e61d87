/*
 * ckpt_save.h - writing checkpoints: ckpt_save (a training run's step, with
 * the `latest` pointer and retention) and ckpt_write_dir (a standalone
 * checkpoint directory, e.g. imported weights). The layout is described in
 * checkpoint.h, which includes this header; callers include checkpoint.h.
 *
 * Save protocol (ckpt_save): stale temp dirs of dead processes (and their
 * fsio temp files, e.g. config.json.tmp.PID.N) are removed;
 * everything is written into RUN/.tmp-ckpt-STEP-PID/, every file and the dir
 * are fsynced, the dir is renamed to ckpt-STEP (atomically exchanged with an
 * existing ckpt-STEP when one is there), RUN is fsynced, then `latest` is
 * replaced (temp file + fsync + rename + fsync RUN). Only after that does
 * retention delete old checkpoints: it keeps the newest keep_last by step, the
 * one with the lowest finite val_loss, and never the one `latest` names.
 * A crash at any instant leaves `latest` naming a complete, verified
 * checkpoint (or no `latest` before the first save completes).
 *
 * Memory: nothing is returned that the caller must free.
 * Threads: reentrant; two processes must not save into the same run
 * directory at once.
 * Errors: 0 / -1 with a one-line message in err naming the file that
 * failed; nothing is printed. A failed save removes its temp dir (or the
 * next save does) and leaves everything that existed before, `latest`
 * included, unchanged; once `latest` names the new checkpoint, a failure is
 * still reported (e.g. the final fsync of RUN) while `latest` stays valid.
 * Failures of the cleanup steps (stale temp dirs, retention) are not errors:
 * the next save retries them. tests/test_fault_injection.c fails every
 * write-side call of a save in turn and checks all of this.
 */
#ifndef ORCH_CKPT_SAVE_H
#define ORCH_CKPT_SAVE_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"

#define CKPT_FORMAT_VERSION 1

typedef struct ckpt_save_opts {
    int keep_last;      /* keep this many newest checkpoints; <= 0 keeps all */
    int with_optimizer; /* also save AdamW moments (needed to resume exactly) */
    double val_loss;    /* validation loss at this step; NaN = unknown */
} ckpt_save_opts;

/* Defaults: keep_last 3, with_optimizer 1, val_loss NaN. */
ckpt_save_opts ckpt_save_opts_default(void);

/* Save the engine's tensors and state_json (any JSON text, stored verbatim;
 * must parse as JSON) as RUN_DIR/ckpt-STEP (RUN_DIR is created if missing).
 * out_dir (may be NULL) receives the final checkpoint directory path.
 * On failure nothing that existed before is lost and `latest` is unchanged. */
int ckpt_save(const char *run_dir, uint64_t step, const engine_handle *h,
              orch_engine_ctx *ctx, const char *state_json, const ckpt_save_opts *o,
              char *out_dir, size_t out_cap, char *err, size_t err_cap);

/* One named tensor in host memory, for ckpt_write_dir (e.g. imported weights). */
typedef struct ckpt_tensor {
    const char *name;
    int dtype; /* safetensors_dtype / orch_dtype */
    uint32_t ndim;
    uint64_t shape[ORCH_TENSOR_MAX_DIMS];
    const void *data; /* numel * dtype size bytes */
} ckpt_tensor;

/* Write a standalone checkpoint directory at exactly CKPT_DIR (model tensors,
 * no optimizer state, state_json verbatim, meta.json, checksums) atomically:
 * temp dir, fsync, rename. CKPT_DIR must not exist yet. step goes to meta. */
int ckpt_write_dir(const char *ckpt_dir, const ckpt_tensor *tensors, size_t n,
                   const char *state_json, uint64_t step, char *err, size_t err_cap);

/* ckpt_write_dir, and before the rename extra(tmp_dir, user, err, err_cap)
 * adds files of its own to the temp directory (not in the checksums; e.g.
 * an imported model's tokenizer files); its nonzero return fails the write.
 * extra NULL: ckpt_write_dir. */
typedef int (*ckpt_extra_fn)(const char *tmp_dir, void *user, char *err, size_t err_cap);
int ckpt_write_dir_extra(const char *ckpt_dir, const ckpt_tensor *tensors, size_t n,
                         const char *state_json, uint64_t step, ckpt_extra_fn extra,
                         void *user, char *err, size_t err_cap);

#endif
