/*
 * cpu_ft_stream.h - token-level fine-tuning streams of the CPU engine (ABI
 * 1.5, ORCH_CAP_FT_STREAM; FlexLLM's token-level fine-tuning): a LoRA
 * micro-batch run a few rows at a time across coserve_step calls, so a
 * co-serving scheduler can give it exactly the tokens an iteration has left.
 *
 * Rows are r = b * seq_len + t. A forward chunk of rows [r0, r1) runs every
 * layer for those rows (their queries attend to the keys and values of
 * their own b at positions <= t, those of earlier chunks taken from the
 * stream's saved activations, as a chunked prefill does) and then the head
 * and the cross-entropy of its rows, keeping the row losses and the
 * gradient w.r.t. the final-norm output (never B x T x V logits). Once every
 * forward row is done, backward chunks run in decreasing r, layers top
 * down. Causal attention makes this exact: dK/dV of row r only receive
 * contributions from query rows >= r of the same b, all processed already
 * or in this chunk; per-layer dK|dV accumulators over the whole sequence
 * take them, and once the chunk's queries are done its own dK/dV rows are
 * complete, so the q|k|v product's backward (dX, LoRA dA/dB) runs for the
 * chunk's rows. Everything else (MLP, projections, norms, residual) is row
 * local. GPT-2 (LayerNorm, GELU, MHA) and LLaMA (RMSNorm, RoPE, SwiGLU, GQA)
 * use the training kernels of cpu_train.c / cpu_llama.c and the products of
 * cpu_linear.c (fp32, or bf16 under precision=bf16, as the adapter path).
 *
 * The LoRA gradients go to the stream's own buffer and are ADDED to the
 * adapter's gradients when the last backward row is done (a stream closed
 * earlier leaves them untouched). The base is frozen (no base gradients).
 * coserve_step runs the inference batch on cpu_coserve_run's rider, so each
 * base product of the step's first forward chunk is paired with the
 * inference pass's product of the same weight (one read of W).
 *
 * Memory: a stream owns one allocation (saved activations of every layer
 * for all B*T rows, the dK|dV accumulators L x B*T x 2*KVD, the scratch of
 * one chunk of up to FT_CHUNK_ROWS rows, its gradient buffer), released when
 * the stream finishes or closes. ft_stream_open refuses with
 * ORCH_ERR_CAPACITY when the open streams of the context would exceed half
 * of the machine's physical memory (8 GiB where it cannot be read).
 * Threads: as the engine (one caller thread per context; the work runs on
 * the context's pool). Errors: status + message in ctx->last_error; every
 * argument is checked before anything runs.
 */
#ifndef ORCH_CPU_FT_STREAM_H
#define ORCH_CPU_FT_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "engines/cpu/cpu_internal.h"

/* The ABI calls (ctx non-NULL). */
int32_t cpu_ft_stream_open(orch_engine_ctx *ctx, const orch_finetune_batch *ft,
                           uint32_t *out_stream);
int32_t cpu_ft_stream_close(orch_engine_ctx *ctx, uint32_t stream);
int32_t cpu_ft_coserve_step(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                            float *logits, uint64_t logits_cap, uint32_t stream,
                            uint32_t ft_rows, orch_ft_progress *progress);

/* The id of an open stream on adapter adapter_id (the lowest), 0 when none:
 * adapter_destroy, adapter_optimizer_step and adapter_tensor_write of PARAM
 * refuse with ORCH_ERR_STATE while it is not 0. */
uint32_t cpu_ft_adapter_stream(const orch_engine_ctx *ctx, uint32_t adapter_id);

/* Bytes one stream of B x T rows under an adapter of n_params parameters
 * holds (pure). */
size_t cpu_ft_stream_bytes(const orch_engine_ctx *ctx, uint32_t B, uint32_t T,
                           uint64_t n_params);

/* Release every stream (context_destroy). */
void cpu_ft_free_all(orch_engine_ctx *ctx);

#endif
