/*
 * cuda_coserve.cu - coserve_forward of the CUDA engine (ABI 1.4,
 * ORCH_CAP_COSERVE): one inference batch and n_finetune LoRA micro-batches
 * (each on its own adapter, the base frozen) in ONE pass over the base
 * weights - FlexLLM's token-level co-batching on a GPU.
 *
 * The pass: the rows of the inference tokens (first) and of every
 * micro-batch are stacked into one activation matrix per layer (the
 * training activations, ctx->acts, sized for all rows), and the shared
 * forward of cuda_model.cu / cuda_llama.cu (cu_gpt2_forward /
 * cu_llama_forward, the same code infer_forward and adapter_forward_backward
 * run) does each base product - GPT-2 c_attn, attn.c_proj, mlp.c_fc,
 * mlp.c_proj; LLaMA q|k|v, o_proj, gate|up, down_proj - and the LM head as
 * ONE GEMM over all rows, so the fine-tuning rows ride on the weight read of
 * the inference rows. Attention runs per part (paged, writing the KV pool,
 * for the inference rows; causal within each sequence for a micro-batch),
 * as do the LoRA terms (each inference sequence's adapter, the
 * micro-batch's adapter). The LM head gathers the inference rows that give
 * logits and every fine-tuning row. Then each micro-batch's loss and
 * backward (d(x) through the frozen base, the adapter's dA/dB) run one after
 * the other as adapter_forward_backward runs them (cu_*_part_loss), so two
 * micro-batches on one adapter add their gradients in call order.
 *
 * Results equal infer_forward followed by adapter_forward_backward on each
 * ft[i]: every row's products are the same per-element sums whatever the
 * other rows of the GEMM (on the CPU emulator of tests/cuda_emu the same
 * bits; cuBLAS on a device may pick another kernel for another row count,
 * so there within float rounding).
 *
 * Validation is the CPU engine's (engines/cpu/cpu_coserve.c), with its
 * statuses and messages, all of it before any device work: ft NULL,
 * out_losses NULL, ft_stride, then each ft[i] (struct_size, reserved0, the
 * train-call checks, the adapter), then the inference batch as
 * infer_forward checks it. A failed check changes nothing (no KV written,
 * no gradient added, out_losses untouched). A micro-batch whose targets are
 * all -1 has loss 0 and adds nothing (as adapter_forward_backward); it
 * takes no rows. A stack beyond the engine's per-call row maximum runs the
 * parts one after the other instead (the same results).
 *
 * Memory: the stack lives in ctx->acts (grown on demand, kept); the
 * inference part's index arrays in ctx->inf (cu_infer_upload_plan); host
 * arrays of the call are malloc'd and freed here. Threads: the context's.
 */
#include "engines/cuda/cuda_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KCHECK(ctx, call)                                                  \
    do {                                                                   \
        cudaError_t k_e_ = (call);                                         \
        if (k_e_ != cudaSuccess) return cu_cuda_error((ctx), k_e_, #call); \
    } while (0)

/* Micro-batch i of the caller's array (ft_stride bytes apart). */
static const orch_finetune_batch *ft_at(const orch_finetune_batch *ft, uint32_t stride,
                                        uint32_t i) {
    return (const orch_finetune_batch *)(const void *)((const char *)ft +
                                                       (size_t)stride * i);
}

/* One checked micro-batch. */
typedef struct ft_item {
    const orch_finetune_batch *f;
    cu_lora *lo;
    uint64_t n_valid;
} ft_item;

/* ft[i]'s checks, in the CPU engine's order and words. */
static int32_t check_ft(orch_engine_ctx *ctx, uint32_t i, const orch_finetune_batch *f,
                        ft_item *it) {
    char fn[64];
    snprintf(fn, sizeof fn, "coserve_forward: ft[%u]", i);
    CU_TRY(
        engine_check_ft_batch(fn, f, &ctx->train_lim, &it->n_valid, ENGINE_ERRBUF(ctx)));
    it->f = f;
    it->lo = cu_lora_find(ctx, fn, f->adapter_id);
    return it->lo ? ORCH_OK : ORCH_ERR_INVALID_ARGUMENT;
}

/* A micro-batch alone, as adapter_forward_backward runs it. */
static int32_t ft_alone(orch_engine_ctx *ctx, const ft_item *it, float *loss) {
    const orch_finetune_batch *f = it->f;
    ctx->lora_cur = it->lo;
    const int32_t st =
        cu_model_train_step(ctx, f->tokens, f->targets, f->batch, f->seq_len, it->n_valid,
                            f->grad_scale, 1, loss, NULL);
    ctx->lora_cur = NULL;
    return st;
}

/* The stacked pass over validated inputs: plan (NULL: no inference part)
 * and the items with targets (n_items >= 1). losses[k] per item. */
static int32_t stacked(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                       const cu_infer_plan *plan, float *logits, const ft_item *items,
                       uint32_t n_items, float *losses) {
    cudaStream_t s = ctx->stream;
    const uint32_t n_inf = plan ? plan->n_tokens : 0, R = plan ? plan->n_rows : 0;
    uint64_t n = n_inf, att = 0, most = 0;
    uint32_t rank = 0;
    for (uint32_t k = 0; k < n_items; k++) {
        const uint64_t Nk = (uint64_t)items[k].f->batch * items[k].f->seq_len;
        n += Nk;
        att += Nk * ctx->H * items[k].f->seq_len;
        most = Nk > most ? Nk : most;
        rank = items[k].lo->rank > rank ? items[k].lo->rank : rank;
    }
    if (n > CU_MAX_TOKENS) { /* too many rows for one stack: part by part */
        if (plan) CU_TRY(cu_infer_planned(ctx, batch, plan, logits));
        for (uint32_t k = 0; k < n_items; k++)
            CU_TRY(ft_alone(ctx, &items[k], &losses[k]));
        return ORCH_OK;
    }
    cu_fwd_part *parts = (cu_fwd_part *)calloc(n_items, sizeof *parts);
    if (!parts)
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "coserve_forward: out of host memory");
    uint32_t r0 = n_inf;
    uint64_t a0 = 0;
    for (uint32_t k = 0; k < n_items; k++) {
        const orch_finetune_batch *f = items[k].f;
        parts[k].B = f->batch;
        parts[k].T = f->seq_len;
        parts[k].r0 = r0;
        parts[k].att0 = a0;
        parts[k].lo = items[k].lo;
        parts[k].lrow0 = R + (r0 - n_inf); /* after the inference logits rows */
        r0 += f->batch * f->seq_len;
        a0 += (uint64_t)f->batch * ctx->H * f->seq_len * f->seq_len;
    }
    cu_plan_dev dp;
    int32_t st = ORCH_OK;
    if (plan) {
        /* the adapters of the inference rows, and the plan's arrays on the
         * device (through the staging buffer: wait before reusing it) */
        st = cu_lora_infer_begin(ctx, batch);
        if (st == ORCH_OK) st = cu_infer_upload_plan(ctx, plan, &dp);
        if (st == ORCH_OK) {
            cudaError_t e = cudaStreamSynchronize(s);
            if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "cudaStreamSynchronize");
        }
    }
    if (st == ORCH_OK) st = cu_lora_prepare(ctx, rank, most);
    if (st == ORCH_OK) st = cu_acts_reserve(ctx, n, att);
    /* the stack's integer arrays: tokens [n] | positions [n] | the parts'
     * targets [n - n_inf] | the LM head's rows [R + n - n_inf] */
    const uint64_t n_ft = n - n_inf, n_head = R + n_ft;
    const size_t n_ints = 2 * (size_t)n + (size_t)n_ft + (size_t)n_head;
    if (st == ORCH_OK) st = cu_stage_reserve(ctx, n_ints * sizeof(int32_t));
    if (st == ORCH_OK) {
        int32_t *h = (int32_t *)ctx->h_stage;
        int32_t *tok = h, *pos = h + n, *tgt = pos + n, *hr = tgt + n_ft;
        if (plan) {
            memcpy(tok, plan->tokens, (size_t)n_inf * sizeof(int32_t));
            memcpy(pos, plan->pos, (size_t)n_inf * sizeof(int32_t));
            memcpy(hr, plan->rows, (size_t)R * sizeof(int32_t));
        }
        for (uint32_t k = 0; k < n_items; k++) {
            const orch_finetune_batch *f = items[k].f;
            const uint32_t Nk = f->batch * f->seq_len, p0 = parts[k].r0;
            memcpy(tok + p0, f->tokens, (size_t)Nk * sizeof(int32_t));
            memcpy(tgt + (p0 - n_inf), f->targets, (size_t)Nk * sizeof(int32_t));
            for (uint32_t r = 0; r < Nk; r++) {
                pos[p0 + r] = (int32_t)(r % f->seq_len);
                hr[R + (p0 - n_inf) + r] = (int32_t)(p0 + r);
            }
        }
        cudaError_t e = cudaMemcpyAsync(ctx->acts.i_base, h, n_ints * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "cudaMemcpyAsync(coserve rows)");
    }
    if (st == ORCH_OK) {
        const int32_t *d = ctx->acts.i_base;
        cu_fwd f;
        cu_fwd_on_acts(ctx, &f, (uint32_t)n, att);
        f.n_inf = n_inf;
        f.dp = plan ? &dp : NULL;
        f.parts = parts;
        f.n_parts = n_items;
        f.d_tok = d;
        f.d_pos = d + n;
        f.d_head_rows = d + 2 * n + n_ft;
        f.n_head = (uint32_t)n_head;
        const int llama = ctx->arch == ORCH_ARCH_LLAMA;
        st = llama ? cu_llama_forward(ctx, &f) : cu_gpt2_forward(ctx, &f);
        if (st == ORCH_OK && R) {
            cudaError_t e =
                cudaMemcpyAsync(logits, f.logits, (size_t)R * ctx->V * sizeof(float),
                                cudaMemcpyDeviceToHost, s);
            if (e != cudaSuccess) st = cu_cuda_error(ctx, e, "cudaMemcpyAsync(logits)");
        }
        const int32_t *d_tgt = d + 2 * n;
        for (uint32_t k = 0; st == ORCH_OK && k < n_items; k++) {
            const orch_finetune_batch *fb = items[k].f;
            const int32_t *tk = d_tgt + (parts[k].r0 - n_inf);
            st = llama ? cu_llama_part_loss(ctx, &f, k, tk, items[k].n_valid,
                                            fb->grad_scale, 1, NULL, NULL, &losses[k])
                       : cu_gpt2_part_loss(ctx, &f, k, tk, items[k].n_valid,
                                           fb->grad_scale, 1, NULL, NULL, &losses[k]);
        }
    }
    if (plan) cu_lora_infer_end(ctx);
    if (st == ORCH_OK && plan) {
        const engine_kv_view kv = cu_kv_view(ctx);
        engine_kv_mark_written(batch, &kv);
    }
    free(parts);
    return st;
}

int32_t cu_coserve_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                           float *logits, uint64_t logits_cap,
                           const orch_finetune_batch *ft, uint32_t n_finetune,
                           uint32_t ft_stride, float *out_losses) {
    /* ---- validation: nothing runs before all of it passes ---- */
    CU_TRY(engine_check_coserve_args(ft, n_finetune, ft_stride, out_losses,
                                     ENGINE_ERRBUF(ctx)));
    ft_item *items = NULL;
    if (n_finetune > 0 && !(items = (ft_item *)calloc(n_finetune, sizeof *items)))
        return cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "coserve_forward: out of memory");
    for (uint32_t i = 0; i < n_finetune; i++) {
        const int32_t st = check_ft(ctx, i, ft_at(ft, ft_stride, i), &items[i]);
        if (st != ORCH_OK) {
            free(items);
            return st;
        }
    }
    /* a batch with 0 sequences is no inference part (its logits unchecked) */
    const int infer = batch && (batch->struct_size < offsetof(orch_infer_batch, n_seqs) +
                                                         sizeof batch->n_seqs ||
                                batch->n_seqs > 0);
    cu_infer_plan plan;
    int32_t *mem = NULL;
    if (infer) {
        const int32_t st = cu_plan_batch(ctx, batch, logits, logits_cap, &plan, &mem);
        if (st != ORCH_OK) {
            free(items);
            return st;
        }
    }

    /* ---- the pass ---- */
    float *losses = n_finetune ? (float *)calloc(n_finetune, sizeof(float)) : NULL;
    ft_item *stack = n_finetune ? (ft_item *)calloc(n_finetune, sizeof *stack) : NULL;
    uint32_t *slot = n_finetune ? (uint32_t *)calloc(n_finetune, sizeof *slot) : NULL;
    int32_t st = ORCH_OK;
    if (n_finetune && (!losses || !stack || !slot))
        st = cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY, "coserve_forward: out of memory");
    /* micro-batches without a target take no rows: loss 0, no gradient */
    uint32_t n_stack = 0;
    for (uint32_t i = 0; st == ORCH_OK && i < n_finetune; i++)
        if (items[i].n_valid > 0) {
            slot[n_stack] = i;
            stack[n_stack++] = items[i];
        }
    float *tmp = NULL;
    if (st == ORCH_OK && n_stack > 0) {
        tmp = (float *)calloc(n_stack, sizeof(float));
        if (!tmp)
            st = cu_set_error(ctx, ORCH_ERR_OUT_OF_MEMORY,
                              "coserve_forward: out of memory");
    }
    if (st == ORCH_OK) {
        if (n_stack > 0)
            st = stacked(ctx, batch, infer ? &plan : NULL, logits, stack, n_stack, tmp);
        else if (infer)
            st = cu_infer_planned(ctx, batch, &plan, logits);
    }
    if (st == ORCH_OK) {
        for (uint32_t k = 0; k < n_stack; k++) losses[slot[k]] = tmp[k];
        if (n_finetune) memcpy(out_losses, losses, n_finetune * sizeof(float));
    }
    free(tmp);
    free(slot);
    free(stack);
    free(losses);
    free(mem);
    free(items);
    return st;
}
