/*
 * cpu_infer.c - paged-KV inference on the CPU engine: validation of a batch,
 * then one forward over all new tokens of all sequences.
 *
 * All new tokens of the batch form one [N, C] activation matrix, so each
 * weight matrix is read once per forward whatever the number of sequences:
 * with N <= skinny_max rows (decoding, short chunks; engine option skinny,
 * default 64) the product runs on the packed kernel (bandwidth-bound for one
 * sequence, FMA-bound for 16), otherwise on OpenBLAS sgemm split across the
 * pool. With weights=int8 the products of at most skinny_max rows run on
 * the int8 kernel (cpu_quant.c) instead of the fp32 packed one, which is
 * then never built; longer products stay on OpenBLAS over ctx->params,
 * which hold the same (dequantized) weights.
 *
 * KV pool layout: block b holds, for every layer l, K then V of block_size
 * positions, each position C values (all heads) of the kv= type (f32 or
 * bf16, cpu_kvq.c):
 *   kv[(((b * L + l) * 2 + kv) * block_size + slot) * C + channel]
 * Attention of (sequence, head) first stores the head's K/V of the new
 * tokens into the sequence's blocks, then attends over positions
 * 0..start_pos+i through the block table: one query at a time with vector
 * dot products for short chunks, or by gathering K/V and two sgemms for
 * prefill chunks. Decoding tasks take a group of heads of one sequence
 * (about 4 tasks per thread) and read each position's K and V rows once
 * for the whole group; per head the operations are those of one head at a
 * time, so the grouping changes no bits. Logits are computed only for the rows asked for: ln_f and
 * the LM head run on those rows alone.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_internal.h"
#include "engines/cpu/cpu_kvq.h"
#include "engines/cpu/cpu_lora.h"
#include "engines/cpu/cpu_quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define INFER_X86 1
#else
#define INFER_X86 0
#endif

/* Chunks of at least this many new tokens attend with sgemm, in blocks of
 * ATTN_ROW_BLOCK query rows (each block skips the keys it cannot see). */
#define ATTN_GEMM_MIN  8
#define ATTN_ROW_BLOCK 64

/* Position slot of K (which 0) or V (1) of layer l in block, all heads:
 * NH head vectors of ctx->kv_dtype, kv_vb bytes each. */
static uint8_t *kv_at(const orch_engine_ctx *ctx, uint32_t block, uint32_t l, int which,
                      uint32_t slot) {
    return (uint8_t *)ctx->kv +
           ((((size_t)block * ctx->L + l) * 2 + (size_t)which) * ctx->kv_block_size +
            slot) *
               ctx->NH * ctx->kv_vb;
}

void cpu_infer_free(orch_engine_ctx *ctx) {
    free(ctx->inf.base);
    free(ctx->inf.row_index);
    memset(&ctx->inf, 0, sizeof ctx->inf);
    free(ctx->packed);
    free(ctx->packed_layer);
    ctx->packed = NULL;
    ctx->packed_layer = NULL;
    ctx->packed_wte = NULL;
    ctx->packed_valid = 0;
    cpu_q8_free(ctx);
}

/* ------------------------------------------------------------------------- */
/* Validation                                                                 */
/* ------------------------------------------------------------------------- */

static int32_t validate(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                        const float *logits, uint64_t logits_cap, uint64_t *out_tokens,
                        uint64_t *out_rows) {
    const engine_kv_view kv = cpu_kv_view(ctx);
    return engine_infer_check_lora(batch, logits, logits_cap, ctx->V, ctx->T,
                                   ctx->max_batch_tokens,
                                   "engine option max_batch_tokens", &kv, cpu_lora_known,
                                   ctx, out_tokens, out_rows, ENGINE_ERRBUF(ctx));
}

/* ------------------------------------------------------------------------- */
/* Scratch and packed weights                                                 */
/* ------------------------------------------------------------------------- */

static size_t al16(size_t n) { return (n + 15) & ~(size_t)15; }

static int32_t scratch_ensure(orch_engine_ctx *ctx, size_t N, size_t R,
                              size_t att_per_thread) {
    cpu_infer_scratch *s = &ctx->inf;
    const size_t C = ctx->C, M = ctx->M;
    att_per_thread = al16(att_per_thread);
    size_t need = al16(N * C) * 3 + al16(N * 3 * C) + al16(N * M) + al16(R * C) +
                  att_per_thread * (size_t)ctx->threads;
    if (need > s->floats) {
        free(s->base);
        s->base = NULL;
        s->floats = 0;
        void *p = NULL;
        if (posix_memalign(&p, 64, need * sizeof(float)) != 0)
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "infer_forward: cannot allocate %zu MiB of "
                            "scratch",
                            need * sizeof(float) >> 20);
        s->base = p;
        s->floats = need;
    }
    float *q = s->base;
    s->x = q;
    q += al16(N * C);
    s->ln = q;
    q += al16(N * C);
    s->atty = q;
    q += al16(N * C);
    s->qkv = q;
    q += al16(N * 3 * C);
    s->fc = q;
    q += al16(N * M);
    s->rows = q;
    q += al16(R * C);
    s->att = q;
    s->att_per_thread = att_per_thread;
    if (R > s->row_index_cap || !s->row_index) {
        free(s->row_index);
        s->row_index = malloc((R ? R : 1) * sizeof(int32_t));
        if (!s->row_index) {
            s->row_index_cap = 0;
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
        }
        s->row_index_cap = R ? R : 1;
    }
    return ORCH_OK;
}

typedef struct pack_item {
    const float *w;
    float *wp;
    size_t N, K;
    size_t first_chunk; /* chunks of PACK_PANELS panels, numbered across items */
} pack_item;

#define PACK_PANELS 32

typedef struct pack_job {
    pack_item *items;
    size_t n;
} pack_job;

static void pack_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const pack_job *j = arg;
    size_t i = 0;
    while (i + 1 < j->n && j->items[i + 1].first_chunk <= c) i++;
    const pack_item *it = &j->items[i];
    size_t p0 = (c - it->first_chunk) * PACK_PANELS, np = cpu_panel_count(it->N);
    size_t p1 = p0 + PACK_PANELS < np ? p0 + PACK_PANELS : np;
    cpu_pack_panels(it->N, it->K, it->w, it->wp, p0, p1);
}

int32_t cpu_packed_build(orch_engine_ctx *ctx, const float *head,
                         const float *const *layer_src, const size_t sizes[4][2]) {
    const size_t C = ctx->C, L = ctx->L;
    if (!ctx->packed) {
        size_t total = al16(cpu_packed_floats(ctx->V, C));
        for (size_t k = 0; k < 4; k++)
            total += L * al16(cpu_packed_floats(sizes[k][0], sizes[k][1]));
        void *p = NULL;
        ctx->packed_layer = calloc(L * 4, sizeof(float *));
        if (!ctx->packed_layer || posix_memalign(&p, 64, total * sizeof(float)) != 0) {
            free(ctx->packed_layer);
            ctx->packed_layer = NULL;
            return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                            "infer_forward: cannot allocate %zu MiB for the "
                            "packed weights (engine option skinny=0 avoids "
                            "them)",
                            total * sizeof(float) >> 20);
        }
        ctx->packed = p;
        float *q = ctx->packed;
        ctx->packed_wte = q;
        q += al16(cpu_packed_floats(ctx->V, C));
        for (size_t l = 0; l < L; l++)
            for (size_t k = 0; k < 4; k++) {
                ctx->packed_layer[l * 4 + k] = q;
                q += al16(cpu_packed_floats(sizes[k][0], sizes[k][1]));
            }
    }
    pack_item *items = malloc((L * 4 + 1) * sizeof *items);
    if (!items)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    size_t n = 0;
    items[n++] = (pack_item){ head, ctx->packed_wte, ctx->V, C, 0 };
    for (size_t l = 0; l < L; l++)
        for (size_t k = 0; k < 4; k++)
            items[n++] = (pack_item){ layer_src[l * 4 + k], ctx->packed_layer[l * 4 + k],
                                      sizes[k][0], sizes[k][1], 0 };
    size_t chunks = 0;
    for (size_t i = 0; i < n; i++) {
        items[i].first_chunk = chunks;
        chunks += (cpu_panel_count(items[i].N) + PACK_PANELS - 1) / PACK_PANELS;
    }
    pack_job j = { items, n };
    cpu_pool_for(ctx->pool, chunks, pack_chunk, &j);
    free(items);
    ctx->packed_valid = 1;
    return ORCH_OK;
}

/* Build the packed copy of every GPT-2 weight matrix (once after each change
 * of the parameters). */
static int32_t packed_ensure(orch_engine_ctx *ctx) {
    if (ctx->packed_valid) return ORCH_OK;
    const size_t C = ctx->C, M = ctx->M, L = ctx->L;
    const size_t sizes[4][2] = { { 3 * C, C }, { C, C }, { M, C }, { C, M } };
    const float **src = malloc(L * 4 * sizeof *src);
    if (!src)
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    for (size_t l = 0; l < L; l++) {
        const cpu_layer_view *w = &ctx->pv.layer[l];
        src[l * 4 + 0] = w->qkv_w, src[l * 4 + 1] = w->ap_w;
        src[l * 4 + 2] = w->fc_w, src[l * 4 + 3] = w->mp_w;
    }
    int32_t st = cpu_packed_build(ctx, ctx->pv.wte, src, sizes);
    free(src);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Jobs                                                                       */
/* ------------------------------------------------------------------------- */

typedef struct fwd_state {
    orch_engine_ctx *ctx;
    const orch_infer_batch *batch;
    const uint32_t *tok0;  /* first row of each sequence in x */
    const int32_t *tokens; /* [N] token ids */
    const uint32_t *pos;   /* [N] positions */
    size_t N;
    uint32_t layer;
    size_t row_chunks;
    uint32_t *order;      /* attention tasks, most expensive first */
    uint32_t head_groups; /* attention tasks per sequence */
} fwd_state;

#define ROW_CHUNKS 4

static void embed_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const fwd_state *f = arg;
    const orch_engine_ctx *ctx = f->ctx;
    const size_t C = ctx->C;
    size_t a, b;
    cpu_pool_range(f->N, (int)c, (int)f->row_chunks, 1, &a, &b);
    for (size_t r = a; r < b; r++)
        cpu_add(ctx->isa, ctx->pv.wte + (size_t)f->tokens[r] * C,
                ctx->pv.wpe + (size_t)f->pos[r] * C, ctx->inf.x + r * C, C);
}

typedef struct rows_ln_job {
    orch_engine_ctx *ctx;
    const float *x;
    float *out;
    const int32_t *index; /* NULL: rows 0..n-1 */
    size_t n;
    const float *w, *b;
    size_t chunks;
} rows_ln_job;

static void rows_ln_chunk(void *arg, size_t c, int tid) {
    (void)tid;
    const rows_ln_job *j = arg;
    const uint32_t C = j->ctx->C;
    size_t a, b;
    cpu_pool_range(j->n, (int)c, (int)j->chunks, 1, &a, &b);
    for (size_t r = a; r < b; r++) {
        size_t src = j->index ? (size_t)j->index[r] : r;
        cpu_layernorm(j->ctx->isa, j->x + src * C, j->out + r * C, j->w, j->b, C,
                      j->ctx->eps, NULL, NULL);
    }
}

/* One (sequence, head) task of a prefill chunk (n_tokens >= ATTN_GEMM_MIN):
 * store K/V of the new tokens, gather the head's K/V, attend with sgemm. */
static void attn_task(const fwd_state *f, uint32_t si, uint32_t h, float *scratch) {
    orch_engine_ctx *ctx = f->ctx;
    const orch_seq_input *s = engine_batch_seq(f->batch, si);
    const uint32_t l = f->layer, bs = ctx->kv_block_size;
    const size_t C = ctx->C, HS = ctx->HS;
    const uint32_t n = s->n_tokens, start = s->start_pos, P = start + n;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *qkv = ctx->inf.qkv + (size_t)f->tok0[si] * 3 * C;
    float *out = ctx->inf.atty + (size_t)f->tok0[si] * C + h * HS;
    const int dt = ctx->kv_dtype, isa = ctx->isa;
    const size_t ho = h * ctx->kv_vb; /* the head's bytes in a K/V row */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = start + i, b = (uint32_t)s->block_table[p / bs];
        const float *row = qkv + (size_t)i * 3 * C;
        cpu_kv_put(isa, dt, kv_at(ctx, b, l, 0, p % bs) + ho, row + C + h * HS, 1, HS);
        cpu_kv_put(isa, dt, kv_at(ctx, b, l, 1, p % bs) + ho, row + 2 * C + h * HS, 1,
                   HS);
    }
    float *Kg = scratch, *Vg = Kg + (size_t)P * HS, *S = Vg + (size_t)P * HS;
    for (uint32_t p = 0; p < P; p++) {
        uint32_t b = (uint32_t)s->block_table[p / bs];
        cpu_kv_get(isa, dt, Kg + (size_t)p * HS, kv_at(ctx, b, l, 0, p % bs) + ho, 1, HS);
        cpu_kv_get(isa, dt, Vg + (size_t)p * HS, kv_at(ctx, b, l, 1, p % bs) + ho, 1, HS);
    }
    /* Blocks of query rows attend only to the keys they can see. */
    for (uint32_t i0 = 0; i0 < n; i0 += ATTN_ROW_BLOCK) {
        const uint32_t i1 = i0 + ATTN_ROW_BLOCK < n ? i0 + ATTN_ROW_BLOCK : n;
        const uint32_t rows = i1 - i0, Pc = start + i1;
        cpu_sgemm1(0, 1, (int)rows, (int)Pc, (int)HS, scale,
                   qkv + (size_t)i0 * 3 * C + h * HS, (int)(3 * C), Kg, (int)HS, 0.0f, S,
                   (int)Pc);
        for (uint32_t i = i0; i < i1; i++) {
            float *row = S + (size_t)(i - i0) * Pc;
            uint32_t valid = start + i + 1;
            const float mx = cpu_max(ctx->isa, row, valid);
            const float sum = cpu_exp_sum(ctx->isa, row, mx, valid);
            cpu_scale(ctx->isa, row, 1.0f / sum, valid);
            for (uint32_t j = valid; j < Pc; j++) row[j] = 0.0f;
        }
        cpu_sgemm1(0, 0, (int)rows, (int)HS, (int)Pc, 1.0f, S, (int)Pc, Vg, (int)HS, 0.0f,
                   out + (size_t)i0 * C, (int)C);
    }
}

#if INFER_X86
/* For head size 64: out[(h0 + h) * 64 + d] = sum_p sc[h * ldsc + p]
 * vr[p][(h0 + h) * 64 + d] for h < nh, with the operations of
 * cpu_attn_mix's AVX-512 version (one fused multiply-add per position from
 * zero, positions in order: the same bits), but each position's V row read
 * once for up to 6 heads (1.5 KB contiguous) instead of once per head. */
#define MIX_HEADS 6
__attribute__((target("avx512f"))) static void mix64_avx512(const float *sc, size_t ldsc,
                                                            const void *const *vr,
                                                            size_t n, size_t h0,
                                                            size_t nh, float *out) {
    for (size_t a = 0; a < nh; a += MIX_HEADS) {
        const size_t m = nh - a < MIX_HEADS ? nh - a : MIX_HEADS;
        const size_t off = (h0 + a) * 64;
        __m512 acc[MIX_HEADS * 4];
        _Pragma("GCC unroll 24") for (int i = 0; i < MIX_HEADS * 4; i++) acc[i] =
            _mm512_setzero_ps();
        for (size_t p = 0; p < n; p++) {
            const float *src = (const float *)vr[p] + off;
            _Pragma("GCC unroll 6") for (int h = 0; h < MIX_HEADS; h++) {
                if ((size_t)h >= m) break;
                const __m512 w = _mm512_set1_ps(sc[(a + (size_t)h) * ldsc + p]);
                _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++) acc[h * 4 + e] =
                    _mm512_fmadd_ps(w, _mm512_loadu_ps(src + h * 64 + e * 16),
                                    acc[h * 4 + e]);
            }
        }
        _Pragma("GCC unroll 6") for (int h = 0; h < MIX_HEADS; h++) {
            if ((size_t)h >= m) break;
            _Pragma("GCC unroll 4") for (int e = 0; e < 4; e++)
                _mm512_storeu_ps(out + off + h * 64 + e * 16, acc[h * 4 + e]);
        }
    }
}
#endif

/* Positions per score chunk: a multiple of 16 (cpu_attn_scores works on 16
 * positions at a time from the first, so chunking changes no bits). */
#define SCORE_CHUNK 16

/* Short chunks (decoding) of sequence si, heads [h0, h1): store K/V of the
 * new tokens, then per new token the scores of all those heads position
 * chunk by position chunk (the K rows of a chunk read once, contiguously,
 * for every head), softmax per head, and the V mix. Per head the same
 * operations as one head at a time, so the head grouping changes no bits.
 * K/V are stored and read as ctx->kv_dtype (cpu_kvq.c); with f32 the
 * kernels are those of cpu_kernels.c.
 * scratch: 3 P pointers + (h1 - h0) P scores. */
static void attn_decode(const fwd_state *f, uint32_t si, uint32_t h0, uint32_t h1,
                        float *scratch) {
    orch_engine_ctx *ctx = f->ctx;
    const orch_seq_input *s = engine_batch_seq(f->batch, si);
    const uint32_t l = f->layer, bs = ctx->kv_block_size;
    const size_t C = ctx->C, HS = ctx->HS, nh = h1 - h0;
    const uint32_t n = s->n_tokens, start = s->start_pos, P = start + n;
    const float scale = 1.0f / sqrtf((float)HS);
    const float *qkv = ctx->inf.qkv + (size_t)f->tok0[si] * 3 * C;
    float *atty = ctx->inf.atty + (size_t)f->tok0[si] * C;
    const int dt = ctx->kv_dtype, isa = ctx->isa;
    const size_t vb = ctx->kv_vb;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t p = start + i, b = (uint32_t)s->block_table[p / bs];
        const float *row = qkv + (size_t)i * 3 * C;
        cpu_kv_put(isa, dt, kv_at(ctx, b, l, 0, p % bs) + h0 * vb, row + C + h0 * HS, nh,
                   HS);
        cpu_kv_put(isa, dt, kv_at(ctx, b, l, 1, p % bs) + h0 * vb, row + 2 * C + h0 * HS,
                   nh, HS);
    }
    const void **kr = (const void **)(void *)scratch;
    const void **vr = kr + P;
    const void **hp = vr + P; /* [P]: one head's pointers */
    float *sc = (float *)(void *)(hp + P);
    for (uint32_t p = 0; p < P; p++) {
        uint32_t b = (uint32_t)s->block_table[p / bs];
        kr[p] = kv_at(ctx, b, l, 0, p % bs);
        vr[p] = kv_at(ctx, b, l, 1, p % bs);
    }
    for (uint32_t i = 0; i < n; i++) {
        const float *q = qkv + (size_t)i * 3 * C;
        float *out = atty + (size_t)i * C;
        const uint32_t valid = start + i + 1;
        if (dt != CPU_KV_F32) /* each K row read once for the group */
            cpu_kv_scores_heads(isa, dt, q, kr, valid, h0, nh, HS, scale, sc, P, hp);
        for (uint32_t p0 = 0; dt == CPU_KV_F32 && p0 < valid; p0 += SCORE_CHUNK) {
            const uint32_t cnt = valid - p0 < SCORE_CHUNK ? valid - p0 : SCORE_CHUNK;
            /* The next chunk's K rows (these heads) while this one runs. */
            for (uint32_t j = p0 + SCORE_CHUNK; j < p0 + 2 * SCORE_CHUNK && j < valid;
                 j++)
                for (size_t o = h0 * vb; o < h1 * vb; o += 64)
                    __builtin_prefetch((const uint8_t *)kr[j] + o);
            for (size_t h = 0; h < nh; h++) {
                const void *kk[SCORE_CHUNK];
                for (uint32_t j = 0; j < cnt; j++)
                    kk[j] = (const uint8_t *)kr[p0 + j] + (h0 + h) * vb;
                cpu_kv_scores(isa, dt, q + (h0 + h) * HS, kk, cnt, HS, scale,
                              sc + h * P + p0);
            }
        }
        for (size_t h = 0; h < nh; h++) {
            float *sh = sc + h * P;
            const float mx = cpu_max(ctx->isa, sh, valid);
            cpu_scale(ctx->isa, sh, 1.0f / cpu_exp_sum(ctx->isa, sh, mx, valid), valid);
        }
        if (dt != CPU_KV_F32) {
            cpu_kv_mix_heads(isa, dt, sc, P, vr, valid, h0, nh, HS, hp, out);
            continue;
        }
#if INFER_X86
        if (ctx->isa >= CPU_ISA_AVX512 && HS == 64) {
            mix64_avx512(sc, P, vr, valid, h0, nh, out);
            continue;
        }
#endif
        for (size_t h = 0; h < nh; h++) {
            for (uint32_t p = 0; p < valid; p++)
                hp[p] = (const float *)vr[p] + (h0 + h) * HS;
            cpu_attn_mix(ctx->isa, sc + h * P, (const float *const *)hp, valid, HS,
                         out + (h0 + h) * HS);
        }
    }
}

/* Scratch floats per thread of attn_decode. */
static size_t attn_decode_floats(size_t P, size_t NH) { return 6 * P + NH * P + 16; }

static double task_cost(const orch_seq_input *s) {
    return (double)s->n_tokens * ((double)s->start_pos + s->n_tokens);
}

/* One chunk = one (sequence, group of heads) task, taken most expensive
 * first: f->head_groups groups of consecutive heads per sequence. */
static void attn_chunk(void *arg, size_t c, int tid) {
    const fwd_state *f = arg;
    const uint32_t NH = f->ctx->NH, G = f->head_groups;
    const uint32_t si = f->order[c / G], g = (uint32_t)(c % G);
    const uint32_t h0 = (uint32_t)((uint64_t)NH * g / G);
    const uint32_t h1 = (uint32_t)((uint64_t)NH * (g + 1) / G);
    float *scratch = f->ctx->inf.att + (size_t)tid * f->ctx->inf.att_per_thread;
    if (h0 >= h1) return;
    if (engine_batch_seq(f->batch, si)->n_tokens < ATTN_GEMM_MIN) {
        attn_decode(f, si, h0, h1, scratch);
        return;
    }
    for (uint32_t h = h0; h < h1; h++) attn_task(f, si, h, scratch);
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

/* One linear layer: on the int8 kernel when given its packed int8 matrix
 * (weights=int8, at most skinny_max rows), else cpu_linear_forward. */
static void linear(orch_engine_ctx *ctx, const cpu_linear_fwd *op, const uint8_t *q8w) {
    if (q8w && (uint32_t)op->R <= ctx->skinny_max)
        cpu_q8_linear(ctx, op, q8w);
    else
        cpu_linear_forward(ctx, op);
}

int32_t cpu_infer_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                          float *logits, uint64_t logits_cap) {
    uint64_t n_tok = 0, n_rows = 0;
    int32_t st = validate(ctx, batch, logits, logits_cap, &n_tok, &n_rows);
    if (st != ORCH_OK) return st;
    const size_t N = (size_t)n_tok, R = (size_t)n_rows;
    const size_t C = ctx->C, M = ctx->M, HS = ctx->HS;

    size_t att = 1;
    int any_gemm = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        size_t P = (size_t)s->start_pos + s->n_tokens;
        /* gather + scores, or 2 pointers (4 floats' room) + a score each */
        size_t need = s->n_tokens >= ATTN_GEMM_MIN
                          ? 2 * P * HS + (size_t)ATTN_ROW_BLOCK * P
                          : attn_decode_floats(P, ctx->NH);
        if (need > att) att = need;
        if (s->n_tokens >= ATTN_GEMM_MIN) any_gemm = 1;
    }
    /* Heads per attention task: one when a sequence attends with sgemm
     * (long tasks), else groups of heads so that decoding tasks read whole
     * K/V rows, with about 4 tasks per thread. The grouping changes no bits. */
    uint32_t head_groups = ctx->NH;
    if (!any_gemm && batch->n_seqs > 0) {
        const uint32_t want = (uint32_t)(4 * (ctx->threads > 0 ? ctx->threads : 1));
        head_groups = (want + batch->n_seqs - 1) / batch->n_seqs;
        if (head_groups > ctx->NH) head_groups = ctx->NH;
        if (head_groups < 1) head_groups = 1;
    }
    if ((st = scratch_ensure(ctx, N, R, att)) != ORCH_OK) return st;
    const int skinny_layers = N <= ctx->skinny_max;
    const int skinny_head = R > 0 && R <= ctx->skinny_max;
    const int q8 = ctx->weights == CPU_WEIGHTS_INT8;
    if (skinny_layers || skinny_head) {
        /* Rows of the int8 products: all N tokens, or the R logits rows (<= N). */
        st = q8 ? cpu_q8_ensure(ctx, skinny_layers ? N : R) : packed_ensure(ctx);
        if (st != ORCH_OK) return st;
    }

    /* Per-token tables (token ids, positions, first row of each sequence),
     * and the attention tasks' order. */
    cpu_lora_batch lb; /* the sequences' adapters (ABI 1.4) */
    if ((st = cpu_lora_batch_begin(ctx, batch, &lb)) != ORCH_OK) return st;
    uint32_t *tok0 = malloc(batch->n_seqs * sizeof(uint32_t));
    uint32_t *order = malloc(batch->n_seqs * sizeof(uint32_t));
    task_key *keys = malloc(batch->n_seqs * sizeof(task_key));
    int32_t *toks = malloc(N * sizeof(int32_t));
    uint32_t *pos = malloc(N * sizeof(uint32_t));
    if (!tok0 || !order || !keys || !toks || !pos) {
        cpu_lora_batch_end(&lb);
        free(tok0);
        free(order);
        free(keys);
        free(toks);
        free(pos);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "infer_forward: out of memory");
    }
    size_t r = 0, row = 0;
    for (uint32_t i = 0; i < batch->n_seqs; i++) {
        const orch_seq_input *s = engine_batch_seq(batch, i);
        tok0[i] = (uint32_t)r;
        keys[i] = (task_key){ task_cost(s), i };
        for (uint32_t k = 0; k < s->n_tokens; k++, r++) {
            toks[r] = s->tokens[k];
            pos[r] = s->start_pos + k;
            if (s->logits_mode == ORCH_LOGITS_ALL ||
                (s->logits_mode == ORCH_LOGITS_LAST && k + 1 == s->n_tokens))
                ctx->inf.row_index[row++] = (int32_t)r;
        }
    }
    const engine_kv_view kv = cpu_kv_view(ctx);
    engine_kv_mark_written(batch, &kv);
    qsort(keys, batch->n_seqs, sizeof *keys, by_cost_desc);
    for (uint32_t i = 0; i < batch->n_seqs; i++) order[i] = keys[i].seq;
    free(keys);

    const size_t row_chunks = cpu_pool_chunks(ctx->pool, N, 4, ROW_CHUNKS);
    fwd_state f = { ctx, batch, tok0, toks, pos, N, 0, row_chunks, order, head_groups };
    cpu_infer_scratch *sc = &ctx->inf;
    cpu_pool_for(ctx->pool, row_chunks, embed_chunk, &f);
    for (uint32_t l = 0; l < ctx->L; l++) {
        const cpu_layer_view *w = &ctx->pv.layer[l];
        float *const *pk =
            skinny_layers && !q8 && ctx->packed_layer ? ctx->packed_layer + l * 4 : NULL;
        uint8_t *const *qk = skinny_layers && q8 ? ctx->q8_layer + l * 4 : NULL;
        f.layer = l;
        rows_ln_job lj = { ctx, sc->x, sc->ln, NULL, N, w->ln1_w, w->ln1_b, row_chunks };
        cpu_pool_for(ctx->pool, row_chunks, rows_ln_chunk, &lj);
        cpu_linear_fwd op = { .R = (int)N,
                              .N = (int)(3 * C),
                              .K = (int)C,
                              .in = sc->ln,
                              .ldin = (int)C,
                              .W = w->qkv_w,
                              .packed = pk ? pk[0] : NULL,
                              .bias = w->qkv_b,
                              .out = sc->qkv,
                              .ldout = (int)(3 * C) };
        linear(ctx, &op, qk ? qk[0] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_ATTN_QKV, sc->ln, C, sc->qkv,
                               3 * C);
        cpu_pool_for(ctx->pool, (size_t)batch->n_seqs * head_groups, attn_chunk, &f);
        op = (cpu_linear_fwd){ .R = (int)N,
                               .N = (int)C,
                               .K = (int)C,
                               .in = sc->atty,
                               .ldin = (int)C,
                               .W = w->ap_w,
                               .packed = pk ? pk[1] : NULL,
                               .bias = w->ap_b,
                               .resid = sc->x,
                               .ldresid = (int)C,
                               .out = sc->x,
                               .ldout = (int)C };
        linear(ctx, &op, qk ? qk[1] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_ATTN_OUT, sc->atty, C, sc->x,
                               C);
        lj = (rows_ln_job){ ctx, sc->x, sc->ln, NULL, N, w->ln2_w, w->ln2_b, row_chunks };
        cpu_pool_for(ctx->pool, row_chunks, rows_ln_chunk, &lj);
        op = (cpu_linear_fwd){ .R = (int)N,
                               .N = (int)M,
                               .K = (int)C,
                               .in = sc->ln,
                               .ldin = (int)C,
                               .W = w->fc_w,
                               .packed = pk ? pk[2] : NULL,
                               .bias = w->fc_b,
                               .out = sc->fc,
                               .ldout = (int)M,
                               .gelu_inplace = !(lb.targets & ORCH_LORA_TARGET_MLP_UP) };
        linear(ctx, &op, qk ? qk[2] : NULL);
        if (cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_MLP_UP, sc->ln, C,
                                   sc->fc, M)) /* GELU after the adapters' term */
            cpu_lora_gelu_rows(ctx, sc->fc, N, M);
        op = (cpu_linear_fwd){ .R = (int)N,
                               .N = (int)C,
                               .K = (int)M,
                               .in = sc->fc,
                               .ldin = (int)M,
                               .W = w->mp_w,
                               .packed = pk ? pk[3] : NULL,
                               .bias = w->mp_b,
                               .resid = sc->x,
                               .ldresid = (int)C,
                               .out = sc->x,
                               .ldout = (int)C };
        linear(ctx, &op, qk ? qk[3] : NULL);
        cpu_lora_batch_forward(ctx, &lb, l, ORCH_LORA_TARGET_MLP_DOWN, sc->fc, M, sc->x,
                               C);
    }
    if (R > 0) {
        rows_ln_job lj = { ctx,
                           sc->x,
                           sc->rows,
                           sc->row_index,
                           R,
                           ctx->pv.lnf_w,
                           ctx->pv.lnf_b,
                           cpu_pool_chunks(ctx->pool, R, 4, ROW_CHUNKS) };
        cpu_pool_for(ctx->pool, lj.chunks, rows_ln_chunk, &lj);
        cpu_linear_fwd op = { .R = (int)R,
                              .N = (int)ctx->V,
                              .K = (int)C,
                              .in = sc->rows,
                              .ldin = (int)C,
                              .W = ctx->pv.wte,
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
    return ORCH_OK;
}
