/*
 * route_proxy.c - libcurl multi forwarding for `orch route` (see
 * route_proxy.h).
 */
#include "orchestrator/route/route_proxy.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "orchestrator/core/util.h"

struct route_proxy {
    CURLM *multi;
    pthread_t thread;
    pthread_mutex_t mu;
    route_xfer *pending; /* submitted, not yet added (LIFO, order kept below) */
    route_xfer *active;  /* added to the multi handle */
    int stopping, n_cancel, n_unpause, started; /* started: the thread runs */
    long connect_ms;
    void (*tick)(void *arg);
    void *tick_arg;
};

static const char *const pass[] = { "content-type:", "retry-after:", "www-authenticate:",
                                    "allow:", "cache-control:" };

static size_t on_header(char *p, size_t sz, size_t n, void *arg) {
    route_xfer *x = arg;
    size_t len = sz * n;
    if (len <= 2 && (len == 0 || p[0] == '\r' || p[0] == '\n')) { /* end of a head */
        long code = 0;
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
        if (code >= 200 && !x->head_done) {
            x->head_done = 1;
            x->on_head(x, code, x->hdrs.p ? x->hdrs.p : "");
        }
        x->hdrs.len = 0;
        if (x->hdrs.p) x->hdrs.p[0] = '\0';
        return len;
    }
    if (x->head_done) return len; /* trailers */
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        size_t k = strlen(pass[i]);
        if (len > k && strncasecmp(p, pass[i], k) == 0) {
            size_t e = len;
            while (e > 0 && (p[e - 1] == '\r' || p[e - 1] == '\n')) e--;
            strbuf_put(&x->hdrs, p, e);
            strbuf_puts(&x->hdrs, "\n");
        }
    }
    return len;
}

static size_t on_write(char *p, size_t sz, size_t n, void *arg) {
    route_xfer *x = arg;
    if (atomic_load(&x->cancel)) return 0;
    if (!x->head_done) { /* a body without a head (HTTP/0.9): refuse */
        return 0;
    }
    int rc = x->on_data(x, p, sz * n);
    if (rc == 1) {
        x->paused = 1;
        return CURL_WRITEFUNC_PAUSE;
    }
    return rc == 0 ? sz * n : 0;
}

route_proxy *route_proxy_create(double connect_timeout_s, void (*tick)(void *arg),
                                void *tick_arg, char *err, size_t err_cap) {
    route_proxy *p = util_calloc(1, sizeof *p);
    if (!p || !(p->multi = curl_multi_init())) {
        free(p);
        util_set_err(err, err_cap, "route: cannot create the libcurl multi handle");
        return NULL;
    }
    p->connect_ms = (long)(connect_timeout_s * 1000);
    p->tick = tick;
    p->tick_arg = tick_arg;
    if (p->connect_ms <= 0) p->connect_ms = 2000;
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

/* Remove x from the active list (proxy thread). */
static void unlink_active(route_proxy *p, route_xfer *x) {
    pthread_mutex_lock(&p->mu);
    for (route_xfer **pp = &p->active; *pp; pp = &(*pp)->next)
        if (*pp == x) {
            *pp = x->next;
            break;
        }
    pthread_mutex_unlock(&p->mu);
}

static void finish(route_proxy *p, route_xfer *x, CURLcode rc) {
    curl_multi_remove_handle(p->multi, x->easy);
    curl_easy_cleanup(x->easy);
    x->easy = NULL;
    unlink_active(p, x);
    strbuf_free(&x->hdrs);
    int cancelled = atomic_load(&x->cancel);
    if (rc == CURLE_OK && !cancelled)
        x->on_done(x, 1, NULL);
    else
        x->on_done(x, 0, cancelled ? "cancelled" : curl_easy_strerror(rc));
}

static void start_one(route_proxy *p, route_xfer *x) {
    CURL *h = curl_easy_init();
    x->easy = h;
    x->head_done = 0;
    x->paused = 0;
    atomic_store(&x->unpause, 0);
    x->hdrs = (strbuf){ 0 };
    if (!h) {
        x->on_done(x, 0, "out of memory (libcurl)");
        return;
    }
    curl_easy_setopt(h, CURLOPT_URL, x->url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->body_len);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, p->connect_ms);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (x->timeout_s > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(x->timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_PRIVATE, x);
    pthread_mutex_lock(&p->mu);
    x->next = p->active;
    p->active = x;
    pthread_mutex_unlock(&p->mu);
    if (curl_multi_add_handle(p->multi, h) != CURLM_OK) finish(p, x, CURLE_FAILED_INIT);
}

static void *proxy_main(void *arg) {
    route_proxy *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        route_xfer *batch = p->pending;
        p->pending = NULL;
        int stopping = p->stopping, cancels = p->n_cancel, unpauses = p->n_unpause;
        p->n_cancel = p->n_unpause = 0;
        pthread_mutex_unlock(&p->mu);
        /* submission order: the pending list is LIFO */
        route_xfer *rev = NULL;
        while (batch) {
            route_xfer *nx = batch->next;
            batch->next = rev;
            rev = batch;
            batch = nx;
        }
        while (rev) {
            route_xfer *nx = rev->next;
            if (stopping) {
                atomic_store(&rev->cancel, 1);
                rev->on_done(rev, 0, "cancelled");
            } else {
                start_one(p, rev);
            }
            rev = nx;
        }
        if (cancels || stopping) { /* cancelled transfers end now */
            for (;;) {
                route_xfer *c = NULL;
                pthread_mutex_lock(&p->mu);
                for (route_xfer *x = p->active; x; x = x->next)
                    if (stopping || atomic_load(&x->cancel)) {
                        atomic_store(&x->cancel, 1);
                        c = x;
                        break;
                    }
                pthread_mutex_unlock(&p->mu);
                if (!c) break;
                finish(p, c, CURLE_ABORTED_BY_CALLBACK);
            }
        }
        if (stopping) break;
        if (unpauses) { /* paused transfers whose reader caught up */
            for (;;) {
                route_xfer *u = NULL;
                pthread_mutex_lock(&p->mu);
                for (route_xfer *x = p->active; x; x = x->next)
                    if (x->paused && atomic_exchange(&x->unpause, 0)) {
                        u = x;
                        break;
                    }
                pthread_mutex_unlock(&p->mu);
                if (!u) break;
                u->paused = 0;
                /* may deliver the held piece at once (on_data may pause again) */
                curl_easy_pause(u->easy, CURLPAUSE_CONT);
            }
        }
        int running = 0;
        curl_multi_perform(p->multi, &running);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(p->multi, &left)))
            if (m->msg == CURLMSG_DONE) {
                route_xfer *x = NULL;
                curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
                if (x) finish(p, x, m->data.result);
            }
        if (p->tick) p->tick(p->tick_arg);
        curl_multi_poll(p->multi, NULL, 0, 200, NULL);
    }
    return NULL;
}

int route_proxy_submit(route_proxy *p, route_xfer *x) {
    atomic_store(&x->cancel, 0);
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    if (!p->started) {
        if (util_thread_start_nosignals(&p->thread, proxy_main, p) != 0) {
            pthread_mutex_unlock(&p->mu);
            return -1;
        }
        p->started = 1;
    }
    x->next = p->pending;
    p->pending = x;
    pthread_mutex_unlock(&p->mu);
    curl_multi_wakeup(p->multi);
    return 0;
}

void route_proxy_resume(route_proxy *p, route_xfer *x) {
    atomic_store(&x->unpause, 1);
    pthread_mutex_lock(&p->mu);
    p->n_unpause++;
    pthread_mutex_unlock(&p->mu);
    curl_multi_wakeup(p->multi);
}

void route_proxy_cancel(route_proxy *p, route_xfer *x) {
    atomic_store(&x->cancel, 1);
    pthread_mutex_lock(&p->mu);
    p->n_cancel++;
    pthread_mutex_unlock(&p->mu);
    curl_multi_wakeup(p->multi);
}

void route_proxy_destroy(route_proxy *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    int started = p->started;
    pthread_mutex_unlock(&p->mu);
    if (started) {
        curl_multi_wakeup(p->multi);
        pthread_join(p->thread, NULL);
    }
    curl_multi_cleanup(p->multi);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
