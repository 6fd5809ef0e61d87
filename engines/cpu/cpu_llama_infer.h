/*
 * cpu_llama_infer.h - paged-KV inference of ORCH_ARCH_LLAMA on the CPU
 * engine (the model and weight layout of cpu_llama.h).
 *
 * KV pool layout: block b holds, for every layer l, K then V of block_size
 * positions, each position KVD = kv_heads * head_size floats (K after RoPE):
 *   kv[(((b * L + l) * 2 + kv) * block_size + slot) * KVD + channel]
 * so kv_copy_blocks and kv_block_bytes of cpu_engine.c serve both
 * architectures through ctx->KVD (= C for gpt2).
 *
 * Threads, memory, errors: as cpu_infer.c (scratch in ctx->llama, packed
 * weights in ctx->packed, both owned by the context).
 */
#ifndef ORCH_CPU_LLAMA_INFER_H
#define ORCH_CPU_LLAMA_INFER_H

#include "engines/cpu/cpu_internal.h"

/* The contract of cpu_infer_forward (validation included), for llama. */
int32_t cpu_llama_infer_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                float *logits, uint64_t logits_cap);

#endif
