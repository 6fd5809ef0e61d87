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

#endif
