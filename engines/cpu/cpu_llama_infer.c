/*
 * cpu_llama_infer.c - paged-KV inference of ORCH_ARCH_LLAMA on the CPU
 * engine: validation (engines/common), then one forward over all new tokens
 * of the batch as one [N, C] activation matrix, as cpu_infer.c does for
 * GPT-2: products on the packed skinny kernel for at most skinny_max rows
 * (decoding, short chunks; with weights=int8 the int8 kernels of
 * cpu_quant.c instead) and on OpenBLAS (or oneDNN bf16) above.
 *
 * Per layer: RMSNorm, q|k|v in one product, RoPE of q and k at each token's
 * position (start_pos + i), K/V of the new tokens stored into the
 * sequence's blocks (one pool job, before any attention reads them), then
 * one task per (sequence, query head), most expensive sequences first:
 * prefill chunks of at least ATTN_GEMM_MIN tokens gather the key/value
 * head's K/V and attend with two sgemms per block of query rows, shorter
 * chunks (decoding) attend one query at a time with the vector kernels.
 * Then o_proj with the residual, RMSNorm, gate|up in one product, SwiGLU,
 * down_proj with the residual. model.norm and the head run on the logits
 * rows asked for only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_llama.h"
#include "engines/cpu/cpu_llama_infer.h"
#include "engines/cpu/cpu_kvq.h"
#include "engines/cpu/cpu_lora.h"
#include "engines/cpu/cpu_quant.h"

#define ATTN_GEMM_MIN  8
#define ATTN_ROW_BLOCK 64
#define ROW_CHUNKS     4

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Position slot of K (which 0) or V (1) of layer l in block: KVH head
 * vectors of ctx->kv_dtype (f32, bf16 or int8, cpu_kvq.c), kv_vb bytes
 * each. */
static uint8_t *kv_at(const orch_engine_ctx *ctx, uint32_t block, uint32_t l, int which,
                      uint32_t slot) {
    return (uint8_t *)ctx->kv +
           ((((size_t)block * ctx->L + l) * 2 + (size_t)which) * ctx->kv_block_size +
            slot) *
               ctx->KVH * ctx->kv_vb;
}

/* ------------------------------------------------------------------------- */
/* Packed weights                                                             */
/* ------------------------------------------------------------------------- */

/* Packed copies of q|k|v, o_proj, gate|up, down_proj per layer (in
 * ctx->packed_layer[l * 4 + 0..3]) and of the head (ctx->packed_wte). */
static int32_t packed_ensure(orch_engine_ctx *ctx) {
    if (ctx->packed_valid) return ORCH_OK;
    const size_t C = ctx->C, M = ctx->M, L = ctx->L, QS = C + 2 * (size_t)ctx->KVD;
    const size_t sizes[4][2] = { { QS, C }, { C, C }, { 2 * M, C }, { C, M } };
    static const int first[4] = { LL_Q, LL_O, LL_GATE, LL_DOWN };
    const float **src = malloc(L * 4 * sizeof *src);
    if (!src)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    for (uint32_t l = 0; l < L; l++)
        for (size_t k = 0; k < 4; k++)
            src[l * 4 + k] = cpu_llama_tensor(ctx, ctx->params, l, first[k]);
    int32_t st = cpu_packed_build(ctx, cpu_llama_head(ctx, ctx->params), src, sizes);
    free(src);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Forward state and jobs                                                     */
/* ------------------------------------------------------------------------- */

typedef struct fwd {
    orch_engine_ctx *ctx;
    const orch_infer_batch *batch;
    size_t N, R, row_chunks;
    const int32_t *toks;   /* [N] */
    const uint32_t *pos;   /* [N] */
    const uint32_t *seq;   /* [N] sequence of each token */
    const uint32_t *tok0;  /* [n_seqs] first row of each sequence */
    const uint32_t *order; /* [n_seqs] most expensive first */
    const int32_t *row_index;
    float *x, *ln, *qkv, *atty, *gu, *rows, *att;
    size_t att_per_thread;
    uint32_t layer;
    int op;
    const float *w; /* RMSNorm weight */
} fwd;

enum { F_EMBED, F_RMS, F_ROPE_STORE, F_SWIGLU, F_ROWS_RMS };

static void rows_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const fwd *f = arg;
    orch_engine_ctx *ctx = f->ctx;
    const size_t C = ctx->C, M = ctx->M, KVD = ctx->KVD, QS = C + 2 * KVD;
    const size_t n = f->op == F_ROWS_RMS ? f->R : f->N;
    const size_t chunks = f->op == F_ROWS_RMS
                              ? cpu_pool_chunks(ctx->pool, f->R, 4, ROW_CHUNKS)
                              : f->row_chunks;
    size_t a, b;
    cpu_pool_range(n, (int)c, (int)chunks, 1, &a, &b);
    for (size_t r = a; r < b; r++) {
        switch (f->op) {
        case F_EMBED:
            memcpy(f->x + r * C,
                   cpu_llama_embed(ctx, ctx->params) + (size_t)f->toks[r] * C,
                   C * sizeof(float));
            break;
        case F_RMS:
            cpu_llama_rmsnorm(f->x + r * C, f->ln + r * C, f->w, C, ctx->eps, NULL);
            break;
        case F_ROWS_RMS:
            cpu_llama_rmsnorm(f->x + (size_t)f->row_index[r] * C, f->rows + r * C, f->w,
                              C, ctx->eps, NULL);
            break;
        case F_ROPE_STORE: { /* RoPE of q and k, then K/V into the blocks */
            float *row = f->qkv + r * QS;
            cpu_llama_rope(ctx->llama, row, ctx->NH, ctx->HS, f->pos[r], 0);
            cpu_llama_rope(ctx->llama, row + C, ctx->KVH, ctx->HS, f->pos[r], 0);
            const orch_seq_input *s = engine_batch_seq(f->batch, f->seq[r]);
            const uint32_t p = f->pos[r], bs = ctx->kv_block_size;
            const uint32_t blk = (uint32_t)s->block_table[p / bs];
            cpu_kv_put(ctx->isa, ctx->kv_dtype, kv_at(ctx, blk, f->layer, 0, p % bs),
                       row + C, ctx->KVH, ctx->HS);
            cpu_kv_put(ctx->isa, ctx->kv_dtype, kv_at(ctx, blk, f->layer, 1, p % bs),
                       row + C + KVD, ctx->KVH, ctx->HS);
            break;
        }
        case F_SWIGLU: { /* h into the first M columns of the gate|up row */
            float *g = f->gu + r * 2 * M;
            const float *u = g + M;
            for (size_t i = 0; i < M; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            break;
        }
        default: break;
        }
    }
}

static void run_rows(fwd *f, int op) {
    f->op = op;
    const size_t chunks = op == F_ROWS_RMS
                              ? cpu_pool_chunks(f->ctx->pool, f->R, 4, ROW_CHUNKS)
                              : f->row_chunks;
    cpu_pool_for(f->ctx->pool, chunks, rows_chunk, f);
}

/* Attention of (sequence si, query head h) over its blocks. */
static void attn_task(const fwd *f, uint32_t si, uint32_t h, float *scratch) {
    orch_engine_ctx *ctx = f->ctx;
    const orch_seq_input *s = engine_batch_seq(f->batch, si);
    const uint32_t l = f->layer, bs = ctx->kv_block_size;
    const size_t C = ctx->C, HS = ctx->HS, QS = C + 2 * (size_t)ctx->KVD;
    const size_t kvo = (size_t)(h / (ctx->NH / ctx->KVH)) * ctx->kv_vb; /* bytes */
    const int dt = ctx->kv_dtype, isa = ctx->isa;
    const uint32_t n = s->n_tokens, start = s->start_pos, P = start + n;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *q = f->qkv + (size_t)f->tok0[si] * QS + (size_t)h * HS;
    float *out = f->atty + (size_t)f->tok0[si] * C + (size_t)h * HS;
    if (n >= ATTN_GEMM_MIN) {
        float *Kg = scratch, *Vg = Kg + (size_t)P * HS, *S = Vg + (size_t)P * HS;
        for (uint32_t p = 0; p < P; p++) {
            const uint32_t b = (uint32_t)s->block_table[p / bs];
            cpu_kv_get(isa, dt, Kg + (size_t)p * HS, kv_at(ctx, b, l, 0, p % bs) + kvo, 1,
                       HS);
            cpu_kv_get(isa, dt, Vg + (size_t)p * HS, kv_at(ctx, b, l, 1, p % bs) + kvo, 1,
                       HS);
        }
        for (uint32_t i0 = 0; i0 < n; i0 += ATTN_ROW_BLOCK) {
            const uint32_t i1 = i0 + ATTN_ROW_BLOCK < n ? i0 + ATTN_ROW_BLOCK : n;
            const uint32_t rows = i1 - i0, Pc = start + i1;
            cpu_sgemm1(0, 1, (int)rows, (int)Pc, (int)HS, scale, q + (size_t)i0 * QS,
                       (int)QS, Kg, (int)HS, 0.0f, S, (int)Pc);
            for (uint32_t i = i0; i < i1; i++) {
                float *row = S + (size_t)(i - i0) * Pc;
                const uint32_t valid = start + i + 1;
                const float mx = cpu_max(ctx->isa, row, valid);
                const float sum = cpu_exp_sum(ctx->isa, row, mx, valid);
                cpu_scale(ctx->isa, row, 1.0f / sum, valid);
                for (uint32_t k = valid; k < Pc; k++) row[k] = 0.0f;
            }
            cpu_sgemm1(0, 0, (int)rows, (int)HS, (int)Pc, 1.0f, S, (int)Pc, Vg, (int)HS,
                       0.0f, out + (size_t)i0 * C, (int)C);
        }
        return;
    }
    const void **kr = (const void **)(void *)scratch;
    const void **vr = kr + P;
    float *sc = (float *)(void *)(vr + P);
    for (uint32_t p = 0; p < P; p++) {
        const uint32_t b = (uint32_t)s->block_table[p / bs];
        kr[p] = kv_at(ctx, b, l, 0, p % bs) + kvo;
        vr[p] = kv_at(ctx, b, l, 1, p % bs) + kvo;
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t valid = start + i + 1;
        cpu_kv_scores(isa, dt, q + (size_t)i * QS, kr, valid, HS, scale, sc);
        const float mx = cpu_max(isa, sc, valid);
        cpu_scale(isa, sc, 1.0f / cpu_exp_sum(isa, sc, mx, valid), valid);
        cpu_kv_mix(isa, dt, sc, vr, valid, HS, out + (size_t)i * C);
    }
}

static void attn_chunk(void *arg, size_t c, int tid) {
    const fwd *f = arg;
    const uint32_t NH = f->ctx->NH;
    attn_task(f, f->order[c / NH], (uint32_t)(c % NH),
              f->att + (size_t)tid * f->att_per_thread);
}

/* One linear layer: on the int8 kernel when given its packed int8 matrix
 * (weights=int8, at most skinny_max rows), else cpu_linear_forward. */
static void linear(orch_engine_ctx *ctx, const cpu_linear_fwd *op, const uint8_t *q8w) {
    if (q8w && (uint32_t)op->R <= ctx->skinny_max)
        cpu_q8_linear(ctx, op, q8w);
    else
        cpu_linear_forward(ctx, op);
}

typedef struct task_key {
    double cost;
    uint32_t seq;
} task_key;

static int by_cost_desc(const void *a, const void *b) {
    const task_key *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* ------------------------------------------------------------------------- */
/* Forward                                                                    */
/* ------------------------------------------------------------------------- */

static int32_t scratch_ensure(orch_engine_ctx *ctx, fwd *f, size_t att) {
    cpu_llama_state *st = ctx->llama;
    const size_t N = f->N, C = ctx->C, M = ctx->M, QS = C + 2 * (size_t)ctx->KVD;
    f->att_per_thread = al16(att);
    const size_t need = 3 * al16(N * C) + al16(N * QS) + al16(N * 2 * M) +
                        al16(f->R * C) + f->att_per_thread * (size_t)ctx->threads;
    if (need > st->inf_floats) {
        free(st->inf);
        st->inf = NULL;
        st->inf_floats = 0;
        void *p = NULL;
        if (posix_memalign(&p, 64, need * sizeof(float)) != 0)
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "infer_forward: cannot allocate %zu MiB of scratch",
                            need * sizeof(float) >> 20);
        st->inf = p;
        st->inf_floats = need;
    }
    float *q = st->inf;
    f->x = q;
    q += al16(N * C);
    f->ln = q;
    q += al16(N * C);
    f->atty = q;
    q += al16(N * C);
    f->qkv = q;
    q += al16(N * QS);
    f->gu = q;
    q += al16(N * 2 * M);
    f->rows = q;
    q += al16(f->R * C);
    f->att = q;
    return ORCH_OK;
}

int32_t cpu_llama_infer_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                float *logits, uint64_t logits_cap) {
    uint64_t n_tok = 0, n_rows = 0;
    const engine_kv_view kv = cpu_kv_view(ctx);
    int32_t st = engine_infer_check_lora(
        batch, logits, logits_cap, ctx->V, ctx->T, ctx->max_batch_tokens,
        "engine option max_batch_tokens", &kv, cpu_lora_known, ctx, &n_tok, &n_rows,
        ENGINE_ERRBUF(ctx));
    if (st != ORCH_OK) return st;
    fwd f;
    memset(&f, 0, sizeof f);
    f.ctx = ctx;
    f.batch = batch;
    f.N = (size_t)n_tok;
    f.R = (size_t)n_rows;
    const size_t N = f.N, R = f.R, C = ctx->C, M = ctx->M, HS = ctx->HS;
    const size_t QS = C + 2 * (size_t)ctx->KVD;
    size_t att = 1;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        const size_t P = (size_t)s->start_pos + s->n_tokens;
        const size_t need = s->n_tokens >= ATTN_GEMM_MIN
                                ? 2 * P * HS + (size_t)ATTN_ROW_BLOCK * P
                                : 4 * P + P + 16; /* 2 P pointers, P scores */
        if (need > att) att = need;
    }
    if ((st = scratch_ensure(ctx, &f, att)) != ORCH_OK) return st;
    const int skinny_layers = N <= ctx->skinny_max;
    const int skinny_head = R > 0 && R <= ctx->skinny_max;
    const int q8 = ctx->weights == CPU_WEIGHTS_INT8;
    if (skinny_layers || skinny_head) {
        /* Rows of the int8 products: all N tokens, or the R logits rows (<= N). */
        st = q8 ? cpu_q8_ensure(ctx, skinny_layers ? N : R) : packed_ensure(ctx);
        if (st != ORCH_OK) return st;
    }

    cpu_lora_batch lb; /* the sequences' adapters (ABI 1.4) */
    if ((st = cpu_lora_batch_begin(ctx, batch, &lb)) != ORCH_OK) return st;
    uint32_t *tok0 = malloc(batch->n_seqs * sizeof(uint32_t));
    uint32_t *order = malloc(batch->n_seqs * sizeof(uint32_t));
    task_key *keys = malloc(batch->n_seqs * sizeof(task_key));
    int32_t *toks = malloc(N * sizeof(int32_t));
    uint32_t *pos = malloc(N * sizeof(uint32_t));
    uint32_t *seq = malloc(N * sizeof(uint32_t));
    int32_t *row_index = malloc((R ? R : 1) * sizeof(int32_t));
    if (!tok0 || !order || !keys || !toks || !pos || !seq || !row_index) {
        cpu_lora_batch_end(&lb);
        free(tok0);
        free(order);
        free(keys);
        free(toks);
        free(pos);
        free(seq);
        free(row_index);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    }
    size_t r = 0, row = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        tok0[i] = (uint32_t)r;
        keys[i] =
            (task_key){ (double)s->n_tokens * ((double)s->start_pos + s->n_tokens), i };
        for (uint32_t k = 0; k < s->n_tokens; k++, r++) {
            toks[r] = s->tokens[k];
            pos[r] = s->start_pos + k;
            seq[r] = i;
            if (s->logits_mode == ORCH_LOGITS_ALL ||
                (s->logits_mode == ORCH_LOGITS_LAST && k + 1 == s->n_tokens))
                row_index[row++] = (int32_t)r;
        }
    }
    engine_kv_mark_written(batch, &kv);
    qsort(keys, batch->n_seqs, sizeof *keys, by_cost_desc);
    for (uint32_t i = 0; i < batch->n_seqs; i++) order[i] = keys[i].seq;
    free(keys);
    f.toks = toks;
    f.pos = pos;
    f.seq = seq;
    f.tok0 = tok0;
    f.order = order;
    f.row_index = row_index;
    f.row_chunks = cpu_pool_chunks(ctx->pool, N, 4, ROW_CHUNKS);

    float *P = ctx->params;
    run_rows(&f, F_EMBED);
    for (uint32_t l = 0; l < ctx->L; l++) {
        float *const *pk = skinny_layers && !q8 ? ctx->packed_layer + l * 4 : NULL;
        uint8_t *const *qk = skinny_layers && q8 ? ctx->q8_layer + l * 4 : NULL;
        f.layer = l;
        f.w = cpu_llama_tensor(ctx, P, l, LL_IN_NORM);
        run_rows(&f, F_RMS);
        cpu_linear_fwd op = { .R = (int)N,
                              .N = (int)QS,
                              .K = (int)C,
                              .in = f.ln,
                              .ldin = (int)C,
                              .W = cpu_llama_tensor(ctx, P, l, LL_Q),
                              .packed = pk ? pk[0] : NULL,
                              .out = f.qkv,
                              .ldout = (int)QS };
        linear(ctx, &op, qk ? qk[0] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_ATTN_QKV, f.ln, C, f.qkv,
                               QS);
        run_rows(&f, F_ROPE_STORE);
        cpu_pool_for(ctx->pool, (size_t)batch->n_seqs * ctx->NH, attn_chunk, &f);
        op = (cpu_linear_fwd){ .R = (int)N,
                               .N = (int)C,
                               .K = (int)C,
                               .in = f.atty,
                               .ldin = (int)C,
                               .W = cpu_llama_tensor(ctx, P, l, LL_O),
                               .packed = pk ? pk[1] : NULL,
                               .resid = f.x,
                               .ldresid = (int)C,
                               .out = f.x,
                               .ldout = (int)C };
        linear(ctx, &op, qk ? qk[1] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_ATTN_OUT, f.atty, C, f.x, C);
        f.w = cpu_llama_tensor(ctx, P, l, LL_POST_NORM);
        run_rows(&f, F_RMS);
        op = (cpu_linear_fwd){ .R = (int)N,
                               .N = (int)(2 * M),
                               .K = (int)C,
                               .in = f.ln,
                               .ldin = (int)C,
                               .W = cpu_llama_tensor(ctx, P, l, LL_GATE),
                               .packed = pk ? pk[2] : NULL,
                               .out = f.gu,
                               .ldout = (int)(2 * M) };
        linear(ctx, &op, qk ? qk[2] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_MLP_UP, f.ln, C, f.gu,
                               2 * M);
        run_rows(&f, F_SWIGLU);
        op = (cpu_linear_fwd){ .R = (int)N,
                               .N = (int)C,
                               .K = (int)M,
                               .in = f.gu,
                               .ldin = (int)(2 * M),
                               .W = cpu_llama_tensor(ctx, P, l, LL_DOWN),
                               .packed = pk ? pk[3] : NULL,
                               .resid = f.x,
                               .ldresid = (int)C,
                               .out = f.x,
                               .ldout = (int)C };
        linear(ctx, &op, qk ? qk[3] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_MLP_DOWN, f.gu, 2 * M, f.x,
                               C);
    }
    if (R > 0) {
        f.w = cpu_llama_norm(ctx, P);
        run_rows(&f, F_ROWS_RMS);
        cpu_linear_fwd op = { .R = (int)R,
                              .N = (int)ctx->V,
                              .K = (int)C,
                              .in = f.rows,
                              .ldin = (int)C,
                              .W = cpu_llama_head(ctx, P),
                              .packed = skinny_head && !q8 ? ctx->packed_wte : NULL,
                              .out = logits,
                              .ldout = (int)ctx->V };
        linear(ctx, &op, skinny_head && q8 ? ctx->q8_wte : NULL);
    }
    cpu_lora_batch_end(&lb);
    free(tok0);
    free(order);
    free(toks);
    free(pos);
    free(seq);
    free(row_index);
    return ORCH_OK;
}
