/*
 * engine_lora.c - the LoRA layout and desc checks the cpu and cuda engines
 * share (see engine_lora.h).
 */
#include "engines/common/engine_lora.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engines/common/engine_checks.h"

int32_t engine_check_lora_desc(const orch_lora_desc *desc, const uint32_t *out_id,
                               orch_lora_desc *out, char *err, size_t cap) {
    if (!desc)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "adapter_create: desc is NULL");
    if (!out_id)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "adapter_create: out_id is NULL");
    const size_t need = offsetof(orch_lora_desc, seed) + sizeof desc->seed;
    if (desc->struct_size < need)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "adapter_create: desc->struct_size %u is smaller than the "
                               "%zu bytes up to seed",
                               desc->struct_size, need);
    orch_lora_desc d;
    memset(&d, 0, sizeof d);
    memcpy(&d, desc, desc->struct_size < sizeof d ? desc->struct_size : sizeof d);
    for (int i = 0; i < 4; i++)
        if (d.reserved[i] != 0)
            return engine_fail_buf(
                err, cap, ORCH_ERR_INVALID_ARGUMENT,
                "adapter_create: desc->reserved[%d] is %u; it must be 0", i,
                d.reserved[i]);
    if (d.targets == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "adapter_create: targets is 0; give at least one of "
                               "ORCH_LORA_TARGET_ATTN_QKV, ATTN_OUT, MLP_UP, MLP_DOWN");
    if (d.targets & ~ORCH_LORA_TARGET_ALL)
        return engine_fail_buf(
            err, cap, ORCH_ERR_INVALID_ARGUMENT,
            "adapter_create: targets 0x%x has unknown bits 0x%x (known: 0x%x)", d.targets,
            d.targets & ~ORCH_LORA_TARGET_ALL, ORCH_LORA_TARGET_ALL);
    if (!(d.alpha > 0.0f) || !isfinite(d.alpha))
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "adapter_create: alpha %g must be finite and > 0",
                               (double)d.alpha);
    if (d.rank == 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "adapter_create: rank 0; it must be >= 1");
    *out = d;
    return ORCH_OK;
}

/* One matrix of a target: its role, shape and place in the fused output. */
typedef struct spec {
    uint32_t role, in, out, col0;
} spec;

/* The matrices of one target bit of one layer into s; returns how many. */
static uint32_t target_specs(uint32_t arch, uint32_t bit, uint32_t C, uint32_t M,
                             uint32_t kvd, spec s[3]) {
    const int gpt2 = arch == ORCH_ARCH_GPT2;
    switch (bit) {
    case ORCH_LORA_TARGET_ATTN_QKV:
        if (gpt2) {
            s[0] = (spec){ ENGINE_LORA_GPT2_QKV, C, 3 * C, 0 };
            return 1;
        }
        s[0] = (spec){ ENGINE_LORA_LLAMA_Q, C, C, 0 };
        s[1] = (spec){ ENGINE_LORA_LLAMA_K, C, kvd, C };
        s[2] = (spec){ ENGINE_LORA_LLAMA_V, C, kvd, C + kvd };
        return 3;
    case ORCH_LORA_TARGET_ATTN_OUT:
        s[0] = (spec){ gpt2 ? ENGINE_LORA_GPT2_PROJ : ENGINE_LORA_LLAMA_O, C, C, 0 };
        return 1;
    case ORCH_LORA_TARGET_MLP_UP:
        if (gpt2) {
            s[0] = (spec){ ENGINE_LORA_GPT2_FC, C, M, 0 };
            return 1;
        }
        s[0] = (spec){ ENGINE_LORA_LLAMA_GATE, C, M, 0 };
        s[1] = (spec){ ENGINE_LORA_LLAMA_UP, C, M, M };
        return 2;
    default: /* ORCH_LORA_TARGET_MLP_DOWN */
        s[0] = (spec){ gpt2 ? ENGINE_LORA_GPT2_FCPROJ : ENGINE_LORA_LLAMA_DOWN, M, C, 0 };
        return 1;
    }
}

uint32_t engine_lora_mods(uint32_t arch, uint32_t layers, uint32_t C, uint32_t M,
                          uint32_t kvd, uint32_t targets, engine_lora_mod *mods) {
    static const uint32_t bits[4] = { ORCH_LORA_TARGET_ATTN_QKV,
                                      ORCH_LORA_TARGET_ATTN_OUT, ORCH_LORA_TARGET_MLP_UP,
                                      ORCH_LORA_TARGET_MLP_DOWN };
    uint32_t n = 0;
    for (uint32_t l = 0; l < layers; l++)
        for (int t = 0; t < 4; t++) {
            if (!(targets & bits[t])) continue;
            spec s[3];
            const uint32_t k = target_specs(arch, bits[t], C, M, kvd, s);
            for (uint32_t i = 0; i < k; i++, n++) {
                if (!mods) continue;
                engine_lora_mod *m = &mods[n];
                memset(m, 0, sizeof *m);
                m->layer = l;
                m->target = bits[t];
                m->role = s[i].role;
                m->in = s[i].in;
                m->out = s[i].out;
                m->col0 = s[i].col0;
            }
        }
    return n;
}

void engine_lora_tensor(engine_tensor *t, const char *base, const char *which,
                        uint64_t rows, uint64_t cols, uint64_t offset) {
    memset(t, 0, sizeof *t);
    size_t n = strlen(base);
    if (n > 7 && strcmp(base + n - 7, ".weight") == 0) n -= 7;
    snprintf(t->name, sizeof t->name, "%.*s.%s.weight", (int)n, base, which);
    t->ndim = 2;
    t->flags = 0;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->numel = rows * cols;
    t->offset = offset;
}

int32_t engine_check_ft_batch(const char *fn, const orch_finetune_batch *f,
                              const struct engine_batch_limits *lim,
                              uint64_t *out_counted, char *err, size_t cap) {
    const size_t need = offsetof(orch_finetune_batch, grad_scale) + sizeof(float);
    if (f->struct_size < need)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: struct_size %u is smaller than the %zu bytes up to "
                               "grad_scale",
                               fn, f->struct_size, need);
    if (f->struct_size >= sizeof *f && f->reserved0 != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "%s: reserved0 is %u; it must be 0", fn, f->reserved0);
    const float loss_slot = 0.0f; /* the train checks want an output; none here */
    return engine_check_train_call(fn, f->tokens, f->targets, f->batch, f->seq_len,
                                   f->grad_scale, &loss_slot, lim, out_counted, err, cap);
}

int32_t engine_check_coserve_args(const orch_finetune_batch *ft, uint32_t n_finetune,
                                  uint32_t ft_stride, const float *out_losses, char *err,
                                  size_t cap) {
    if (n_finetune == 0) return ORCH_OK;
    const size_t need = offsetof(orch_finetune_batch, grad_scale) + sizeof(float);
    const size_t align = _Alignof(orch_finetune_batch);
    if (!ft)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "coserve_forward: ft is NULL");
    if (!out_losses)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "coserve_forward: out_losses is NULL with n_finetune %u",
                               n_finetune);
    if (ft_stride < need || ft_stride % align != 0)
        return engine_fail_buf(err, cap, ORCH_ERR_INVALID_ARGUMENT,
                               "coserve_forward: ft_stride %u must be a multiple of %zu "
                               "and at least %zu",
                               ft_stride, align, need);
    return ORCH_OK;
}

void engine_ft_progress_fill(orch_ft_progress *p, int known, int finished,
                             uint64_t rows_total, uint64_t forward_rows,
                             uint64_t backward_rows, uint64_t rows_this_step,
                             float loss) {
    if (!p) return;
    const uint32_t size = p->struct_size;
    memset(p, 0, sizeof *p);
    p->struct_size = size;
    if (!known) return;
    p->finished = (uint32_t)(finished != 0);
    p->rows_total = rows_total;
    p->forward_rows = forward_rows;
    p->backward_rows = backward_rows;
    p->rows_this_step = rows_this_step;
    p->loss = loss;
}
