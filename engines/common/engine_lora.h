/*
 * engine_lora.h - the parts of LoRA adapters (ABI 1.4) that every numeric
 * engine (cpu, cuda) lays out the same way: the checks of an orch_lora_desc
 * with their messages, the list of adapted matrices for a target set in
 * table order (per layer: qkv, attention out, MLP up, MLP down; LLaMA's q, k,
 * v and gate, up apart, with where each sits in the fused product), and the
 * adapter's tensor entries "<W minus .weight>.lora_A.weight" [rank, in] and
 * ".lora_B.weight" [out, rank]; and the argument checks of co-serving
 * (coserve_forward, ft_stream_open) and the coserve_step progress report.
 *
 * Error rule: as engine_checks.h (the caller's err buffer, filled only on
 * failure). Memory: nothing here allocates. Threads: pure functions.
 * Includable from C11 and C++ (nvcc); never included by the orchestrator.
 */
#ifndef ORCH_ENGINE_LORA_H
#define ORCH_ENGINE_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "engine_api/orch_engine.h"
#include "engines/common/engine_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which weight of a layer an adapted matrix is (the engine maps it to its
 * tensor index). */
typedef enum engine_lora_role {
    ENGINE_LORA_GPT2_QKV = 0, /* h.i.attn.c_attn */
    ENGINE_LORA_GPT2_PROJ,    /* h.i.attn.c_proj */
    ENGINE_LORA_GPT2_FC,      /* h.i.mlp.c_fc */
    ENGINE_LORA_GPT2_FCPROJ,  /* h.i.mlp.c_proj */
    ENGINE_LORA_LLAMA_Q,
    ENGINE_LORA_LLAMA_K,
    ENGINE_LORA_LLAMA_V,
    ENGINE_LORA_LLAMA_O,
    ENGINE_LORA_LLAMA_GATE,
    ENGINE_LORA_LLAMA_UP,
    ENGINE_LORA_LLAMA_DOWN,
    ENGINE_LORA_ROLE_COUNT
} engine_lora_role;

/* One adapted matrix W [out, in]. */
typedef struct engine_lora_mod {
    uint32_t layer;
    uint32_t target;   /* one ORCH_LORA_TARGET_* bit */
    uint32_t role;     /* engine_lora_role */
    uint32_t in, out;  /* W's shape [out, in] */
    uint32_t col0;     /* first column of W's output inside the product's output */
    uint32_t base_idx; /* index of W in the engine's base tensor table (engine's) */
    uint64_t a_off;    /* A [rank, in] in the adapter's flat buffers */
    uint64_t b_off;    /* B [out, rank] */
} engine_lora_mod;

/* adapter_create's desc checks (desc and out_id non-NULL, struct_size up to
 * seed, reserved zero, targets a non-empty subset of ORCH_LORA_TARGET_ALL,
 * alpha finite > 0, rank >= 1); *out receives the desc widened to this
 * header's size. The rank against the matrices is the caller's check (it
 * names the tensor). */
int32_t engine_check_lora_desc(const orch_lora_desc *desc, const uint32_t *out_id,
                               orch_lora_desc *out, char *err, size_t cap);

/* The adapted matrices of a model (arch ORCH_ARCH_*, layers, width C, MLP
 * width M, KV width kvd = kv_heads * head_dim) for `targets`, in table order,
 * into mods (NULL: count only; base_idx, a_off, b_off left 0); returns how
 * many. */
uint32_t engine_lora_mods(uint32_t arch, uint32_t layers, uint32_t C, uint32_t M,
                          uint32_t kvd, uint32_t targets, engine_lora_mod *mods);

/* One adapter tensor entry: name "<base minus .weight>.<which>.weight",
 * 2-D [rows, cols], f32, no flags, at flat offset `offset`. */
void engine_lora_tensor(engine_tensor *t, const char *base, const char *which,
                        uint64_t rows, uint64_t cols, uint64_t offset);

/* ---- co-serving (ABI 1.4) and fine-tuning streams (ABI 1.5) ---- */

struct engine_batch_limits;

/* One orch_finetune_batch of coserve_forward or ft_stream_open, fn naming it
 * in the message ("coserve_forward: ft[2]", "ft_stream_open"): struct_size
 * up to grad_scale, reserved0 zero when the struct has it, then
 * engine_check_train_call's checks of its tokens, targets, shape and
 * grad_scale against lim. *out_counted (may be NULL) receives the number of
 * targets that are not -1. Whether the adapter exists is the engine's
 * check (it owns the adapters). */
int32_t engine_check_ft_batch(const char *fn, const orch_finetune_batch *f,
                              const struct engine_batch_limits *lim,
                              uint64_t *out_counted, char *err, size_t cap);

/* coserve_forward's arguments when n_finetune > 0: ft and out_losses
 * non-NULL, ft_stride a multiple of the struct's alignment and at least the
 * bytes up to grad_scale. */
int32_t engine_check_coserve_args(const orch_finetune_batch *ft, uint32_t n_finetune,
                                  uint32_t ft_stride, const float *out_losses, char *err,
                                  size_t cap);

/* coserve_step's report: *p (may be NULL) zeroed but for its struct_size,
 * then, when `known` (the stream exists), its state after the step. */
void engine_ft_progress_fill(orch_ft_progress *p, int known, int finished,
                             uint64_t rows_total, uint64_t forward_rows,
                             uint64_t backward_rows, uint64_t rows_this_step, float loss);

#ifdef __cplusplus
}
#endif
#endif /* ORCH_ENGINE_LORA_H */
