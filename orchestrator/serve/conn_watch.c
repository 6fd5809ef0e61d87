/*
 * conn_watch.c - EPOLLRDHUP watching of client sockets with generation-checked
 * slots. See conn_watch.h.
 */
#include "orchestrator/serve/conn_watch.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "orchestrator/core/util.h"

struct conn_watch_conn {
    uint32_t slot;
    int fd;
    void *req; /* request waiting on the connection (under mu) */
};

typedef struct watch_slot {
    conn_watch_conn *c;
    uint32_t gen;
    uint32_t next_free;
} watch_slot;

struct conn_watch {
    int epfd;
    pthread_mutex_t mu;
    watch_slot *slots;
    uint32_t n_slots, free_head; /* free_head UINT32_MAX = none */
};

conn_watch *conn_watch_create(void) {
    conn_watch *w = util_calloc(1, sizeof *w);
    if (!w) return NULL;
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->epfd < 0) {
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    w->free_head = UINT32_MAX;
    return w;
}

void conn_watch_free(conn_watch *w) {
    if (!w) return;
    close(w->epfd);
    pthread_mutex_destroy(&w->mu);
    free(w->slots);
    free(w);
}

/* Double the slot table (under mu). */
static int grow_slots(conn_watch *w) {
    uint32_t n = w->n_slots ? w->n_slots * 2 : 64;
    watch_slot *ns = realloc(w->slots, n * sizeof *ns);
    if (!ns) return -1;
    for (uint32_t i = w->n_slots; i < n; i++) {
        ns[i].c = NULL;
        ns[i].gen = 0;
        ns[i].next_free = i + 1 < n ? i + 1 : UINT32_MAX;
    }
    w->slots = ns;
    w->free_head = w->n_slots;
    w->n_slots = n;
    return 0;
}

conn_watch_conn *conn_watch_add(conn_watch *w, int fd) {
    conn_watch_conn *c = util_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    pthread_mutex_lock(&w->mu);
    if (w->free_head == UINT32_MAX && grow_slots(w) != 0) {
        pthread_mutex_unlock(&w->mu);
        free(c);
        return NULL;
    }
    uint32_t slot = w->free_head;
    w->free_head = w->slots[slot].next_free;
    w->slots[slot].c = c;
    w->slots[slot].gen++;
    c->slot = slot;
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = EPOLLRDHUP | EPOLLONESHOT;
    ev.data.u64 = ((uint64_t)w->slots[slot].gen << 32) | slot;
    pthread_mutex_unlock(&w->mu);
    (void)epoll_ctl(w->epfd, EPOLL_CTL_ADD, fd, &ev);
    return c;
}

void conn_watch_remove(conn_watch *w, conn_watch_conn *c) {
    if (!c) return;
    (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    pthread_mutex_lock(&w->mu);
    w->slots[c->slot].c = NULL;
    w->slots[c->slot].next_free = w->free_head;
    w->free_head = c->slot;
    pthread_mutex_unlock(&w->mu);
    free(c);
}

void conn_watch_set_request(conn_watch *w, conn_watch_conn *c, void *req) {
    pthread_mutex_lock(&w->mu);
    if (c) c->req = req;
    pthread_mutex_unlock(&w->mu);
}

void conn_watch_clear_request(conn_watch *w, conn_watch_conn *c, void *req) {
    pthread_mutex_lock(&w->mu);
    if (c && c->req == req) c->req = NULL;
    pthread_mutex_unlock(&w->mu);
}

void conn_watch_poll(conn_watch *w, conn_watch_gone_fn gone, void *arg) {
    struct epoll_event ev[64];
    int n = epoll_wait(w->epfd, ev, 64, 0);
    for (int i = 0; i < n; i++) {
        uint32_t slot = (uint32_t)ev[i].data.u64;
        uint32_t gen = (uint32_t)(ev[i].data.u64 >> 32);
        pthread_mutex_lock(&w->mu);
        if (slot < w->n_slots && w->slots[slot].gen == gen && w->slots[slot].c &&
            w->slots[slot].c->req)
            gone(w->slots[slot].c->req, arg);
        pthread_mutex_unlock(&w->mu);
    }
}
