/*
 * adapter_moments.h - a LoRA adapter's AdamW moments in a safetensors file
 * ("m.NAME" and "v.NAME" for every tensor NAME of the adapter's table, f32,
 * the adapter's shapes; metadata "format": "orch-finetune-optimizer"), the
 * optimizer half of a fine-tuning checkpoint (the parameters are the PEFT
 * files, peft_adapter.h).
 * Memory: nothing is kept. Threads: the engine context's rule (one thread).
 * Errors: 0 / -1 with one line naming the file (and tensor) in err.
 */
#ifndef ORCH_ADAPTER_MOMENTS_H
#define ORCH_ADAPTER_MOMENTS_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/engine_loader.h"
#include "orchestrator/store/peft_adapter.h"

/* Write adapter `id`'s ADAM_M and ADAM_V tables (names and shapes from a,
 * the adapter's table) to path atomically; *sha256_out (may be NULL)
 * receives the file's SHA-256. */
int adapter_moments_save(const char *path, const engine_handle *h, orch_engine_ctx *ctx,
                         uint32_t id, const peft_adapter *a, uint8_t sha256_out[32],
                         char *err, size_t err_cap);

/* Read path's moments into adapter `id` (every tensor must be there, f32,
 * the adapter's shape). */
int adapter_moments_load(const char *path, const engine_handle *h, orch_engine_ctx *ctx,
                         uint32_t id, const peft_adapter *a, char *err, size_t err_cap);

#endif
