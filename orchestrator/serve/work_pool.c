/*
 * work_pool.c - a FIFO of intrusive jobs served by a few threads. See
 * work_pool.h.
 */
#include "orchestrator/serve/work_pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "orchestrator/core/util.h"

struct work_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    work_item *head, *tail;
    int stopping;
    pthread_t *threads;
    uint32_t n_threads;
};

static void *worker_main(void *arg) {
    work_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->stopping) pthread_cond_wait(&p->cv, &p->mu);
        work_item *it = p->head;
        if (it) {
            p->head = it->next;
            if (!p->head) p->tail = NULL;
        }
        pthread_mutex_unlock(&p->mu);
        if (!it) return NULL; /* stopping and nothing left */
        it->next = NULL;
        it->fn(it);
    }
}

work_pool *work_pool_create(uint32_t threads) {
    if (threads == 0) threads = 1;
    work_pool *p = util_calloc(1, sizeof *p);
    if (!p) return NULL;
    p->threads = util_calloc(threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (uint32_t i = 0; i < threads; i++) {
        if (util_thread_start_nosignals(&p->threads[i], worker_main, p) != 0) break;
        p->n_threads++;
    }
    if (p->n_threads == 0) {
        work_pool_destroy(p);
        return NULL;
    }
    return p;
}

int work_pool_submit(work_pool *p, work_item *item) {
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    item->next = NULL;
    if (p->tail)
        p->tail->next = item;
    else
        p->head = item;
    p->tail = item;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

void work_pool_destroy(work_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}
