/*
 * peft_adapter.h - LoRA adapters in the Hugging Face PEFT layout: a
 * directory holding adapter_model.safetensors and adapter_config.json, so
 * Python's PEFT (PeftModel.from_pretrained) reads what orch writes and orch
 * reads PEFT's LoRA adapters of the architectures it runs.
 *
 * Tensor names: "base_model.model." + (gpt2: "transformer.") + the engine's
 * adapter tensor name (engine_api/orch_engine.h, "LoRA adapters"), e.g.
 *   base_model.model.transformer.h.0.attn.c_attn.lora_A.weight   [r, C]
 *   base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight [H*D, r]
 * lora_A [r, in], lora_B [out, r] (PEFT's shapes, also for GPT-2's Conv1D
 * layers, whose config says fan_in_fan_out true). Written as F32; read as
 * F32, F16 or BF16.
 *
 * target_modules (HF module names) <-> ORCH_LORA_TARGET_* bits:
 *   gpt2:  c_attn = ATTN_QKV, c_fc = MLP_UP, c_proj = ATTN_OUT and MLP_DOWN
 *          together: PEFT matches a module name against every module of
 *          that name, and attn.c_proj and mlp.c_proj share "c_proj", so an
 *          adapter on exactly one of them cannot be written as a list and is
 *          refused (peft_targets_check);
 *   llama: q_proj, k_proj, v_proj = ATTN_QKV (all three or none), o_proj =
 *          ATTN_OUT, gate_proj, up_proj = MLP_UP (both or none), down_proj =
 *          MLP_DOWN.
 *
 * adapter_config.json written: peft_type "LORA", task_type "CAUSAL_LM", r,
 * lora_alpha, lora_dropout 0, target_modules (sorted list), fan_in_fan_out
 * (true for gpt2), bias "none", base_model_name_or_path, inference_mode
 * true, init_lora_weights true, use_rslora false, use_dora false,
 * modules_to_save / layers_to_transform / layers_pattern null,
 * rank_pattern / alpha_pattern {}.
 * The safetensors "__metadata__": "format": "pt", "orch_arch": "gpt2" |
 * "llama", "orch_base_fingerprint": "sha256:<64 hex>" (peft_base_fingerprint
 * of the base the adapter was trained on: orch refuses the adapter on a
 * base whose fingerprint differs; PEFT ignores metadata).
 *
 * Reading validates: peft_type LORA; task_type CAUSAL_LM (or absent/null);
 * r an integer >= 1 and <= min(in, out) of every target matrix; lora_alpha a
 * number > 0; target_modules a list of known module names (a regular
 * expression string, unknown names and partial groups are refused);
 * fan_in_fan_out false for llama; bias "none"; use_rslora, use_dora false;
 * rank_pattern, alpha_pattern, modules_to_save, layers_to_transform,
 * layers_pattern, exclude_modules, layer_replication and the other options
 * orch does not apply empty or null; any other key with a value that is not
 * null/false/empty is refused naming it (orch cannot tell what it changes);
 * then the tensors: exactly the expected names (a missing or extra tensor
 * is named), 2-D shapes [r, in] / [out, r] of the model, dtype F32/F16/BF16.
 *
 * Saving is atomic per file (fsio: temp file, fsync, rename): the config
 * first (it is the same for every save of a run), then the tensors; a
 * failure (e.g. a full disk) leaves the previous files of DIR intact.
 *
 * Memory: a peft_adapter owns its tensors' data (peft_adapter_free).
 * Threads: reentrant; one thread per engine context (the ABI rule).
 * Errors: 0 / -1 with one line naming the file (and key or tensor) in err;
 * nothing is printed.
 */
#ifndef ORCH_PEFT_ADAPTER_H
#define ORCH_PEFT_ADAPTER_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "orchestrator/core/engine_loader.h"

#define PEFT_CONFIG_FILE  "adapter_config.json"
#define PEFT_WEIGHTS_FILE "adapter_model.safetensors"
#define PEFT_FP_MAX       72 /* "sha256:" + 64 hex + NUL */

typedef struct peft_adapter_tensor {
    char name[ORCH_TENSOR_NAME_MAX]; /* the engine's name (no PEFT prefix) */
    uint64_t shape[2];               /* [rank, in] (A) or [out, rank] (B) */
    uint64_t numel;
    float *data; /* numel floats (owned; NULL in an expected table) */
} peft_adapter_tensor;

typedef struct peft_adapter {
    uint32_t arch; /* orch_arch */
    uint32_t rank;
    float alpha;
    uint32_t targets;              /* ORCH_LORA_TARGET_* */
    char base_model[4096];         /* base_model_name_or_path */
    char fingerprint[PEFT_FP_MAX]; /* "" when the file has none */
    size_t n;
    peft_adapter_tensor *t; /* in the engine's table order */
} peft_adapter;

/* 0 when targets (non-empty, within ORCH_LORA_TARGET_ALL) can be written as
 * PEFT target_modules for arch; else -1 with the reason (gpt2: attn_out
 * without mlp_down or the reverse). */
int peft_targets_check(uint32_t arch, uint32_t targets, char *err, size_t err_cap);

/* Parse a comma-separated target list: orch's words qkv, attn_out, mlp_up,
 * mlp_down, all, or the arch's HF module names (c_attn, c_proj, c_fc /
 * q_proj, ..., down_proj; a group given in part is refused) into *out, then
 * peft_targets_check. */
int peft_targets_parse(uint32_t arch, const char *list, uint32_t *out, char *err,
                       size_t err_cap);

/* The HF module names of targets, comma-separated ("c_attn,c_proj"). */
void peft_targets_modules(uint32_t arch, uint32_t targets, char *buf, size_t cap);

/* The adapter table the header prescribes for model m (names, shapes, data
 * NULL; *out malloc'd, free with free()). Errors: rank 0 or above min(in,
 * out) of a target matrix (naming it), an empty or unknown target set. */
int peft_expected_table(const orch_model_desc *m, uint32_t rank, uint32_t targets,
                        peft_adapter_tensor **out, size_t *n, char *err, size_t err_cap);

/* "sha256:<hex>" of the base model in ctx: over every PARAM tensor in table
 * order, its name and NUL, dtype, ndim (u32 LE), shape (u64 LE each) and
 * data. Reads every base tensor once. */
int peft_base_fingerprint(const engine_handle *h, orch_engine_ctx *ctx,
                          char out[PEFT_FP_MAX], char *err, size_t err_cap);

/* Copy adapter `id` of ctx (its PARAM table) into *out with the given
 * description; m is the model (for the table check). */
int peft_adapter_from_engine(const engine_handle *h, orch_engine_ctx *ctx, uint32_t id,
                             const orch_model_desc *m, const orch_lora_desc *d,
                             const char *base_model, const char *fingerprint,
                             peft_adapter *out, char *err, size_t err_cap);

/* Create an adapter in ctx from a (seed 0; its table must be the one a
 * describes, tensor by tensor) and write its parameters; *out_id receives
 * the id. Nothing is left behind on failure. */
int peft_adapter_to_engine(const peft_adapter *a, const engine_handle *h,
                           orch_engine_ctx *ctx, uint32_t *out_id, char *err,
                           size_t err_cap);

/* Write DIR/adapter_config.json and DIR/adapter_model.safetensors (DIR is
 * created if missing). */
int peft_adapter_save(const char *dir, const peft_adapter *a, char *err, size_t err_cap);

/* Read and validate an adapter directory for model m into *out (free with
 * peft_adapter_free). */
int peft_adapter_load(const char *dir, const orch_model_desc *m, peft_adapter *out,
                      char *err, size_t err_cap);

/* 0 when a may be used on the base with fingerprint fp: a carries the same
 * fingerprint, or none (an adapter made outside orch). Else -1 with "DIR:
 * adapter was trained on another base model (fingerprint X, this base Y)". */
int peft_adapter_check_base(const peft_adapter *a, const char *dir, const char *fp,
                            char *err, size_t err_cap);

void peft_adapter_free(peft_adapter *a); /* safe on a zeroed struct */

#endif
