/*
 * loadgen.c - load benchmark for `orch serve` (or any OpenAI-compatible
 * server), in the spirit of vLLM's benchmark_serving: sends N requests at a
 * fixed concurrency or at a Poisson rate, with given prompt and output
 * lengths, over keep-alive HTTP/1.1 connections (raw sockets, one epoll loop
 * per thread), and prints request throughput, output tokens/s, TTFT, TPOT,
 * ITL and end-to-end latency (mean, p50, p99); --json prints one JSON line.
 *
 * Streaming (default) measures TTFT at the first SSE event that carries text
 * and ITL between text events; token counts come from the server's usage
 * (stream_options.include_usage). With --no-stream TTFT equals the latency.
 * Requests ask for exactly --max-tokens tokens ("ignore_eos": true) with
 * temperature 0 unless --temperature is given.
 *
 * Prefix-caching workloads: --shared-prefix-len N starts every prompt with
 * the same N characters (a system message for chat), followed by the
 * request's own --prompt-len characters (a short question). --turns T (chat
 * endpoint) makes each request one turn of a conversation: a connection runs
 * a conversation's T turns one after the other, each resending the whole
 * conversation so far (system message, earlier questions and the assistant's
 * replies as the server sent them) plus a new question; --requests counts
 * turns (a multiple of T). The summary adds the prompt tokens the server
 * reported as cached (usage.prompt_tokens_details.cached_tokens).
 *
 *   loadgen --port 8080 --requests 100000 --concurrency 64 --max-tokens 16
 *   loadgen --port 8080 --requests 2000 --rate 500 --prompt-len 64 --json
 *
 * Exit status: 0 when every request succeeded, 1 when some failed, 2 on bad
 * usage.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct opts {
    const char *host, *endpoint, *model, *api_key;
    int port;
    long requests, concurrency, prompt_len, max_tokens, threads;
    long shared_prefix_len, turns;
    double rate, temperature, timeout;
    int stream, json, chat;
    unsigned long seed;
} opts;

typedef struct result {
    double start, first, end;
    long out_tokens, in_tokens, cached_tokens;
    int ok;
    double *itl; /* gaps between text events */
    int n_itl, cap_itl;
} result;

typedef struct conn {
    int fd;
    int busy;
    long req; /* index into results, -1 when idle */
    char *out;
    size_t out_len, out_off;
    char *in; /* raw bytes not yet consumed */
    size_t in_len, in_cap;
    int state; /* 0 status line/headers, 1 body (length), 2 chunk size, 3 chunk data, 4 chunk crlf */
    long status;
    long remaining; /* content-length left / chunk bytes left */
    int chunked;
    int close_after;
    char *body; /* de-chunked body */
    size_t body_len, body_cap, body_scan;
    double last_event;
    /* --turns: the conversation this connection runs */
    long conv, turn; /* conv -1: none */
    char *hist;      /* JSON messages so far (without brackets) */
    size_t hist_len, hist_cap;
    char *reply; /* this turn's reply, JSON-escaped as received */
    size_t reply_len, reply_cap;
} conn;

typedef struct worker {
    int id;
    const opts *o;
    long first_req, n_req; /* this worker's requests */
    long next;             /* next request (--turns: conversation) to start */
    long n_conv;           /* --turns: this worker's conversations */
    long done;
    int n_conns;
    conn *conns;
    result *res;
    struct sockaddr_in addr;
    double t0;
    double *arrivals; /* rate mode: absolute send times */
} worker;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loadgen: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static void grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    char *n = realloc(*p, c);
    if (!n) die("out of memory");
    *p = n;
    *cap = c;
}

/* ------------------------------------------------------------------------- */
/* Requests                                                                   */
/* ------------------------------------------------------------------------- */
static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n characters of words of lowercase letters from seed s into out. */
static void fill_text(char *out, long n, uint64_t s) {
    for (long k = 0; k < n; k++) {
        uint64_t r = rng_next(&s);
        out[k] = (k % 6 == 5) ? ' ' : (char)('a' + r % 26);
    }
    out[n] = '\0';
}

static void append(char **p, size_t *len, size_t *cap, const char *src, size_t n) {
    grow(p, cap, *len + n + 1);
    memcpy(*p + *len, src, n);
    *len += n;
    (*p)[*len] = '\0';
}

/* append a string literal or other NUL-terminated text */
#define appends(p, len, cap, str) append((p), (len), (cap), (str), strlen(str))

#define MAX_TEXT 65536

/* The shared prefix (same for every request of a run). */
static const char *shared_prefix(const opts *o) {
    static char buf[MAX_TEXT];
    static int done;
    if (!done) {
        long n =
            o->shared_prefix_len < MAX_TEXT - 1 ? o->shared_prefix_len : MAX_TEXT - 1;
        fill_text(buf, n, o->seed * 7919ull + 17);
        done = 1;
    }
    return buf;
}

/* Build request i: a distinct prompt of prompt_len characters (words of
 * lowercase letters) after the shared prefix; with --turns the next turn of
 * the connection's conversation. */
static void build_request(const opts *o, long i, conn *c) {
    static _Thread_local char prompt[MAX_TEXT];
    long n = o->prompt_len < MAX_TEXT - 1 ? o->prompt_len : MAX_TEXT - 1;
    fill_text(prompt, n, o->seed * 1000003ull + (uint64_t)i);
    const char *pre = shared_prefix(o);
    char temp[64] = "";
    if (o->temperature >= 0)
        snprintf(temp, sizeof temp, ",\"temperature\":%g", o->temperature);
    else
        snprintf(temp, sizeof temp, ",\"temperature\":0");
    const char *so =
        o->stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}" : "";
    char *msgs = NULL;
    size_t ml = 0, mc = 0;
    if (o->turns > 0) {
        if (c->turn == 0) {
            c->hist_len = 0;
            if (*pre) {
                appends(&c->hist, &c->hist_len, &c->hist_cap,
                        "{\"role\":\"system\",\"content\":\"");
                append(&c->hist, &c->hist_len, &c->hist_cap, pre, strlen(pre));
                appends(&c->hist, &c->hist_len, &c->hist_cap, "\"},");
            }
        } else { /* the previous turn's reply */
            appends(&c->hist, &c->hist_len, &c->hist_cap,
                    "{\"role\":\"assistant\",\"content\":\"");
            append(&c->hist, &c->hist_len, &c->hist_cap, c->reply ? c->reply : "",
                   c->reply_len);
            appends(&c->hist, &c->hist_len, &c->hist_cap, "\"},");
        }
        appends(&c->hist, &c->hist_len, &c->hist_cap,
                "{\"role\":\"user\",\"content\":\"");
        append(&c->hist, &c->hist_len, &c->hist_cap, prompt, (size_t)n);
        appends(&c->hist, &c->hist_len, &c->hist_cap, "\"},");
        append(&msgs, &ml, &mc, c->hist, c->hist_len - 1); /* without the last ',' */
    } else if (o->chat) {
        if (*pre) {
            appends(&msgs, &ml, &mc, "{\"role\":\"system\",\"content\":\"");
            append(&msgs, &ml, &mc, pre, strlen(pre));
            appends(&msgs, &ml, &mc, "\"},");
        }
        appends(&msgs, &ml, &mc, "{\"role\":\"user\",\"content\":\"");
        append(&msgs, &ml, &mc, prompt, (size_t)n);
        appends(&msgs, &ml, &mc, "\"}");
    }
    c->reply_len = 0;
    size_t need = strlen(pre) + (size_t)n + ml + 1024;
    char *body = malloc(need);
    if (!body) die("out of memory");
    int bl;
    if (o->chat)
        bl = snprintf(body, need,
                      "{\"model\":\"%s\",\"messages\":[%s],"
                      "\"max_tokens\":%ld,\"ignore_eos\":true,\"seed\":%ld%s%s}",
                      o->model, msgs, o->max_tokens, i, temp, so);
    else
        bl = snprintf(body, need,
                      "{\"model\":\"%s\",\"prompt\":\"%s%s\",\"max_tokens\":%ld,"
                      "\"ignore_eos\":true,\"seed\":%ld%s%s}",
                      o->model, pre, prompt, o->max_tokens, i, temp, so);
    free(msgs);
    char auth[512] = "";
    if (o->api_key)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", o->api_key);
    size_t cap = 0;
    free(c->out);
    c->out = NULL;
    grow(&c->out, &cap, (size_t)bl + 1024);
    c->out_len = (size_t)snprintf(
        c->out, (size_t)bl + 1024,
        "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
        "%sContent-Length: %d\r\n\r\n%s",
        o->endpoint, o->host, o->port, auth, bl, body);
    c->out_off = 0;
    free(body);
}

/* Append the JSON string value after `key` in e[0..n) (escapes kept as they
 * are) to the connection's reply. */
static void take_reply(conn *c, const char *e, size_t n, const char *key) {
    size_t kl = strlen(key);
    const char *p = memmem(e, n, key, kl);
    if (!p) return;
    p += kl;
    const char *q = p, *end = e + n;
    while (q < end && *q != '"') q += (*q == '\\' && q + 1 < end) ? 2 : 1;
    append(&c->reply, &c->reply_len, &c->reply_cap, p, (size_t)(q - p));
}

/* ------------------------------------------------------------------------- */
/* Connections                                                                */
/* ------------------------------------------------------------------------- */
static int conn_open(worker *w, conn *c, int ep) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(c->fd, (struct sockaddr *)&w->addr, sizeof w->addr) != 0 &&
        errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP, .data.ptr = c };
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    c->in_len = 0;
    c->state = 0;
    return 0;
}

static void conn_close(conn *c, int ep) {
    if (c->fd >= 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
}

static void add_itl(result *r, double gap) {
    if (r->n_itl == r->cap_itl) {
        r->cap_itl = r->cap_itl ? r->cap_itl * 2 : 32;
        r->itl = realloc(r->itl, (size_t)r->cap_itl * sizeof *r->itl);
        if (!r->itl) die("out of memory");
    }
    r->itl[r->n_itl++] = gap;
}

static long json_long(const char *s, size_t n, const char *key) {
    const char *p = memmem(s, n, key, strlen(key));
    if (!p) return -1;
    p += strlen(key);
    return strtol(p, NULL, 10);
}

/* An SSE event with non-empty text/content. */
static int event_has_text(const char *e, size_t n) {
    static const char *keys[] = { "\"text\":\"", "\"content\":\"" };
    for (int k = 0; k < 2; k++) {
        const char *p = memmem(e, n, keys[k], strlen(keys[k]));
        if (p && (size_t)(p - e) + strlen(keys[k]) < n && p[strlen(keys[k])] != '"')
            return 1;
    }
    return 0;
}

/* Consume complete SSE events in c->body. */
static void scan_events(conn *c, result *r, double t) {
    for (;;) {
        char *start = c->body + c->body_scan;
        size_t left = c->body_len - c->body_scan;
        char *end = memmem(start, left, "\n\n", 2);
        if (!end) return;
        size_t n = (size_t)(end - start);
        if (n >= 6 && memcmp(start, "data: ", 6) == 0) {
            if (n >= 12 && memcmp(start + 6, "[DONE]", 6) == 0) {
                /* nothing */
            } else if (memmem(start, n, "\"error\":{", 9)) {
                r->ok = -1;
            } else {
                if (event_has_text(start, n)) {
                    if (r->first == 0)
                        r->first = t;
                    else
                        add_itl(r, t - c->last_event);
                    c->last_event = t;
                }
                long ct = json_long(start, n, "\"completion_tokens\":");
                if (ct >= 0) r->out_tokens = ct;
                long pt = json_long(start, n, "\"prompt_tokens\":");
                if (pt >= 0) r->in_tokens = pt;
                long cached = json_long(start, n, "\"cached_tokens\":");
                if (cached >= 0) r->cached_tokens = cached;
                take_reply(c, start, n, "\"content\":\"");
            }
        }
        c->body_scan += n + 2;
    }
}

/* Parse what arrived; returns 1 when the response is complete, -1 on error. */
static int conn_parse(const opts *o, conn *c, result *r, double t) {
    size_t off = 0;
    int complete = 0;
    while (off < c->in_len && !complete) {
        char *p = c->in + off;
        size_t left = c->in_len - off;
        if (c->state == 0) {
            char *hend = memmem(p, left, "\r\n\r\n", 4);
            if (!hend) break;
            size_t hl = (size_t)(hend - p) + 4;
            c->status = strtol(p + 9, NULL, 10);
            c->chunked = memmem(p, hl, "chunked", 7) != NULL;
            c->close_after = memmem(p, hl, "Connection: close", 17) != NULL ||
                             memmem(p, hl, "connection: close", 17) != NULL;
            const char *cl = memmem(p, hl, "Content-Length:", 15);
            if (!cl) cl = memmem(p, hl, "content-length:", 15);
            c->remaining = cl ? strtol(cl + 15, NULL, 10) : 0;
            c->body_len = c->body_scan = 0;
            off += hl;
            c->state = c->chunked ? 2 : 1;
            if (!c->chunked && c->remaining == 0) complete = 1;
        } else if (c->state == 1 || c->state == 3) {
            size_t take = left < (size_t)c->remaining ? left : (size_t)c->remaining;
            grow(&c->body, &c->body_cap, c->body_len + take + 1);
            memcpy(c->body + c->body_len, p, take);
            c->body_len += take;
            c->body[c->body_len] = '\0';
            c->remaining -= (long)take;
            off += take;
            if (c->remaining == 0) {
                if (c->state == 1)
                    complete = 1;
                else
                    c->state = 4;
            }
            if (o->stream && c->chunked) scan_events(c, r, t);
        } else if (c->state == 2) {
            char *le = memmem(p, left, "\r\n", 2);
            if (!le) break;
            long sz = strtol(p, NULL, 16);
            off += (size_t)(le - p) + 2;
            if (sz == 0) {
                c->state = 5; /* trailer: expect \r\n */
            } else {
                c->remaining = sz;
                c->state = 3;
            }
        } else if (c->state == 4 || c->state == 5) {
            if (left < 2) break;
            off += 2;
            if (c->state == 5)
                complete = 1;
            else
                c->state = 2;
        }
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (!complete) return 0;
    c->state = 0;
    if (c->status != 200) return -1;
    if (!o->stream || !c->chunked) {
        long ct =
            json_long(c->body ? c->body : "", c->body_len, "\"completion_tokens\":");
        long pt = json_long(c->body ? c->body : "", c->body_len, "\"prompt_tokens\":");
        if (ct < 0) return -1;
        r->out_tokens = ct;
        r->in_tokens = pt;
        const char *b = c->body ? c->body : "";
        r->cached_tokens = json_long(b, c->body_len, "\"cached_tokens\":");
        if (o->chat) take_reply(c, b, c->body_len, "\"content\":\"");
        r->first = t;
    }
    return r->ok < 0 ? -1 : 1;
}

/* ------------------------------------------------------------------------- */
/* Worker loop                                                                */
/* ------------------------------------------------------------------------- */
/* Whether idle connection c has a request to send: the next of the
 * worker's requests, or with --turns the next turn of its conversation or a
 * new conversation. */
static int has_next(const worker *w, const conn *c) {
    long T = w->o->turns;
    if (T <= 0) return w->next < w->n_req;
    return (c->conv >= 0 && c->turn + 1 < T) || w->next < w->n_conv;
}

static long next_index(worker *w, conn *c) {
    long T = w->o->turns;
    if (T <= 0) return w->first_req + w->next++;
    if (c->conv >= 0 && c->turn + 1 < T) {
        c->turn++;
    } else {
        c->conv = w->next++;
        c->turn = 0;
    }
    return w->first_req + c->conv * T + c->turn;
}

static void start_request(worker *w, conn *c, int ep, double t) {
    long i = next_index(w, c);
    c->req = i;
    c->busy = 1;
    result *r = &w->res[i];
    r->start = t;
    r->first = 0;
    r->ok = 0;
    c->last_event = t;
    build_request(w->o, i, c);
    if (c->fd < 0 && conn_open(w, c, ep) != 0) {
        r->ok = -1;
        r->end = t;
        c->busy = 0;
        w->done++;
        return;
    }
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP, .data.ptr = c };
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void finish_request(worker *w, conn *c, int ok, double t, int ep) {
    result *r = &w->res[c->req];
    r->end = t;
    r->ok = ok ? 1 : -1;
    if (!r->first) r->first = t;
    c->busy = 0;
    c->req = -1;
    w->done++;
    if (!ok || c->close_after)
        conn_close(c, ep);
    else {
        struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    const opts *o = w->o;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    for (int k = 0; k < w->n_conns; k++) {
        w->conns[k].fd = -1;
        w->conns[k].req = -1;
        w->conns[k].conv = -1;
    }
    struct epoll_event evs[256];
    while (w->done < w->n_req) {
        double t = now_s();
        /* dispatch */
        for (int k = 0; k < w->n_conns; k++) {
            conn *c = &w->conns[k];
            if (c->busy || !has_next(w, c)) continue;
            if (w->arrivals && w->arrivals[w->next] > t) break;
            start_request(w, c, ep, t);
        }
        int timeout_ms = 100;
        if (w->arrivals && w->next < w->n_req) {
            double dt = w->arrivals[w->next] - now_s();
            timeout_ms = dt <= 0 ? 0 : (int)(dt * 1000) + 1;
            if (timeout_ms > 100) timeout_ms = 100;
        }
        int n = epoll_wait(ep, evs, 256, timeout_ms);
        t = now_s();
        for (int e = 0; e < n; e++) {
            conn *c = evs[e].data.ptr;
            if (c->fd < 0) continue;
            if (!c->busy) { /* idle connection closed by the server */
                if (evs[e].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR | EPOLLIN))
                    conn_close(c, ep);
                continue;
            }
            if ((evs[e].events & EPOLLOUT) && c->out_off < c->out_len) {
                ssize_t wr = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                                  MSG_NOSIGNAL);
                if (wr > 0)
                    c->out_off += (size_t)wr;
                else if (wr < 0 && errno != EAGAIN) {
                    finish_request(w, c, 0, t, ep);
                    continue;
                }
                if (c->out_off == c->out_len) {
                    struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP,
                                              .data.ptr = c };
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                }
            }
            if (evs[e].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
                int closed = 0;
                for (;;) {
                    size_t cap = c->in_cap;
                    grow(&c->in, &cap, c->in_len + 65536);
                    c->in_cap = cap;
                    ssize_t rd = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
                    if (rd > 0) {
                        c->in_len += (size_t)rd;
                        continue;
                    }
                    if (rd == 0 || (errno != EAGAIN && errno != EINTR)) closed = 1;
                    break;
                }
                int st = conn_parse(o, c, &w->res[c->req], t);
                if (st != 0)
                    finish_request(w, c, st > 0, t, ep);
                else if (closed)
                    finish_request(w, c, 0, t, ep);
            }
        }
        /* timeouts */
        if (o->timeout > 0) {
            for (int k = 0; k < w->n_conns; k++) {
                conn *c = &w->conns[k];
                if (c->busy && t - w->res[c->req].start > o->timeout)
                    finish_request(w, c, 0, t, ep);
            }
        }
    }
    for (int k = 0; k < w->n_conns; k++) {
        conn_close(&w->conns[k], ep);
        free(w->conns[k].in);
        free(w->conns[k].out);
        free(w->conns[k].body);
        free(w->conns[k].hist);
        free(w->conns[k].reply);
    }
    close(ep);
    return NULL;
}

/* ------------------------------------------------------------------------- */
/* Statistics                                                                 */
/* ------------------------------------------------------------------------- */
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct stat3 {
    double mean, p50, p99;
} stat3;

static stat3 stats(double *v, size_t n) {
    stat3 s = { 0, 0, 0 };
    if (!n) return s;
    qsort(v, n, sizeof *v, cmp_d);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s.mean = sum / (double)n;
    s.p50 = v[(size_t)floor(0.50 * (double)(n - 1) + 0.5)];
    s.p99 = v[(size_t)floor(0.99 * (double)(n - 1) + 0.5)];
    return s;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: loadgen [options]\n"
            "  --host ADDR          server IPv4 address (default 127.0.0.1)\n"
            "  --port N             server port (default 8080)\n"
            "  --endpoint PATH      /v1/completions (default) or /v1/chat/completions\n"
            "  --model NAME         model field (default mock-gpt2)\n"
            "  --api-key KEY        send Authorization: Bearer KEY\n"
            "  --requests N         total requests (default 1000)\n"
            "  --concurrency C      requests in flight (default 16)\n"
            "  --rate R             Poisson arrivals at R requests/s (connections\n"
            "                       up to --concurrency; default: closed loop)\n"
            "  --prompt-len N       prompt characters (default 32)\n"
            "  --max-tokens N       output tokens per request (default 16)\n"
            "  --temperature T      (default 0)\n"
            "  --no-stream          non-streaming requests (TTFT = latency)\n"
            "  --threads N          client threads (default 1)\n"
            "  --timeout S          per-request timeout (default 600)\n"
            "  --seed S             prompt seed (default 1)\n"
            "  --shared-prefix-len N  every prompt starts with the same N characters\n"
            "                       (a system message for chat; default 0)\n"
            "  --turns T            chat conversations of T turns, each resending\n"
            "                       the conversation so far (--requests = turns)\n"
            "  --json               print one JSON line instead of the table\n");
}

int main(int argc, char **argv) {
    opts o = { .host = "127.0.0.1",
               .endpoint = "/v1/completions",
               .model = "mock-gpt2",
               .port = 8080,
               .requests = 1000,
               .concurrency = 16,
               .prompt_len = 32,
               .max_tokens = 16,
               .threads = 1,
               .rate = 0,
               .temperature = -1,
               .timeout = 600,
               .stream = 1,
               .seed = 1 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (++i, 1))
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (ARG("--host"))
            o.host = v;
        else if (ARG("--port"))
            o.port = atoi(v);
        else if (ARG("--endpoint"))
            o.endpoint = v;
        else if (ARG("--model"))
            o.model = v;
        else if (ARG("--api-key"))
            o.api_key = v;
        else if (ARG("--requests"))
            o.requests = atol(v);
        else if (ARG("--concurrency"))
            o.concurrency = atol(v);
        else if (ARG("--rate"))
            o.rate = atof(v);
        else if (ARG("--prompt-len"))
            o.prompt_len = atol(v);
        else if (ARG("--max-tokens"))
            o.max_tokens = atol(v);
        else if (ARG("--temperature"))
            o.temperature = atof(v);
        else if (ARG("--threads"))
            o.threads = atol(v);
        else if (ARG("--timeout"))
            o.timeout = atof(v);
        else if (ARG("--shared-prefix-len"))
            o.shared_prefix_len = atol(v);
        else if (ARG("--turns"))
            o.turns = atol(v);
        else if (ARG("--seed"))
            o.seed = strtoul(v, NULL, 10);
        else if (strcmp(a, "--no-stream") == 0)
            o.stream = 0;
        else if (strcmp(a, "--json") == 0)
            o.json = 1;
        else {
            usage(stderr);
            die("unknown or incomplete option '%s'", a);
        }
#undef ARG
    }
    if (o.requests < 1 || o.concurrency < 1 || o.threads < 1 || o.port < 1 ||
        o.port > 65535 || o.max_tokens < 1 || o.prompt_len < 1 || o.rate < 0)
        die("bad numbers (requests, concurrency, threads, port, max-tokens, prompt-len "
            "must be >= 1)");
    if (o.shared_prefix_len < 0 || o.shared_prefix_len > 60000 || o.prompt_len > 60000 ||
        o.turns < 0)
        die("bad numbers (shared-prefix-len and prompt-len at most 60000, turns >= 0)");
    if (o.threads > o.concurrency) o.threads = o.concurrency;
    o.chat = strstr(o.endpoint, "chat") != NULL;
    if (o.turns > 0 && (!o.chat || o.rate > 0 || o.requests % o.turns != 0))
        die("--turns needs the chat endpoint, a closed loop (no --rate) and --requests "
            "a multiple of the turns");

    result *res = calloc((size_t)o.requests, sizeof *res);
    worker *ws = calloc((size_t)o.threads, sizeof *ws);
    pthread_t *th = calloc((size_t)o.threads, sizeof *th);
    if (!res || !ws || !th) die("out of memory");
    struct sockaddr_in addr = { .sin_family = AF_INET,
                                .sin_port = htons((uint16_t)o.port) };
    if (inet_pton(AF_INET, o.host, &addr.sin_addr) != 1)
        die("--host '%s' is not an IPv4 address", o.host);
    double t0 = now_s();
    double *arrivals = NULL;
    if (o.rate > 0) {
        arrivals = malloc((size_t)o.requests * sizeof *arrivals);
        if (!arrivals) die("out of memory");
        uint64_t s = o.seed ^ 0xabcdefull;
        double t = t0;
        for (long i = 0; i < o.requests; i++) {
            double u = (double)(rng_next(&s) >> 11) * 0x1.0p-53;
            t += -log(1.0 - u) / o.rate;
            arrivals[i] = t;
        }
    }
    long units = o.turns > 0 ? o.requests / o.turns : o.requests; /* conversations */
    long unit_len = o.turns > 0 ? o.turns : 1;
    long per = units / o.threads, extra = units % o.threads, first = 0;
    long cper = o.concurrency / o.threads, cextra = o.concurrency % o.threads;
    for (long k = 0; k < o.threads; k++) {
        worker *w = &ws[k];
        w->id = (int)k;
        w->o = &o;
        w->first_req = first;
        w->n_conv = per + (k < extra);
        w->n_req = w->n_conv * unit_len;
        first += w->n_req;
        w->n_conns = (int)(cper + (k < cextra));
        w->conns = calloc((size_t)w->n_conns, sizeof *w->conns);
        w->res = res;
        w->addr = addr;
        w->t0 = t0;
        if (!w->conns) die("out of memory");
        if (arrivals) {
            /* each thread takes every threads-th arrival */
            w->arrivals = malloc((size_t)w->n_req * sizeof *w->arrivals);
            if (!w->arrivals) die("out of memory");
            for (long i = 0; i < w->n_req; i++)
                w->arrivals[i] = arrivals[w->first_req + i];
        }
        pthread_create(&th[k], NULL, worker_main, w);
    }
    for (long k = 0; k < o.threads; k++) pthread_join(th[k], NULL);
    double t1 = now_s(), dur = t1 - t0;

    long okn = 0, fail = 0, in_tok = 0, out_tok = 0, cached_tok = 0;
    size_t n_itl = 0;
    for (long i = 0; i < o.requests; i++) {
        if (res[i].ok > 0) {
            okn++;
            in_tok += res[i].in_tokens > 0 ? res[i].in_tokens : 0;
            out_tok += res[i].out_tokens;
            cached_tok += res[i].cached_tokens > 0 ? res[i].cached_tokens : 0;
            n_itl += (size_t)res[i].n_itl;
        } else {
            fail++;
        }
    }
    double *ttft = malloc(((size_t)okn + 1) * sizeof *ttft);
    double *tpot = malloc(((size_t)okn + 1) * sizeof *tpot);
    double *e2e = malloc(((size_t)okn + 1) * sizeof *e2e);
    double *itl = malloc((n_itl + 1) * sizeof *itl);
    if (!ttft || !tpot || !e2e || !itl) die("out of memory");
    size_t a = 0, b = 0, li = 0;
    for (long i = 0; i < o.requests; i++) {
        result *r = &res[i];
        if (r->ok <= 0) continue;
        ttft[a] = (r->first - r->start) * 1e3;
        e2e[a] = (r->end - r->start) * 1e3;
        a++;
        if (r->out_tokens > 1)
            tpot[b++] = (r->end - r->first) * 1e3 / (double)(r->out_tokens - 1);
        for (int k = 0; k < r->n_itl; k++) itl[li++] = r->itl[k] * 1e3;
    }
    stat3 s_ttft = stats(ttft, a), s_tpot = stats(tpot, b), s_itl = stats(itl, li),
          s_e2e = stats(e2e, a);
    double rps = (double)okn / dur, otps = (double)out_tok / dur,
           ttps = (double)(in_tok + out_tok) / dur;
    if (o.json) {
        printf("{\"requests\":%ld,\"successful\":%ld,\"failed\":%ld,\"concurrency\":%ld,"
               "\"rate\":%g,"
               "\"stream\":%s,\"prompt_len\":%ld,\"max_tokens\":%ld,\"duration_s\":%.3f,"
               "\"input_tokens\":%ld,\"cached_tokens\":%ld,\"output_tokens\":%ld,"
               "\"request_throughput\":%.2f,"
               "\"output_token_throughput\":%.2f,\"total_token_throughput\":%.2f,"
               "\"mean_ttft_ms\":%.3f,\"median_ttft_ms\":%.3f,\"p99_ttft_ms\":%.3f,"
               "\"mean_tpot_ms\":%.3f,\"median_tpot_ms\":%.3f,\"p99_tpot_ms\":%.3f,"
               "\"mean_itl_ms\":%.3f,\"median_itl_ms\":%.3f,\"p99_itl_ms\":%.3f,"
               "\"mean_e2el_ms\":%.3f,\"median_e2el_ms\":%.3f,\"p99_e2el_ms\":%.3f}\n",
               o.requests, okn, fail, o.concurrency, o.rate, o.stream ? "true" : "false",
               o.prompt_len, o.max_tokens, dur, in_tok, cached_tok, out_tok, rps, otps,
               ttps, s_ttft.mean, s_ttft.p50, s_ttft.p99, s_tpot.mean, s_tpot.p50,
               s_tpot.p99, s_itl.mean, s_itl.p50, s_itl.p99, s_e2e.mean, s_e2e.p50,
               s_e2e.p99);
    } else {
        printf("============ Serving Benchmark Result ============\n");
        printf("%-40s %ld\n", "Successful requests:", okn);
        printf("%-40s %ld\n", "Failed requests:", fail);
        printf("%-40s %ld%s\n", "Concurrency:", o.concurrency,
               o.rate > 0 ? " (max connections)" : "");
        if (o.rate > 0) printf("%-40s %.2f\n", "Request rate (Poisson, req/s):", o.rate);
        printf("%-40s %.2f\n", "Benchmark duration (s):", dur);
        printf("%-40s %ld\n", "Total input tokens:", in_tok);
        printf("%-40s %ld\n", "Cached input tokens (server):", cached_tok);
        printf("%-40s %ld\n", "Total generated tokens:", out_tok);
        printf("%-40s %.2f\n", "Request throughput (req/s):", rps);
        printf("%-40s %.2f\n", "Output token throughput (tok/s):", otps);
        printf("%-40s %.2f\n", "Total Token throughput (tok/s):", ttps);
        printf("---------------Time to First Token----------------\n");
        printf("%-40s %.3f\n%-40s %.3f\n%-40s %.3f\n", "Mean TTFT (ms):", s_ttft.mean,
               "Median TTFT (ms):", s_ttft.p50, "P99 TTFT (ms):", s_ttft.p99);
        printf("-----Time per Output Token (excl. 1st token)------\n");
        printf("%-40s %.3f\n%-40s %.3f\n%-40s %.3f\n", "Mean TPOT (ms):", s_tpot.mean,
               "Median TPOT (ms):", s_tpot.p50, "P99 TPOT (ms):", s_tpot.p99);
        printf("---------------Inter-token Latency----------------\n");
        printf("%-40s %.3f\n%-40s %.3f\n%-40s %.3f\n", "Mean ITL (ms):", s_itl.mean,
               "Median ITL (ms):", s_itl.p50, "P99 ITL (ms):", s_itl.p99);
        printf("----------------End-to-end Latency----------------\n");
        printf("%-40s %.3f\n%-40s %.3f\n%-40s %.3f\n", "Mean E2EL (ms):", s_e2e.mean,
               "Median E2EL (ms):", s_e2e.p50, "P99 E2EL (ms):", s_e2e.p99);
        printf("==================================================\n");
    }
    for (long i = 0; i < o.requests; i++) free(res[i].itl);
    for (long k = 0; k < o.threads; k++) {
        free(ws[k].conns);
        free(ws[k].arrivals);
    }
    free(res);
    free(ws);
    free(th);
    free(arrivals);
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    return fail ? 1 : 0;
}
