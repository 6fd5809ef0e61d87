/*
 * cpu_coserve.h - coserve_forward of the CPU engine (ABI 1.4,
 * ORCH_CAP_COSERVE): one inference batch and fine-tuning micro-batches
 * through one pass over the base weights.
 *
 * How: the inference forward (cpu_infer.c / cpu_llama_infer.c, unchanged)
 * runs on a helper thread, the fine-tuning forward/backward (cpu_train.c /
 * cpu_llama.c under the micro-batch's adapter) on the caller's thread, and
 * the two hand a baton back and forth so that exactly one of them runs at
 * any time (the context's pool is driven by one thread at a time). Each
 * base product of the inference pass is handed over at its
 * cpu_linear_forward and waits; when the fine-tuning forward reaches the
 * product of the same weight, both run as ONE product over W
 * (cpu_linear_forward_pair: each block of W is read from memory once for
 * the inference rows and the fine-tuning rows), then the inference pass
 * continues to its next product. Products the other pass lacks (weights=
 * int8 decoding kernels, the loss chunks after the first) run alone. The
 * inference batch rides on the first micro-batch's forward (the two passes
 * have the same order of products); further micro-batches each make their
 * own pass.
 *
 * Results: the inference logits are those of infer_forward and each
 * micro-batch adds the gradients of adapter_forward_backward, up to float
 * rounding (a paired product runs on sgemm in column blocks where the lone
 * one may take the packed decode kernel).
 * Errors: everything is validated before anything runs (an unknown adapter,
 * a bad micro-batch or inference batch changes nothing); an out-of-memory
 * failure inside a pass may leave part of the gradients added.
 */
#ifndef ORCH_CPU_COSERVE_H
#define ORCH_CPU_COSERVE_H

#include <stdint.h>

#include "engines/cpu/cpu_internal.h"

/* The ABI call (ctx non-NULL). */
int32_t cpu_coserve_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                            float *logits, uint64_t logits_cap,
                            const orch_finetune_batch *ft, uint32_t n_finetune,
                            uint32_t ft_stride, float *out_losses);

/* The pass over the base weights with a caller-given fine-tuning side
 * (coserve_forward's micro-batches, coserve_step's stream rows): runs the
 * validated inference batch on a helper thread (the rider) while
 * driver(ctx, arg) runs on the caller's thread; each base product of the
 * driver's cpu_linear_forward that meets the rider's product of the same
 * weight runs as one paired product. Adds the number of paired products to
 * ctx->coserve_paired. Returns the driver's status, else the inference's. */
typedef int32_t (*cpu_coserve_driver_fn)(orch_engine_ctx *ctx, void *arg);
int32_t cpu_coserve_run(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                        float *logits, uint64_t logits_cap, cpu_coserve_driver_fn driver,
                        void *arg);

/* coserve_forward's checks of one micro-batch f (named fn in the messages):
 * struct_size, reserved0, engine_check_train_call, the adapter (into
 * *out_lo). ORCH_ERR_INVALID_ARGUMENT / ORCH_ERR_CAPACITY with a message. */
struct cpu_lora;
int32_t cpu_coserve_check_ft(orch_engine_ctx *ctx, const char *fn,
                             const orch_finetune_batch *f, struct cpu_lora **out_lo);

/* coserve_forward's checks of the inference batch (NULL or 0 sequences: none;
 * *out_infer says whether there is one). */
int32_t cpu_coserve_check_infer(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                float *logits, uint64_t logits_cap, int *out_infer);

#endif
