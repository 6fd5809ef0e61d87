/*
 * model_source.h - what `orch serve MODEL` was given, made into an orch
 * checkpoint it can open: an orch run or checkpoint directory (used as it
 * is), a Hugging Face model directory (config.json with model.safetensors
 * or model.safetensors.index.json; also one .safetensors file) imported with
 * gpt2_import (store/gpt2_import.h, the library of `orch import hf`), or a
 * GGUF file (its "GGUF" magic) imported with gguf_import (the library of
 * `orch import gguf`). An import goes into a new private temporary directory
 * ($TMPDIR, else /tmp: orch-model-XXXXXX/model) that model_source_close
 * removes.
 *
 * Detection, in order: a directory with state.json or latest is an orch
 * checkpoint; a directory with config.json and the weights above is a
 * Hugging Face model; a regular file starting with "GGUF" is a GGUF file; a
 * file ending in .safetensors is Hugging Face weights. Anything else is
 * refused with one line naming MODEL and what was looked for.
 *
 * Memory: *src holds paths only; model_source_close removes the temporary
 * import (safe on a zeroed or already closed source). A process killed
 * before it closes the source leaves the directory behind.
 * Threads: one call at a time per source; no shared state.
 * Errors: -1 with one line in err ("MODEL 'PATH': ...", or the importer's
 * message after "importing the Hugging Face model 'PATH': " / "importing the
 * GGUF file 'PATH': ") and *err_kind GPT2_IMPORT_ERR_INPUT (the input is at
 * fault) or GPT2_IMPORT_ERR_RUNTIME (memory, the temporary directory); no
 * temporary directory is left behind.
 */
#ifndef ORCH_MODEL_SOURCE_H
#define ORCH_MODEL_SOURCE_H

#include <stddef.h>

typedef enum model_source_kind {
    MODEL_SOURCE_ORCH = 1, /* an orch run or checkpoint directory */
    MODEL_SOURCE_HF = 2,   /* a Hugging Face model, imported */
    MODEL_SOURCE_GGUF = 3  /* a GGUF file, imported */
} model_source_kind;

typedef struct model_source {
    int kind;              /* model_source_kind */
    char ckpt[4200];       /* the orch checkpoint to open */
    char tmp_dir[4200];    /* the temporary import directory, or "" */
    const char *kind_name; /* "orch checkpoint", "Hugging Face model", "GGUF file" */
} model_source;

/* Resolve model into *src (zeroed first). base_config (may be NULL) is
 * passed to the importers (train/data/engine sections of the imported
 * config); tokenizer (NULL: the importer's choice, e.g. the directory's
 * tokenizer.json) is gpt2_import's tokenizer option and applies to a Hugging
 * Face model only: given with another kind of MODEL it is an error naming
 * both (never ignored). */
int model_source_open(const char *model, const char *base_config, const char *tokenizer,
                      model_source *src, int *err_kind, char *err, size_t err_cap);

/* Remove the temporary import, if any: 0, or -1 with one line in err when
 * something could not be removed (the source is closed either way). */
int model_source_close(model_source *src, char *err, size_t err_cap);

#endif
