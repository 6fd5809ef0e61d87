/*
 * metrics.c - Prometheus registry (counters, gauges, histograms with labels),
 * text exposition and a tiny /metrics HTTP endpoint. See metrics.h.
 */
#include "orchestrator/core/metrics.h"
#include "orchestrator/core/strbuf.h"

#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "orchestrator/core/util.h"

typedef enum { M_COUNTER, M_GAUGE, M_HISTOGRAM } mtype;

struct metrics_series {
    metrics_family *fam;
    char **values;           /* n_labels copied label values */
    _Atomic uint64_t bits;   /* counter/gauge value as double bits */
    pthread_mutex_t lock;    /* histogram */
    uint64_t *bucket_counts; /* n_buckets (non-cumulative) + 1 for +Inf */
    uint64_t count;
    double sum;
    metrics_series *next;
};

struct metrics_family {
    metrics_registry *reg;
    mtype type;
    char *name, *help;
    size_t n_labels;
    char *labels[METRICS_MAX_LABELS];
    double *buckets;
    size_t n_buckets;
    metrics_series *first, *last;
    metrics_family *next;
};

struct metrics_registry {
    pthread_mutex_t lock;
    metrics_family *first, *last;
};

/* ------------------------------------------------------------------------- */
/* Registry                                                                   */
/* ------------------------------------------------------------------------- */
metrics_registry *metrics_registry_create(void) {
    metrics_registry *r = util_calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

static void series_free(metrics_series *s) {
    for (size_t i = 0; i < s->fam->n_labels; i++) free(s->values[i]);
    free(s->values);
    free(s->bucket_counts);
    if (s->fam->type == M_HISTOGRAM) pthread_mutex_destroy(&s->lock);
    free(s);
}

static void family_free(metrics_family *f) {
    metrics_series *s = f->first;
    while (s) {
        metrics_series *n = s->next;
        series_free(s);
        s = n;
    }
    for (size_t i = 0; i < f->n_labels; i++) free(f->labels[i]);
    free(f->name);
    free(f->help);
    free(f->buckets);
    free(f);
}

void metrics_registry_free(metrics_registry *r) {
    if (!r) return;
    metrics_family *f = r->first;
    while (f) {
        metrics_family *n = f->next;
        family_free(f);
        f = n;
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
}

static int valid_name(const char *s, int colon_ok) {
    if (!s || !*s) return 0;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                 (colon_ok && c == ':') || (i > 0 && c >= '0' && c <= '9');
        if (!ok) return 0;
    }
    return 1;
}

static char *dupstr(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static int same_shape(const metrics_family *f, mtype type, size_t n_labels,
                      const char *const *labels, const double *buckets,
                      size_t n_buckets) {
    if (f->type != type || f->n_labels != n_labels) return 0;
    for (size_t i = 0; i < n_labels; i++)
        if (strcmp(f->labels[i], labels[i]) != 0) return 0;
    if (type == M_HISTOGRAM && buckets) {
        if (n_buckets != f->n_buckets) return 0;
        for (size_t i = 0; i < n_buckets; i++)
            if (buckets[i] != f->buckets[i]) return 0;
    }
    return 1;
}

static metrics_family *family_register(metrics_registry *r, mtype type, const char *name,
                                       const char *help, size_t n_labels,
                                       const char *const *labels, const double *buckets,
                                       size_t n_buckets) {
    static const double def_buckets[] = {
        .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10
    };
    if (!r || !valid_name(name, 1) || n_labels > METRICS_MAX_LABELS ||
        (n_labels && !labels))
        return NULL;
    for (size_t i = 0; i < n_labels; i++) {
        if (!valid_name(labels[i], 0) || strncmp(labels[i], "__", 2) == 0) return NULL;
        if (type == M_HISTOGRAM && strcmp(labels[i], "le") == 0) return NULL;
        for (size_t j = 0; j < i; j++)
            if (strcmp(labels[i], labels[j]) == 0) return NULL;
    }
    if (type == M_HISTOGRAM) {
        if (!buckets || n_buckets == 0) {
            buckets = NULL;
        } else {
            if (n_buckets > 64) return NULL;
            for (size_t i = 0; i < n_buckets; i++) {
                if (!isfinite(buckets[i])) return NULL;
                if (i && !(buckets[i] > buckets[i - 1])) return NULL;
            }
        }
    }
    pthread_mutex_lock(&r->lock);
    for (metrics_family *f = r->first; f; f = f->next) {
        if (strcmp(f->name, name) == 0) {
            metrics_family *ret =
                same_shape(f, type, n_labels, labels, buckets, n_buckets) ? f : NULL;
            pthread_mutex_unlock(&r->lock);
            return ret;
        }
    }
    metrics_family *f = util_calloc(1, sizeof *f);
    int ok = f != NULL;
    if (ok) {
        f->reg = r;
        f->type = type;
        f->name = dupstr(name);
        f->help = dupstr(help ? help : "");
        ok = f->name && f->help;
        for (size_t i = 0; ok && i < n_labels; i++) {
            f->labels[i] = dupstr(labels[i]);
            if (!f->labels[i])
                ok = 0;
            else
                f->n_labels = i + 1;
        }
    }
    if (ok && type == M_HISTOGRAM) {
        const double *b = buckets ? buckets : def_buckets;
        size_t nb = buckets ? n_buckets : sizeof def_buckets / sizeof *def_buckets;
        f->buckets = malloc(nb * sizeof *b);
        if (!f->buckets)
            ok = 0;
        else {
            memcpy(f->buckets, b, nb * sizeof *b);
            f->n_buckets = nb;
        }
    }
    if (!ok) {
        if (f) family_free(f);
        pthread_mutex_unlock(&r->lock);
        return NULL;
    }
    if (r->last)
        r->last->next = f;
    else
        r->first = f;
    r->last = f;
    pthread_mutex_unlock(&r->lock);
    return f;
}

metrics_family *metrics_counter(metrics_registry *r, const char *name, const char *help,
                                size_t n_labels, const char *const *label_names) {
    return family_register(r, M_COUNTER, name, help, n_labels, label_names, NULL, 0);
}

metrics_family *metrics_gauge(metrics_registry *r, const char *name, const char *help,
                              size_t n_labels, const char *const *label_names) {
    return family_register(r, M_GAUGE, name, help, n_labels, label_names, NULL, 0);
}

metrics_family *metrics_histogram(metrics_registry *r, const char *name, const char *help,
                                  size_t n_labels, const char *const *label_names,
                                  const double *buckets, size_t n_buckets) {
    return family_register(r, M_HISTOGRAM, name, help, n_labels, label_names, buckets,
                           n_buckets);
}

metrics_series *metrics_series_get(metrics_family *f, const char *const *label_values) {
    if (!f || (f->n_labels && !label_values)) return NULL;
    for (size_t i = 0; i < f->n_labels; i++)
        if (!label_values[i]) return NULL;
    metrics_registry *r = f->reg;
    pthread_mutex_lock(&r->lock);
    for (metrics_series *s = f->first; s; s = s->next) {
        size_t i = 0;
        while (i < f->n_labels && strcmp(s->values[i], label_values[i]) == 0) i++;
        if (i == f->n_labels) {
            pthread_mutex_unlock(&r->lock);
            return s;
        }
    }
    metrics_series *s = util_calloc(1, sizeof *s);
    int ok = s != NULL;
    if (ok) {
        s->fam = f;
        s->values = util_calloc(f->n_labels ? f->n_labels : 1, sizeof(char *));
        ok = s->values != NULL;
        for (size_t i = 0; ok && i < f->n_labels; i++)
            if (!(s->values[i] = dupstr(label_values[i]))) ok = 0;
        if (ok && f->type == M_HISTOGRAM) {
            s->bucket_counts = util_calloc(f->n_buckets + 1, sizeof(uint64_t));
            ok = s->bucket_counts != NULL;
            pthread_mutex_init(&s->lock, NULL);
        }
        atomic_init(&s->bits, 0);
    }
    if (!ok) {
        if (s) {
            if (s->values)
                for (size_t i = 0; i < f->n_labels; i++) free(s->values[i]);
            free(s->values);
            free(s->bucket_counts);
            if (s->bucket_counts) pthread_mutex_destroy(&s->lock);
            free(s);
        }
        pthread_mutex_unlock(&r->lock);
        return NULL;
    }
    if (f->last)
        f->last->next = s;
    else
        f->first = s;
    f->last = s;
    pthread_mutex_unlock(&r->lock);
    return s;
}

/* ------------------------------------------------------------------------- */
/* Updates                                                                    */
/* ------------------------------------------------------------------------- */
static inline uint64_t d2b(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}
static inline double b2d(uint64_t b) {
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static void atomic_add_double(_Atomic uint64_t *p, double v) {
    uint64_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(
        p, &old, d2b(b2d(old) + v), memory_order_relaxed, memory_order_relaxed)) {
    }
}

void metrics_counter_add(metrics_series *s, double v) {
    if (!s || s->fam->type != M_COUNTER || !isfinite(v) || v < 0) return;
    atomic_add_double(&s->bits, v);
}

void metrics_gauge_set(metrics_series *s, double v) {
    if (!s || s->fam->type != M_GAUGE) return;
    atomic_store_explicit(&s->bits, d2b(v), memory_order_relaxed);
}

void metrics_gauge_add(metrics_series *s, double v) {
    if (!s || s->fam->type != M_GAUGE || !isfinite(v)) return;
    atomic_add_double(&s->bits, v);
}

void metrics_histogram_observe(metrics_series *s, double v) {
    if (!s || s->fam->type != M_HISTOGRAM || !isfinite(v)) return;
    metrics_family *f = s->fam;
    size_t i = 0;
    while (i < f->n_buckets && v > f->buckets[i]) i++;
    pthread_mutex_lock(&s->lock);
    s->bucket_counts[i]++;
    s->count++;
    s->sum += v;
    pthread_mutex_unlock(&s->lock);
}

double metrics_series_value(const metrics_series *s) {
    if (!s || s->fam->type == M_HISTOGRAM) return 0.0;
    return b2d(atomic_load_explicit(&((metrics_series *)s)->bits, memory_order_relaxed));
}

uint64_t metrics_histogram_count(const metrics_series *s) {
    if (!s || s->fam->type != M_HISTOGRAM) return 0;
    metrics_series *m = (metrics_series *)s;
    pthread_mutex_lock(&m->lock);
    uint64_t c = m->count;
    pthread_mutex_unlock(&m->lock);
    return c;
}

double metrics_histogram_sum(const metrics_series *s) {
    if (!s || s->fam->type != M_HISTOGRAM) return 0.0;
    metrics_series *m = (metrics_series *)s;
    pthread_mutex_lock(&m->lock);
    double v = m->sum;
    pthread_mutex_unlock(&m->lock);
    return v;
}

/* ------------------------------------------------------------------------- */
/* Exposition                                                                 */
/* ------------------------------------------------------------------------- */
/* Escape for HELP (\\ and \n) or label values (also \"). */
static void sb_escaped(strbuf *b, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\')
            strbuf_puts(b, "\\\\");
        else if (*s == '\n')
            strbuf_puts(b, "\\n");
        else if (quote && *s == '"')
            strbuf_puts(b, "\\\"");
        else
            strbuf_put(b, s, 1);
    }
}

/* Shortest decimal that reads back as v; integers without exponent. */
static void fmt_double(char *out, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(out, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, cap, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, cap, "%.0f", v);
        return;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) return;
    }
}

static void sb_labels(strbuf *b, const metrics_series *s, const char *le) {
    const metrics_family *f = s->fam;
    if (f->n_labels == 0 && !le) return;
    strbuf_puts(b, "{");
    for (size_t i = 0; i < f->n_labels; i++) {
        if (i) strbuf_puts(b, ",");
        strbuf_puts(b, f->labels[i]);
        strbuf_puts(b, "=\"");
        sb_escaped(b, s->values[i], 1);
        strbuf_puts(b, "\"");
    }
    if (le) {
        if (f->n_labels) strbuf_puts(b, ",");
        strbuf_puts(b, "le=\"");
        strbuf_puts(b, le);
        strbuf_puts(b, "\"");
    }
    strbuf_puts(b, "}");
}

int metrics_render(metrics_registry *r, char **out, size_t *len) {
    if (!r || !out) return -1;
    strbuf b = { 0 };
    strbuf_reserve(&b, 1024);
    if (b.p) b.p[0] = '\0';
    char num[64];
    pthread_mutex_lock(&r->lock);
    for (metrics_family *f = r->first; f; f = f->next) {
        static const char *tn[] = { "counter", "gauge", "histogram" };
        strbuf_printf(&b, "# HELP %s ", f->name);
        sb_escaped(&b, f->help, 0);
        strbuf_printf(&b, "\n# TYPE %s %s\n", f->name, tn[f->type]);
        for (metrics_series *s = f->first; s; s = s->next) {
            if (f->type != M_HISTOGRAM) {
                strbuf_puts(&b, f->name);
                sb_labels(&b, s, NULL);
                fmt_double(num, sizeof num, metrics_series_value(s));
                strbuf_printf(&b, " %s\n", num);
                continue;
            }
            uint64_t counts[65], total;
            double sum;
            pthread_mutex_lock(&s->lock);
            memcpy(counts, s->bucket_counts, (f->n_buckets + 1) * sizeof *counts);
            total = s->count;
            sum = s->sum;
            pthread_mutex_unlock(&s->lock);
            uint64_t cum = 0;
            for (size_t i = 0; i <= f->n_buckets; i++) {
                cum += counts[i];
                char le[64];
                if (i < f->n_buckets)
                    fmt_double(le, sizeof le, f->buckets[i]);
                else
                    snprintf(le, sizeof le, "+Inf");
                strbuf_printf(&b, "%s_bucket", f->name);
                sb_labels(&b, s, le);
                strbuf_printf(&b, " %llu\n", (unsigned long long)cum);
            }
            fmt_double(num, sizeof num, sum);
            strbuf_printf(&b, "%s_sum", f->name);
            sb_labels(&b, s, NULL);
            strbuf_printf(&b, " %s\n", num);
            strbuf_printf(&b, "%s_count", f->name);
            sb_labels(&b, s, NULL);
            strbuf_printf(&b, " %llu\n", (unsigned long long)total);
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (b.oom || !b.p) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    if (len) *len = b.len;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Tiny HTTP endpoint                                                         */
/* ------------------------------------------------------------------------- */
struct metrics_http {
    struct MHD_Daemon *d;
    metrics_registry *r;
    uint16_t port;
};

static enum MHD_Result metrics_http_handler(void *cls, struct MHD_Connection *conn,
                                            const char *url, const char *method,
                                            const char *version, const char *upload_data,
                                            size_t *upload_data_size, void **con_cls) {
    (void)version;
    (void)upload_data;
    metrics_http *h = cls;
    if (*con_cls == NULL) { /* first call: headers only */
        *con_cls = h;
        return MHD_YES;
    }
    if (*upload_data_size) { /* ignore any body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    struct MHD_Response *resp;
    unsigned status;
    if (strcmp(url, "/metrics") != 0) {
        static const char nf[] = "not found\n";
        resp = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf,
                                               MHD_RESPMEM_PERSISTENT);
        status = MHD_HTTP_NOT_FOUND;
    } else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char na[] = "method not allowed\n";
        resp = MHD_create_response_from_buffer(sizeof na - 1, (void *)na,
                                               MHD_RESPMEM_PERSISTENT);
        if (resp) MHD_add_response_header(resp, "Allow", "GET");
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else {
        char *text = NULL;
        size_t len = 0;
        if (metrics_render(h->r, &text, &len) != 0) return MHD_NO;
        resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        if (!resp)
            free(text);
        else
            MHD_add_response_header(resp, "Content-Type", METRICS_CONTENT_TYPE);
        status = MHD_HTTP_OK;
    }
    if (!resp) return MHD_NO;
    enum MHD_Result ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

metrics_http *metrics_http_start(metrics_registry *r, const char *host, uint16_t port,
                                 char *err, size_t err_cap) {
    if (!r) {
        util_set_err(err, err_cap, "metrics: no registry");
        return NULL;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    if (!host) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        util_set_err(err, err_cap, "metrics: bad IPv4 address '%s'", host);
        return NULL;
    }
    metrics_http *h = util_calloc(1, sizeof *h);
    if (!h) {
        util_set_err(err, err_cap, "metrics: out of memory");
        return NULL;
    }
    h->r = r;
    h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, port, NULL,
                            NULL, metrics_http_handler, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)30, MHD_OPTION_END);
    if (!h->d) {
        util_set_err(err, err_cap,
                     "metrics: cannot listen on %s:%u (in use or not allowed)", host,
                     (unsigned)port);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : port;
    return h;
}

uint16_t metrics_http_port(const metrics_http *h) { return h ? h->port : 0; }

void metrics_http_stop(metrics_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
