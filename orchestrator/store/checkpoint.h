/*
 * checkpoint.h - atomic, engine-portable training checkpoints.
 *
 * A run directory holds one directory per saved step and a pointer file:
 *   RUN/ckpt-00000200/model.safetensors      PARAM table, by tensor name
 *   RUN/ckpt-00000200/optimizer.safetensors  ADAM_M as "m.NAME", ADAM_V as
 *                                             "v.NAME" (absent when saved
 *                                             without optimizer state)
 *   RUN/ckpt-00000200/state.json             the trainer's JSON, verbatim
 *   RUN/ckpt-00000200/meta.json              {"format":1,"step":..,"val_loss":..
 *                                             ,"engine":..,"with_optimizer":..}
 *   RUN/ckpt-00000200/checksums.sha256       "HEX  FILE" lines over the files
 *                                             above (sha256sum -c format),
 *                                             written last
 *   RUN/latest                               "ckpt-00000200\n"
 *
 * Save protocol (ckpt_save): stale temp dirs of dead processes are removed;
 * everything is written into RUN/.tmp-ckpt-STEP-PID/, every file and the dir
 * are fsynced, the dir is renamed to ckpt-STEP (atomically exchanged with an
 * existing ckpt-STEP when one is there), RUN is fsynced, then `latest` is
 * replaced (temp file + fsync + rename + fsync RUN). Only after that does
 * retention delete old checkpoints: it keeps the newest keep_last by step, the
 * one with the lowest finite val_loss, and never the one `latest` names.
 * A crash at any instant leaves `latest` naming a complete, verified
 * checkpoint (or no `latest` before the first save completes).
 *
 * Loading matches tensors BY NAME and shape (through the engine's
 * tensor_write), so a checkpoint written through one engine loads through
 * another. A missing tensor, an extra tensor, or a shape/dtype mismatch is an
 * error naming the tensor.
 *
 * Memory: strings returned through char ** are malloc'd; the caller frees.
 * Threads: functions are reentrant; two processes must not save into the same
 * run directory at once.
 * Errors: 0 / -1 with a one-line message in err; nothing is printed.
 */
#ifndef ORCH_CHECKPOINT_H
#define ORCH_CHECKPOINT_H

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
              orch_engine_ctx *ctx, const char *state_json,
              const ckpt_save_opts *o, char *out_dir, size_t out_cap,
              char *err, size_t err_cap);

/* One named tensor in host memory, for ckpt_write_dir (e.g. imported weights). */
typedef struct ckpt_tensor {
    const char *name;
    int dtype;                            /* safetensors_dtype / orch_dtype */
    uint32_t ndim;
    uint64_t shape[ORCH_TENSOR_MAX_DIMS];
    const void *data;                     /* numel * dtype size bytes */
} ckpt_tensor;

/* Write a standalone checkpoint directory at exactly CKPT_DIR (model tensors,
 * no optimizer state, state_json verbatim, meta.json, checksums) atomically:
 * temp dir, fsync, rename. CKPT_DIR must not exist yet. step goes to meta. */
int ckpt_write_dir(const char *ckpt_dir, const ckpt_tensor *tensors, size_t n,
                   const char *state_json, uint64_t step, char *err,
                   size_t err_cap);

/* Resolve PATH to a checkpoint directory:
 *  - a checkpoint directory itself (holds state.json): verified, returned;
 *  - a run directory: the one `latest` names if it verifies; otherwise (latest
 *    missing, unreadable, naming a missing or corrupt dir) the newest ckpt-*
 *    dir that verifies, with a one-line explanation in warn (warn[0] is '\0'
 *    when there is nothing to warn about).
 * Errors: no checkpoint at all, or none that verifies. */
int ckpt_find_latest(const char *path, char *out_dir, size_t out_cap,
                     char *warn, size_t warn_cap, char *err, size_t err_cap);

/* Check a checkpoint directory: checksums.sha256 present and well formed,
 * every file it lists present with the recorded SHA-256, model.safetensors and
 * state.json listed. */
int ckpt_verify(const char *ckpt_dir, char *err, size_t err_cap);

/* The state.json text of a checkpoint (malloc'd, NUL-terminated). */
int ckpt_read_state(const char *ckpt_dir, char **state_json, char *err,
                    size_t err_cap);

/* Step recorded in the checkpoint's meta.json (falls back to the ckpt-STEP
 * directory name). */
int ckpt_read_step(const char *ckpt_dir, uint64_t *step, char *err,
                   size_t err_cap);

/* 1 if the checkpoint holds optimizer.safetensors, else 0. */
int ckpt_has_optimizer(const char *ckpt_dir);

/* Load model.safetensors into the PARAM table by name and, if with_optimizer,
 * optimizer.safetensors into ADAM_M/ADAM_V (an error when the checkpoint has
 * none). F16/BF16 files are converted to the engine's f32. Does not verify
 * checksums (ckpt_find_latest does). */
int ckpt_load_weights(const char *ckpt_dir, const engine_handle *h,
                      orch_engine_ctx *ctx, int with_optimizer, char *err,
                      size_t err_cap);

#endif
