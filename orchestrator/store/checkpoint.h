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
 * Writing (ckpt_save, ckpt_write_dir, and the save protocol that keeps
 * `latest` naming a complete checkpoint through any crash) is declared in
 * ckpt_save.h, which this header includes: callers include checkpoint.h.
 *
 * Both safetensors files carry "__metadata__" {"format": "orch", "layout":
 * "orch-ARCH", "layout_version": "1"} (ckpt_files.h): orch's tensor names and
 * [out, in] linear layers, so no tool takes them for Hugging Face's. Loading
 * accepts that, or the "format": "pt" / no metadata of older checkpoints, and
 * refuses any other format or layout version by name; ckpt_load_weights also
 * refuses a layout whose ARCH is not the model.arch of the checkpoint's
 * state.json config
 * ("DIR/model.safetensors: layout 'orch-gpt2' is not model.arch 'llama' of
 * the checkpoint's config (the config does not match the weights)").
 *
 * Loading matches tensors BY NAME and shape (through the engine's
 * tensor_write), so a checkpoint written through one engine loads through
 * another. A missing tensor, an extra tensor, or a shape/dtype mismatch is an
 * error naming the tensor.
 *
 * Paths inside state.json's config (data.train, data.val) are used as they
 * were stored; `orch train` stores them absolute (config.h), so a checkpoint
 * works from any working directory.
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
#include "orchestrator/core/config.h"
#include "orchestrator/core/engine_loader.h"
#include "orchestrator/store/ckpt_save.h"

/* Resolve PATH to a checkpoint directory:
 *  - a checkpoint directory itself (holds state.json): verified, returned;
 *  - a run directory: the one `latest` names if it verifies; otherwise (latest
 *    missing, unreadable, naming a missing or corrupt dir) the newest ckpt-*
 *    dir that verifies, with a one-line explanation in warn (warn[0] is '\0'
 *    when there is nothing to warn about).
 * Errors: no checkpoint at all, or none that verifies. */
int ckpt_find_latest(const char *path, char *out_dir, size_t out_cap, char *warn,
                     size_t warn_cap, char *err, size_t err_cap);

/* Check a checkpoint directory: checksums.sha256 present and well formed,
 * every file it lists present with the recorded SHA-256, model.safetensors and
 * state.json listed. */
int ckpt_verify(const char *ckpt_dir, char *err, size_t err_cap);

/* The state.json text of a checkpoint (malloc'd, NUL-terminated). */
int ckpt_read_state(const char *ckpt_dir, char **state_json, char *err, size_t err_cap);

/* The merged run config in a checkpoint's state.json (its "config" object;
 * *out: config_free) and, when tokenizer is not NULL, the tokenizer the run
 * used (state.json's "tokenizer", else the config's data.tokenizer).
 * Errors name the file and the problem: "DIR/state.json: no such file or
 * directory", "DIR/state.json: not a regular file", "DIR/state.json: not
 * valid JSON (unexpected text at line 3, column 7)" (also for trailing text
 * after the object, an empty file or a NUL byte), "DIR/state.json: not a
 * JSON object (it holds an array)", "DIR/state.json: no \"config\" object",
 * "DIR/state.json: config: model.width: missing required key". On failure
 * *out is untouched. The config's engine.name is not checked here (see
 * engine_check_config_name). */
int ckpt_read_config(const char *ckpt_dir, orch_config **out, char *tokenizer,
                     size_t tokenizer_cap, char *err, size_t err_cap);

/* A checkpoint opened for reading its weights outside an engine (the
 * exporters: gguf_export.c, hf_export.c). */
struct safetensors_file;
typedef struct ckpt_model {
    char dir[4096];              /* the checkpoint directory ckpt_find_latest chose */
    char warn[1024];             /* its warning, or "" */
    char tokenizer[32];          /* the run's tokenizer ("gpt2", "byte") */
    char st_path[4200];          /* DIR/model.safetensors */
    orch_config *cfg;            /* the run config (owned) */
    struct safetensors_file *st; /* model.safetensors, layout checked (owned) */
} ckpt_model;

/* ckpt_find_latest(path), ckpt_read_config and model.safetensors opened with
 * its layout checked (ckpt_check_layout). On failure (err set) everything is
 * released and *m is zeroed; on success release with ckpt_model_close. */
int ckpt_model_open(const char *path, ckpt_model *m, char *err, size_t err_cap);
/* Release what ckpt_model_open holds; a zeroed *m is a no-op. */
void ckpt_model_close(ckpt_model *m);

/* Step recorded in the checkpoint's meta.json (falls back to the ckpt-STEP
 * directory name when there is no meta.json or it has no "step"). Errors: a
 * meta.json that is not a JSON object or whose step is not an integer in
 * [0, 2^53] ("DIR/meta.json: step: 1e+300 is out of range
 * (0..9007199254740992)"), or no step recorded anywhere. */
int ckpt_read_step(const char *ckpt_dir, uint64_t *step, char *err, size_t err_cap);

/* 1 if the checkpoint holds optimizer.safetensors, else 0. */
int ckpt_has_optimizer(const char *ckpt_dir);

/* Load model.safetensors into the PARAM table by name and, if with_optimizer,
 * optimizer.safetensors into ADAM_M/ADAM_V (an error when the checkpoint has
 * none). F16/BF16 files are converted to the engine's f32. Does not verify
 * checksums (ckpt_find_latest does). */
int ckpt_load_weights(const char *ckpt_dir, const engine_handle *h, orch_engine_ctx *ctx,
                      int with_optimizer, char *err, size_t err_cap);

#endif
