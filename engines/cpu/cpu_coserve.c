/*
 * cpu_coserve.c - coserve_forward (see cpu_coserve.h): validation, the
 * inference pass on a helper thread, the baton between the two passes and
 * the pairing of their products.
 *
 * The baton: `turn` names the pass that may run. The inference pass (the
 * rider) gets it first; at each product it posts the product and gives the
 * baton to the fine-tuning pass (the driver), which either pairs it with
 * its own product of the same weight (then hands the baton back and waits
 * for the rider's next product or its end) or runs its own product alone
 * and goes on, the rider still waiting. When the driver is done it gives
 * the baton back for good and the rider finishes alone.
 */
#include "engines/cpu/cpu_coserve.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engines/cpu/cpu_llama.h"
#include "engines/cpu/cpu_llama_infer.h"
#include "engines/cpu/cpu_lora.h"

enum { TURN_RIDER, TURN_DRIVER };
enum { RIDER_RUNNING, RIDER_POSTED, RIDER_DONE };

struct cpu_coserve {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int turn, rider_state, driver_done, handled;
    const cpu_linear_fwd *posted; /* the rider's waiting product */
    uint64_t paired;              /* products shared by the two passes */
    /* the inference pass */
    orch_engine_ctx *ctx;
    const orch_infer_batch *batch;
    float *logits;
    uint64_t logits_cap;
    int32_t status;
};

/* Set on the rider's thread. */
static _Thread_local int is_rider;

static void give_turn(struct cpu_coserve *cs, int to) {
    cs->turn = to;
    pthread_cond_broadcast(&cs->cv);
}

static void wait_turn(struct cpu_coserve *cs, int mine) {
    while (cs->turn != mine) pthread_cond_wait(&cs->cv, &cs->mu);
}

int cpu_coserve_linear(orch_engine_ctx *ctx, const cpu_linear_fwd *op) {
    struct cpu_coserve *cs = ctx->coserve;
    int done = 0;
    pthread_mutex_lock(&cs->mu);
    if (is_rider) {
        if (!cs->driver_done) {
            cs->posted = op;
            cs->handled = 0;
            cs->rider_state = RIDER_POSTED;
            give_turn(cs, TURN_DRIVER);
            wait_turn(cs, TURN_RIDER);
            done = cs->handled;
            cs->posted = NULL;
            cs->rider_state = RIDER_RUNNING;
        }
    } else if (cs->rider_state == RIDER_POSTED &&
               cpu_linear_forward_pair_ok(cs->posted, op)) {
        const cpu_linear_fwd *r = cs->posted;
        pthread_mutex_unlock(&cs->mu); /* the rider waits for the baton */
        cpu_linear_forward_pair(ctx, r, op);
        pthread_mutex_lock(&cs->mu);
        cs->handled = 1;
        cs->paired++;
        give_turn(cs, TURN_RIDER);
        wait_turn(cs, TURN_DRIVER); /* its next product, or its end */
        done = 1;
    }
    pthread_mutex_unlock(&cs->mu);
    return done;
}

static void *rider_main(void *arg) {
    struct cpu_coserve *cs = arg;
    is_rider = 1;
    orch_engine_ctx *ctx = cs->ctx;
    pthread_mutex_lock(&cs->mu);
    wait_turn(cs, TURN_RIDER);
    pthread_mutex_unlock(&cs->mu);
    const int32_t st =
        ctx->arch == ORCH_ARCH_LLAMA
            ? cpu_llama_infer_forward(ctx, cs->batch, cs->logits, cs->logits_cap)
            : cpu_infer_forward(ctx, cs->batch, cs->logits, cs->logits_cap);
    pthread_mutex_lock(&cs->mu);
    cs->status = st;
    cs->rider_state = RIDER_DONE;
    give_turn(cs, TURN_DRIVER);
    pthread_mutex_unlock(&cs->mu);
    return NULL;
}

/* Micro-batch i of the caller's array (ft_stride bytes apart). */
static const orch_finetune_batch *ft_at(const orch_finetune_batch *ft, uint32_t stride,
                                        uint32_t i) {
    return (const orch_finetune_batch *)(const void *)((const char *)ft +
                                                       (size_t)stride * i);
}

static int32_t run_finetune(orch_engine_ctx *ctx, cpu_lora *lo,
                            const orch_finetune_batch *f, float *loss) {
    ctx->lora_cur = lo;
    const int32_t st =
        ctx->arch == ORCH_ARCH_LLAMA
            ? cpu_llama_forward_backward(ctx, f->tokens, f->targets, f->batch, f->seq_len,
                                         f->grad_scale, 1, loss, NULL)
            : cpu_train_forward_backward(ctx, f->tokens, f->targets, f->batch, f->seq_len,
                                         f->grad_scale, 1, loss, NULL);
    ctx->lora_cur = NULL;
    return st;
}

int32_t cpu_coserve_check_ft(orch_engine_ctx *ctx, const char *fn,
                             const orch_finetune_batch *f, cpu_lora **out_lo) {
    int32_t st = engine_check_ft_batch(fn, f, &ctx->train_lim, NULL, ENGINE_ERRBUF(ctx));
    if (st == ORCH_OK && !(*out_lo = cpu_lora_find(ctx, fn, f->adapter_id)))
        st = ORCH_ERR_INVALID_ARGUMENT;
    return st;
}

int32_t cpu_coserve_check_infer(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                                float *logits, uint64_t logits_cap, int *out_infer) {
    const int infer = batch && (batch->struct_size < offsetof(orch_infer_batch, n_seqs) +
                                                         sizeof batch->n_seqs ||
                                batch->n_seqs > 0);
    *out_infer = infer;
    if (!infer) return ORCH_OK;
    uint64_t nt, nr;
    const engine_kv_view kv = cpu_kv_view(ctx);
    return engine_infer_check_lora(batch, logits, logits_cap, ctx->V, ctx->T,
                                   ctx->max_batch_tokens,
                                   "engine option max_batch_tokens", &kv, cpu_lora_known,
                                   ctx, &nt, &nr, ENGINE_ERRBUF(ctx));
}

/* The micro-batches of one coserve_forward call, run one after the other
 * (the driver of cpu_coserve_run). */
typedef struct ft_pass {
    cpu_lora **los;
    const orch_finetune_batch *ft;
    uint32_t stride, n;
    float *losses;
} ft_pass;

static int32_t ft_pass_run(orch_engine_ctx *ctx, void *arg) {
    const ft_pass *p = arg;
    int32_t st = ORCH_OK;
    for (uint32_t i = 0; st == ORCH_OK && i < p->n; i++)
        st = run_finetune(ctx, p->los[i], ft_at(p->ft, p->stride, i), &p->losses[i]);
    return st;
}

int32_t cpu_coserve_forward(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                            float *logits, uint64_t logits_cap,
                            const orch_finetune_batch *ft, uint32_t n_finetune,
                            uint32_t ft_stride, float *out_losses) {
    /* ---- validation: nothing runs before all of it passes ---- */
    int32_t st0 = engine_check_coserve_args(ft, n_finetune, ft_stride, out_losses,
                                            ENGINE_ERRBUF(ctx));
    if (st0 != ORCH_OK) return st0;
    cpu_lora **los = NULL;
    if (n_finetune > 0 && !(los = calloc(n_finetune, sizeof *los)))
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "coserve_forward: out of memory");
    for (uint32_t i = 0; i < n_finetune; i++) {
        const orch_finetune_batch *f = ft_at(ft, ft_stride, i);
        char fn[64];
        snprintf(fn, sizeof fn, "coserve_forward: ft[%u]", i);
        const int32_t st = cpu_coserve_check_ft(ctx, fn, f, &los[i]);
        if (st != ORCH_OK) {
            free(los);
            return st;
        }
    }
    int infer = 0;
    const int32_t cst = cpu_coserve_check_infer(ctx, batch, logits, logits_cap, &infer);
    if (cst != ORCH_OK) {
        free(los);
        return cst;
    }

    /* ---- the passes ---- */
    ft_pass fp = { los, ft, ft_stride, n_finetune, NULL };
    int32_t st = ORCH_OK;
    if (!infer || n_finetune == 0) { /* one pass alone: nothing to share */
        if (infer)
            st = ctx->arch == ORCH_ARCH_LLAMA
                     ? cpu_llama_infer_forward(ctx, batch, logits, logits_cap)
                     : cpu_infer_forward(ctx, batch, logits, logits_cap);
        fp.losses = out_losses;
        if (st == ORCH_OK) st = ft_pass_run(ctx, &fp);
        free(los);
        return st;
    }
    float *losses = malloc(n_finetune * sizeof(float));
    if (!losses) {
        free(los);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY, "coserve_forward: out of memory");
    }
    fp.losses = losses;
    st = cpu_coserve_run(ctx, batch, logits, logits_cap, ft_pass_run, &fp);
    if (st == ORCH_OK) memcpy(out_losses, losses, n_finetune * sizeof(float));
    free(losses);
    free(los);
    return st;
}

int32_t cpu_coserve_run(orch_engine_ctx *ctx, const orch_infer_batch *batch,
                        float *logits, uint64_t logits_cap, cpu_coserve_driver_fn driver,
                        void *arg) {
    int32_t st = ORCH_OK;
    struct cpu_coserve cs;
    memset(&cs, 0, sizeof cs);
    pthread_mutex_init(&cs.mu, NULL);
    pthread_cond_init(&cs.cv, NULL);
    cs.turn = TURN_RIDER;
    cs.rider_state = RIDER_RUNNING;
    cs.ctx = ctx;
    cs.batch = batch;
    cs.logits = logits;
    cs.logits_cap = logits_cap;
    ctx->coserve = &cs;
    pthread_t th;
    if (pthread_create(&th, NULL, rider_main, &cs) != 0) {
        ctx->coserve = NULL;
        pthread_mutex_destroy(&cs.mu);
        pthread_cond_destroy(&cs.cv);
        return cpu_fail(ctx, ORCH_ERR_OUT_OF_MEMORY,
                        "coserve: cannot start the inference thread");
    }
    pthread_mutex_lock(&cs.mu);
    wait_turn(&cs, TURN_DRIVER); /* the rider's first product, or its end */
    pthread_mutex_unlock(&cs.mu);
    st = driver(ctx, arg);
    pthread_mutex_lock(&cs.mu);
    cs.driver_done = 1;
    if (cs.rider_state != RIDER_DONE) give_turn(&cs, TURN_RIDER); /* finish alone */
    pthread_mutex_unlock(&cs.mu);
    pthread_join(th, NULL);
    ctx->coserve = NULL;
    ctx->coserve_paired += cs.paired;
    pthread_mutex_destroy(&cs.mu);
    pthread_cond_destroy(&cs.cv);
    if (st == ORCH_OK) st = cs.status;
    return st;
}
