/*
 * route_workers.c - the worker set of `orch route` (see route_workers.h):
 * the table, the health thread (libcurl easy requests), picking with the
 * radix trees, the model union.
 */
#include "orchestrator/route/route_workers.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/util.h"
#include "orchestrator/route/radix_text.h"

struct route_worker {
    char url[ROUTE_URL_MAX];
    int up, removed, checking;
    uint32_t load, refs, fails;
    uint64_t requests;
    double next_check;
    radix_text *tree;
    char **model_ids, **model_json; /* n_models each */
    size_t n_models;
    int models_known; /* /v1/models answered (else: eligible for any model) */
    metrics_series *m_requests, *m_up, *m_load;
};

struct route_workers {
    route_workers_config cfg;
    char *auth_header; /* "Authorization: Bearer KEY" or NULL */
    pthread_mutex_t mu;
    route_worker **w;
    size_t n, cap;
    uint64_t rr, rng;
    pthread_t thread;
    int started;
    atomic_int stop;
    metrics_family *f_requests, *f_up, *f_load;
    metrics_series *m_ratio, *m_check_ok, *m_check_fail;
};

const char *route_worker_url(const route_worker *w) { return w->url; }

static void free_models(route_worker *w) {
    for (size_t i = 0; i < w->n_models; i++) {
        free(w->model_ids[i]);
        free(w->model_json[i]);
    }
    free(w->model_ids);
    free(w->model_json);
    w->model_ids = w->model_json = NULL;
    w->n_models = 0;
}

static void worker_free(route_worker *w) {
    radix_text_free(w->tree);
    free_models(w);
    free(w);
}

/* Drop a reference (lock held); frees a removed worker nobody uses. */
static void unref_locked(route_worker *w) {
    if (--w->refs == 0 && w->removed) worker_free(w);
}

int route_url_normalize(const char *url, char *out, char *err, size_t err_cap) {
    size_t n = url ? strlen(url) : 0;
    while (n && url[n - 1] == '/') n--;
    if (n < 8 || strncmp(url, "http://", 7) != 0) {
        util_set_err(err, err_cap, "worker URL '%s' must be http://HOST:PORT",
                     url ? url : "");
        return -1;
    }
    if (n >= ROUTE_URL_MAX) {
        util_set_err(err, err_cap, "worker URL is longer than %d bytes",
                     ROUTE_URL_MAX - 1);
        return -1;
    }
    for (size_t i = 7; i < n; i++) {
        unsigned char c = (unsigned char)url[i];
        if (c <= ' ' || c >= 127 || c == '/' || c == '?' || c == '#' || c == '@') {
            util_set_err(err, err_cap,
                         "worker URL '%.*s' must be http://HOST:PORT (no path, "
                         "user or spaces)",
                         (int)n, url);
            return -1;
        }
    }
    memcpy(out, url, n);
    out[n] = '\0';
    return 0;
}

route_workers *route_workers_create(const route_workers_config *c, char *err,
                                    size_t err_cap) {
    route_workers *s = util_calloc(1, sizeof *s);
    if (!s) {
        util_set_err(err, err_cap, "route: out of memory");
        return NULL;
    }
    s->cfg = *c;
    if (s->cfg.health_interval_s <= 0) s->cfg.health_interval_s = 1.0;
    if (s->cfg.backoff_max_s < s->cfg.health_interval_s)
        s->cfg.backoff_max_s = s->cfg.health_interval_s;
    if (s->cfg.health_timeout_s <= 0) s->cfg.health_timeout_s = 2.0;
    if (!s->cfg.max_tree_size) s->cfg.max_tree_size = (size_t)1 << 24;
    if (c->worker_auth && *c->worker_auth) {
        size_t n = strlen(c->worker_auth) + 32;
        s->auth_header = malloc(n);
        if (s->auth_header)
            snprintf(s->auth_header, n, "Authorization: %s", c->worker_auth);
    }
    pthread_mutex_init(&s->mu, NULL);
    s->rng = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull | 1u;
    static const char *const wl[1] = { "worker" };
    s->f_requests =
        metrics_counter(c->metrics, "orch_route_requests_total",
                        "Requests forwarded, by worker (retries count again).", 1, wl);
    s->f_up = metrics_gauge(c->metrics, "orch_route_worker_up",
                            "1 while the worker passes its health checks.", 1, wl);
    s->f_load = metrics_gauge(c->metrics, "orch_route_worker_load",
                              "Requests in flight on the worker.", 1, wl);
    static const double ratio_buckets[] = { 0.0, 0.1, 0.2, 0.3, 0.4, 0.5,
                                            0.6, 0.7, 0.8, 0.9, 0.99 };
    s->m_ratio = metrics_series_get(
        metrics_histogram(
            c->metrics, "orch_route_cache_match_ratio",
            "The chosen worker's radix-tree match over the request length, per pick.", 0,
            NULL, ratio_buckets, sizeof ratio_buckets / sizeof(double)),
        NULL);
    static const char *const rl[1] = { "result" };
    metrics_family *fc = metrics_counter(c->metrics, "orch_route_health_checks_total",
                                         "Worker health checks by result.", 1, rl);
    s->m_check_ok = metrics_series_get(fc, (const char *[]){ "ok" });
    s->m_check_fail = metrics_series_get(fc, (const char *[]){ "fail" });
    return s;
}

int route_workers_add(route_workers *s, const char *url, char *err, size_t err_cap) {
    char u[ROUTE_URL_MAX];
    if (route_url_normalize(url, u, err, err_cap) != 0) return -1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->w[i]->url, u) == 0) {
            pthread_mutex_unlock(&s->mu);
            return 1;
        }
    route_worker *w = util_calloc(1, sizeof *w);
    if (w) w->tree = radix_text_create();
    if (w && w->tree && s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        route_worker **nw = realloc(s->w, cap * sizeof *nw);
        if (nw) {
            s->w = nw;
            s->cap = cap;
        }
    }
    if (!w || !w->tree || s->n == s->cap) {
        pthread_mutex_unlock(&s->mu);
        if (w) worker_free(w);
        util_set_err(err, err_cap, "route: out of memory");
        return -1;
    }
    memcpy(w->url, u, sizeof u);
    w->refs = 1; /* the set's */
    const char *lv[1] = { w->url };
    w->m_requests = metrics_series_get(s->f_requests, lv);
    w->m_up = metrics_series_get(s->f_up, lv);
    w->m_load = metrics_series_get(s->f_load, lv);
    metrics_gauge_set(w->m_up, 0);
    metrics_gauge_set(w->m_load, 0);
    s->w[s->n++] = w;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int route_workers_remove(route_workers *s, const char *url) {
    char u[ROUTE_URL_MAX];
    if (route_url_normalize(url, u, NULL, 0) != 0) return -1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        route_worker *w = s->w[i];
        if (strcmp(w->url, u) != 0) continue;
        memmove(s->w + i, s->w + i + 1, (s->n - i - 1) * sizeof *s->w);
        s->n--;
        w->removed = 1;
        w->up = 0;
        metrics_gauge_set(w->m_up, 0);
        unref_locked(w);
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    pthread_mutex_unlock(&s->mu);
    return -1;
}

/* ---- health checks ------------------------------------------------------ */
static size_t collect(char *p, size_t sz, size_t n, void *arg) {
    strbuf *b = arg;
    strbuf_put(b, p, sz * n);
    return b->oom ? 0 : sz * n;
}

/* GET base+path; the status (0 on a transport error), the body in b. */
static long http_get(const route_workers *s, const char *base, const char *path,
                     strbuf *b) {
    char url[ROUTE_URL_MAX + 32];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *h = curl_easy_init();
    if (!h) return 0;
    struct curl_slist *hd = NULL;
    if (s->auth_header) hd = curl_slist_append(hd, s->auth_header);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(s->cfg.health_timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(s->cfg.health_timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    if (hd) curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    long code = 0;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    return code;
}

/* The models of a /v1/models body (ids and objects); -1 when unreadable. */
static int parse_models(const char *body, char ***ids, char ***objs, size_t *n) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
    if (!cJSON_IsArray(data)) {
        cJSON_Delete(root);
        return -1;
    }
    size_t cnt = (size_t)cJSON_GetArraySize(data), k = 0;
    *ids = calloc(cnt ? cnt : 1, sizeof(char *));
    *objs = calloc(cnt ? cnt : 1, sizeof(char *));
    const cJSON *m;
    cJSON_ArrayForEach(m, data) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
        if (!*ids || !*objs || !cJSON_IsString(id)) continue;
        (*ids)[k] = strdup(id->valuestring);
        (*objs)[k] = cJSON_PrintUnformatted(m);
        if ((*ids)[k] && (*objs)[k])
            k++;
        else {
            free((*ids)[k]);
            free((*objs)[k]);
        }
    }
    *n = k;
    cJSON_Delete(root);
    return *ids && *objs ? 0 : -1;
}

static void check_one(route_workers *s, route_worker *w) {
    strbuf b = { 0 };
    long st = http_get(s, w->url, "/health", &b);
    strbuf_free(&b);
    char **ids = NULL, **objs = NULL;
    size_t n = 0;
    int known = 0;
    if (st == 200) {
        strbuf mb = { 0 };
        if (http_get(s, w->url, "/v1/models", &mb) == 200 && mb.p &&
            parse_models(mb.p, &ids, &objs, &n) == 0)
            known = 1;
        strbuf_free(&mb);
    }
    double now = util_now();
    pthread_mutex_lock(&s->mu);
    w->checking = 0;
    if (st == 200) {
        if (known) {
            free_models(w);
            w->model_ids = ids;
            w->model_json = objs;
            w->n_models = n;
            ids = objs = NULL;
            n = 0;
        }
        w->models_known = known;
        w->up = !w->removed;
        w->fails = 0;
        w->next_check = now + s->cfg.health_interval_s;
    } else {
        w->up = 0;
        w->fails++;
        double wait = s->cfg.health_interval_s;
        for (uint32_t i = 1; i < w->fails && wait < s->cfg.backoff_max_s; i++) wait *= 2;
        if (wait > s->cfg.backoff_max_s) wait = s->cfg.backoff_max_s;
        w->next_check = now + wait;
    }
    metrics_gauge_set(w->m_up, w->up);
    unref_locked(w);
    pthread_mutex_unlock(&s->mu);
    metrics_counter_add(st == 200 ? s->m_check_ok : s->m_check_fail, 1);
    for (size_t i = 0; i < n; i++) {
        free(ids[i]);
        free(objs[i]);
    }
    free(ids);
    free(objs);
}

/* The next worker due for a check (referenced), or NULL. */
static route_worker *next_due(route_workers *s, int all) {
    double now = util_now();
    route_worker *due = NULL;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n && !due; i++) {
        route_worker *w = s->w[i];
        if (!w->checking && (all || w->next_check <= now)) {
            w->checking = 1;
            w->refs++;
            if (all) w->next_check = now + s->cfg.health_interval_s;
            due = w;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return due;
}

void route_workers_check_all(route_workers *s) {
    /* one pass: a checked worker is due again only after the interval */
    size_t n;
    pthread_mutex_lock(&s->mu);
    n = s->n;
    for (size_t i = 0; i < s->n; i++) s->w[i]->next_check = 0;
    pthread_mutex_unlock(&s->mu);
    for (size_t k = 0; k < n; k++) {
        route_worker *w = next_due(s, 0);
        if (!w) break;
        check_one(s, w);
    }
}

static void *health_main(void *arg) {
    route_workers *s = arg;
    while (!atomic_load(&s->stop)) {
        route_worker *w = next_due(s, 0);
        if (w) {
            check_one(s, w);
            continue;
        }
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int route_workers_start(route_workers *s) {
    if (util_thread_start_nosignals(&s->thread, health_main, s) != 0) return -1;
    s->started = 1;
    return 0;
}

void route_workers_destroy(route_workers *s) {
    if (!s) return;
    atomic_store(&s->stop, 1);
    if (s->started) pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        s->w[i]->removed = 1;
        unref_locked(s->w[i]);
    }
    s->n = 0;
    pthread_mutex_unlock(&s->mu);
    free(s->w);
    free(s->auth_header);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- picking ------------------------------------------------------------ */
static int serves(const route_worker *w, const char *model) {
    if (!w->models_known) return 1;
    for (size_t i = 0; i < w->n_models; i++)
        if (strcmp(w->model_ids[i], model) == 0) return 1;
    return 0;
}

route_worker *route_workers_pick(route_workers *s, const char *model, const char *text,
                                 size_t len, route_worker *const *tried, size_t n_tried,
                                 route_pick *pick, int *unknown_model) {
    if (unknown_model) *unknown_model = 0;
    pick->index = -1;
    pick->reason = ROUTE_WHY_POLICY;
    pick->match_ratio = 0;
    pthread_mutex_lock(&s->mu);
    route_candidate stack_c[16];
    route_candidate *c = s->n <= 16 ? stack_c : calloc(s->n, sizeof *c);
    if (!c) {
        pthread_mutex_unlock(&s->mu);
        return NULL;
    }
    int any_up = 0, any_serves = 0;
    for (size_t i = 0; i < s->n; i++) {
        any_up |= s->w[i]->up;
        if (model && s->w[i]->up && serves(s->w[i], model)) any_serves = 1;
    }
    if (model && any_up && !any_serves && unknown_model) *unknown_model = 1;
    for (size_t i = 0; i < s->n; i++) {
        route_worker *w = s->w[i];
        int ok = w->up && (!model || serves(w, model));
        for (size_t k = 0; k < n_tried && ok; k++)
            if (tried[k] == w) ok = 0;
        c[i].eligible = ok;
        c[i].load = w->load;
        c[i].match = ok ? radix_text_match(w->tree, text, len) : 0;
        c[i].tree_size = radix_text_size(w->tree);
    }
    route_worker *w = NULL;
    route_pick p = route_policy_pick(&s->cfg.policy, c, s->n, len, &s->rr, &s->rng);
    if (c != stack_c) free(c);
    *pick = p;
    if (p.index >= 0) {
        w = s->w[p.index];
        if (radix_text_insert(w->tree, text, len) == 0 &&
            radix_text_size(w->tree) > s->cfg.max_tree_size)
            radix_text_evict(w->tree, s->cfg.max_tree_size / 10 * 9);
        w->load++;
        w->refs++;
        w->requests++;
        metrics_gauge_set(w->m_load, w->load);
    }
    pthread_mutex_unlock(&s->mu);
    if (w) {
        metrics_counter_add(w->m_requests, 1);
        metrics_histogram_observe(s->m_ratio, p.match_ratio);
    }
    return w;
}

void route_workers_done(route_workers *s, route_worker *w, int failed) {
    if (!w) return;
    pthread_mutex_lock(&s->mu);
    w->load--;
    metrics_gauge_set(w->m_load, w->load);
    if (failed && w->up) {
        w->up = 0;
        w->fails++;
        w->next_check = util_now() + s->cfg.health_interval_s;
        metrics_gauge_set(w->m_up, 0);
    }
    unref_locked(w);
    pthread_mutex_unlock(&s->mu);
}

uint32_t route_workers_up(route_workers *s) {
    uint32_t n = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) n += s->w[i]->up != 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---- listings ----------------------------------------------------------- */
void route_workers_models_json(route_workers *s, strbuf *b) {
    strbuf_puts(b, "{\"object\":\"list\",\"data\":[");
    int first = 1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        const route_worker *w = s->w[i];
        if (!w->up) continue;
        for (size_t m = 0; m < w->n_models; m++) {
            int seen = 0;
            for (size_t j = 0; j < i && !seen; j++) {
                const route_worker *o = s->w[j];
                if (o->up && o->models_known && serves(o, w->model_ids[m])) seen = 1;
            }
            for (size_t k = 0; k < m && !seen; k++)
                if (strcmp(w->model_ids[k], w->model_ids[m]) == 0) seen = 1;
            if (seen) continue;
            if (!first) strbuf_puts(b, ",");
            strbuf_puts(b, w->model_json[m]);
            first = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    strbuf_puts(b, "]}");
}

int route_workers_model_json(route_workers *s, const char *id, strbuf *b) {
    int found = -1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n && found; i++) {
        const route_worker *w = s->w[i];
        if (!w->up) continue;
        for (size_t m = 0; m < w->n_models; m++)
            if (strcmp(w->model_ids[m], id) == 0) {
                strbuf_puts(b, w->model_json[m]);
                found = 0;
                break;
            }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

void route_workers_list_json(route_workers *s, strbuf *b) {
    strbuf_puts(b, "{\"workers\":[");
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n; i++) {
        const route_worker *w = s->w[i];
        strbuf_puts(b, i ? ",{\"url\":" : "{\"url\":");
        json_write_cstring(b, w->url);
        strbuf_printf(b,
                      ",\"up\":%s,\"load\":%u,\"requests\":%llu,\"tree_bytes\":%zu,"
                      "\"models\":[",
                      w->up ? "true" : "false", w->load, (unsigned long long)w->requests,
                      radix_text_size(w->tree));
        for (size_t m = 0; m < w->n_models; m++) {
            if (m) strbuf_puts(b, ",");
            json_write_cstring(b, w->model_ids[m]);
        }
        strbuf_puts(b, "]}");
    }
    pthread_mutex_unlock(&s->mu);
    strbuf_puts(b, "]}");
}
