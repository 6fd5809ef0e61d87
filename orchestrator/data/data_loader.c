/*
 * data_loader.c - seeded window sampling with a one-batch-ahead prefetch
 * thread, and the fixed validation set. See data_loader.h.
 */
#include "orchestrator/data/data_loader.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

/* ------------------------------------------------------------------------- */
/* RNG: the shared xoshiro256** (rng.h), plus hex for state.json            */
/* ------------------------------------------------------------------------- */
void data_rng_seed(data_rng *r, uint64_t seed) { rng_seed(r, seed); }

uint64_t data_rng_next(data_rng *r) { return rng_next(r); }

uint64_t data_rng_below(data_rng *r, uint64_t n) { return rng_below(r, n); }

void data_rng_to_hex(const data_rng *r, char out[65]) {
    for (int i = 0; i < 4; i++)
        snprintf(out + 16 * i, 17, "%016llx", (unsigned long long)r->s[i]);
}

int data_rng_from_hex(const char *hex, data_rng *r) {
    if (!hex || strlen(hex) != 64) return -1;
    data_rng tmp;
    for (int i = 0; i < 4; i++) {
        uint64_t v = 0;
        for (int j = 0; j < 16; j++) {
            char c = hex[16 * i + j];
            int d;
            if (c >= '0' && c <= '9')
                d = c - '0';
            else if (c >= 'a' && c <= 'f')
                d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                d = c - 'A' + 10;
            else
                return -1;
            v = (v << 4) | (uint64_t)d;
        }
        tmp.s[i] = v;
    }
    if (!(tmp.s[0] | tmp.s[1] | tmp.s[2] | tmp.s[3])) return -1; /* invalid */
    *r = tmp;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Loader                                                                     */
/* ------------------------------------------------------------------------- */
#define N_SLOTS 2

typedef struct slot {
    int32_t *tokens;
    int32_t *targets;
    data_rng rng_after; /* generator state after drawing this batch */
    int ready;          /* filled, not yet returned */
    int failed;
} slot;

struct data_loader {
    const dataset *ds;
    data_loader_opts o;
    uint64_t n_offsets; /* offsets are drawn from [0, n_offsets) */
    int32_t *window;    /* seq_len+1 scratch (synchronous mode) */
    slot slots[N_SLOTS];
    data_rng gen;      /* producer's generator */
    data_rng consumed; /* state after the last returned batch */
    unsigned head;     /* next slot the consumer takes */
    unsigned tail;     /* next slot the producer fills */
    int held;          /* consumer holds slot (head-1) */
    int stop;
    int thread_started;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Draw one batch into s using the generator g (producer side). */
static int fill_batch(data_loader *l, data_rng *g, slot *s, int32_t *window) {
    uint32_t B = l->o.micro_batch, T = l->o.seq_len;
    uint32_t world = l->o.world ? l->o.world : 1;
    for (uint32_t i = 0; i < world * B; i++) {
        uint64_t off = data_rng_below(g, l->n_offsets);
        uint32_t owner = i / B;
        if (owner != l->o.rank) continue;
        uint32_t row = i % B;
        if (dataset_read(l->ds, off, (uint64_t)T + 1, window) != 0) return -1;
        memcpy(s->tokens + (size_t)row * T, window, (size_t)T * sizeof *window);
        memcpy(s->targets + (size_t)row * T, window + 1, (size_t)T * sizeof *window);
    }
    s->rng_after = *g;
    return 0;
}

static void *producer_main(void *arg) {
    data_loader *l = arg;
    int32_t *window = malloc(((size_t)l->o.seq_len + 1) * sizeof *window);
    pthread_mutex_lock(&l->mu);
    for (;;) {
        /* Wait for a free slot: the one at tail that is neither ready nor
         * held by the consumer. */
        for (;;) {
            if (l->stop) break;
            slot *s = &l->slots[l->tail % N_SLOTS];
            int held_by_consumer =
                l->held && (l->tail % N_SLOTS) == ((l->head + N_SLOTS - 1) % N_SLOTS);
            if (!s->ready && !held_by_consumer) break;
            pthread_cond_wait(&l->cv, &l->mu);
        }
        if (l->stop) break;
        slot *s = &l->slots[l->tail % N_SLOTS];
        pthread_mutex_unlock(&l->mu);
        int rc = window ? fill_batch(l, &l->gen, s, window) : -1;
        pthread_mutex_lock(&l->mu);
        s->failed = rc != 0;
        s->ready = 1;
        l->tail++;
        pthread_cond_broadcast(&l->cv);
        if (rc != 0) break;
    }
    pthread_mutex_unlock(&l->mu);
    free(window);
    return NULL;
}

int data_loader_open(const dataset *ds, const data_loader_opts *o, const data_rng *start,
                     data_loader **out, char *err, size_t err_cap) {
    uint32_t world = o->world ? o->world : 1;
    if (o->micro_batch == 0 || o->seq_len == 0 || o->rank >= world) {
        util_set_err(err, err_cap, "data loader: bad options");
        return -1;
    }
    uint64_t total = dataset_total_tokens(ds);
    if (total < (uint64_t)o->seq_len + 1) {
        util_set_err(err, err_cap,
                     "training data has %llu tokens, fewer than seq_len+1 = %u",
                     (unsigned long long)total, o->seq_len + 1);
        return -1;
    }
    data_loader *l = util_calloc(1, sizeof *l);
    if (!l) goto oom;
    l->ds = ds;
    l->o = *o;
    l->o.world = world;
    l->n_offsets = total - o->seq_len; /* last window starts at total-T-1 */
    l->gen = *start;
    l->consumed = *start;
    size_t n = (size_t)o->micro_batch * o->seq_len;
    for (int i = 0; i < N_SLOTS; i++) {
        l->slots[i].tokens = malloc(n * sizeof(int32_t));
        l->slots[i].targets = malloc(n * sizeof(int32_t));
        if (!l->slots[i].tokens || !l->slots[i].targets) goto oom;
    }
    l->window = malloc(((size_t)o->seq_len + 1) * sizeof(int32_t));
    if (!l->window) goto oom;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (o->prefetch) {
        if (util_thread_start_nosignals(&l->thread, producer_main, l) != 0) {
            util_set_err(err, err_cap, "data loader: cannot start thread");
            pthread_mutex_destroy(&l->mu);
            pthread_cond_destroy(&l->cv);
            goto fail;
        }
        l->thread_started = 1;
    }
    *out = l;
    return 0;
oom:
    util_set_err(err, err_cap, "data loader: out of memory");
fail:
    if (l) {
        for (int i = 0; i < N_SLOTS; i++) {
            free(l->slots[i].tokens);
            free(l->slots[i].targets);
        }
        free(l->window);
        free(l);
    }
    return -1;
}

int data_loader_next(data_loader *l, const int32_t **tokens, const int32_t **targets,
                     char *err, size_t err_cap) {
    if (!l->thread_started) {
        slot *s = &l->slots[0];
        if (fill_batch(l, &l->gen, s, l->window) != 0) {
            util_set_err(err, err_cap, "data loader: dataset read failed");
            return -1;
        }
        l->consumed = s->rng_after;
        *tokens = s->tokens;
        *targets = s->targets;
        return 0;
    }
    pthread_mutex_lock(&l->mu);
    if (l->held) { /* give back the slot returned last time */
        l->held = 0;
        pthread_cond_broadcast(&l->cv);
    }
    slot *s = &l->slots[l->head % N_SLOTS];
    while (!s->ready) pthread_cond_wait(&l->cv, &l->mu);
    if (s->failed) {
        pthread_mutex_unlock(&l->mu);
        util_set_err(err, err_cap, "data loader: dataset read failed");
        return -1;
    }
    s->ready = 0;
    l->held = 1;
    l->head++;
    l->consumed = s->rng_after;
    pthread_mutex_unlock(&l->mu);
    *tokens = s->tokens;
    *targets = s->targets;
    return 0;
}

void data_loader_rng_state(const data_loader *l, data_rng *out) { *out = l->consumed; }

void data_loader_close(data_loader *l) {
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    for (int i = 0; i < N_SLOTS; i++) {
        free(l->slots[i].tokens);
        free(l->slots[i].targets);
    }
    free(l->window);
    free(l);
}

/* ------------------------------------------------------------------------- */
/* Validation set                                                             */
/* ------------------------------------------------------------------------- */
int data_eval_set_build(const dataset *ds, uint32_t n_batches, uint32_t micro_batch,
                        uint32_t seq_len, data_eval_set *out, char *err, size_t err_cap) {
    uint64_t total = dataset_total_tokens(ds);
    if (n_batches == 0 || micro_batch == 0 || seq_len == 0) {
        util_set_err(err, err_cap, "validation set: bad sizes");
        return -1;
    }
    if (total < (uint64_t)seq_len + 1) {
        util_set_err(err, err_cap,
                     "validation data has %llu tokens, fewer than seq_len+1 = "
                     "%u",
                     (unsigned long long)total, seq_len + 1);
        return -1;
    }
    size_t windows = (size_t)n_batches * micro_batch;
    size_t n = windows * seq_len;
    int32_t *tok = malloc(n * sizeof *tok);
    int32_t *tgt = malloc(n * sizeof *tgt);
    int32_t *win = malloc(((size_t)seq_len + 1) * sizeof *win);
    if (!tok || !tgt || !win) {
        free(tok);
        free(tgt);
        free(win);
        util_set_err(err, err_cap, "validation set: out of memory");
        return -1;
    }
    uint64_t last = total - seq_len - 1; /* largest start offset */
    for (size_t w = 0; w < windows; w++) {
        uint64_t off = windows > 1
                           ? (uint64_t)((double)last * (double)w / (double)(windows - 1))
                           : 0;
        if (off > last) off = last;
        if (dataset_read(ds, off, (uint64_t)seq_len + 1, win) != 0) {
            free(tok);
            free(tgt);
            free(win);
            util_set_err(err, err_cap, "validation set: dataset read failed");
            return -1;
        }
        memcpy(tok + w * seq_len, win, (size_t)seq_len * sizeof *win);
        memcpy(tgt + w * seq_len, win + 1, (size_t)seq_len * sizeof *win);
    }
    free(win);
    out->n_batches = n_batches;
    out->micro_batch = micro_batch;
    out->seq_len = seq_len;
    out->tokens = tok;
    out->targets = tgt;
    return 0;
}

void data_eval_set_free(data_eval_set *s) {
    if (!s) return;
    free(s->tokens);
    free(s->targets);
    s->tokens = s->targets = NULL;
}
