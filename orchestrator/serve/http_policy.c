/*
 * http_policy.c - Host allow-list, JSON media type, CORS origins and the
 * constant-time API key check. See http_policy.h.
 */
#include "orchestrator/serve/http_policy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "orchestrator/core/util.h"
#include "orchestrator/store/sha256.h"

static char *dup_lower(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) d[i] = (char)tolower((unsigned char)s[i]);
    d[n] = '\0';
    return d;
}

/* The host part of a Host value: "[v6]" or the text before ":PORT" (PORT
 * all digits, possibly empty). Returns its length, or 0 when malformed. */
static size_t host_part(const char *h) {
    size_t n = strlen(h);
    size_t end = n;
    if (h[0] == '[') {
        const char *rb = strchr(h, ']');
        if (!rb) return 0;
        end = (size_t)(rb - h) + 1;
        if (h[end] != '\0' && h[end] != ':') return 0;
    } else {
        const char *colon = strchr(h, ':');
        if (colon && strchr(colon + 1, ':')) return 0; /* a bare IPv6 address */
        if (colon) end = (size_t)(colon - h);
    }
    if (h[end] == ':')
        for (const char *q = h + end + 1; *q; q++)
            if (!isdigit((unsigned char)*q)) return 0;
    return end;
}

static int add_host(http_policy *p, const char *name, size_t n) {
    char **h = realloc(p->hosts, (p->n_hosts + 1) * sizeof *h);
    if (!h) return -1;
    p->hosts = h;
    if (!(p->hosts[p->n_hosts] = dup_lower(name, n))) return -1;
    p->n_hosts++;
    return 0;
}

static int is_loopback(const char *ipv4) {
    struct in_addr a;
    return ipv4 && inet_pton(AF_INET, ipv4, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

int http_policy_init(http_policy *p, const http_policy_config *c, char *err,
                     size_t err_cap) {
    memset(p, 0, sizeof *p);
    int loopback = is_loopback(c->bind_host ? c->bind_host : "127.0.0.1");
    p->check_host = loopback || c->n_allowed_hosts > 0;
    static const char *const names[] = { "localhost", "127.0.0.1", "[::1]" };
    int oom = 0;
    for (size_t i = 0; i < 3 && p->check_host; i++)
        oom |= add_host(p, names[i], strlen(names[i]));
    if (loopback && c->bind_host) oom |= add_host(p, c->bind_host, strlen(c->bind_host));
    for (size_t i = 0; i < c->n_allowed_hosts && !oom; i++) {
        const char *h = c->allowed_hosts[i];
        size_t n = h ? host_part(h) : 0;
        if (n == 0) {
            util_set_err(err, err_cap, "--allowed-host '%s' is not a host name",
                         h ? h : "");
            http_policy_free(p);
            return -1;
        }
        oom |= add_host(p, h, n);
    }
    for (size_t i = 0; i < c->n_cors_origins && !oom; i++) {
        const char *o = c->cors_origins[i];
        if (!o || !*o) {
            util_set_err(err, err_cap, "--cors-origin must not be empty");
            http_policy_free(p);
            return -1;
        }
        if (strcmp(o, "*") == 0) {
            p->any_origin = 1;
            continue;
        }
        char **v = realloc(p->origins, (p->n_origins + 1) * sizeof *v);
        if (!v) {
            oom = 1;
            break;
        }
        p->origins = v;
        if (!(p->origins[p->n_origins] = dup_lower(o, strlen(o))))
            oom = 1;
        else
            p->n_origins++;
    }
    if (!oom && c->api_key && *c->api_key) {
        p->has_key = 1;
        oom = sha256_buffer(c->api_key, strlen(c->api_key), p->key_digest) != 0;
    }
    if (oom) {
        util_set_err(err, err_cap, "server: out of memory");
        http_policy_free(p);
        return -1;
    }
    return 0;
}

void http_policy_free(http_policy *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_hosts; i++) free(p->hosts[i]);
    for (size_t i = 0; i < p->n_origins; i++) free(p->origins[i]);
    free(p->hosts);
    free(p->origins);
    memset(p, 0, sizeof *p);
}

int http_policy_host_ok(const http_policy *p, const char *host, int http10) {
    if (!host) return http10;
    if (!p->check_host) return 1;
    size_t n = host_part(host);
    if (n == 0) return 0;
    for (size_t i = 0; i < p->n_hosts; i++)
        if (strlen(p->hosts[i]) == n && strncasecmp(p->hosts[i], host, n) == 0) return 1;
    return 0;
}

int http_policy_is_json(const char *ct) {
    static const char mt[] = "application/json";
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, mt, sizeof mt - 1) != 0) return 0;
    ct += sizeof mt - 1;
    while (*ct == ' ' || *ct == '\t') ct++;
    return *ct == '\0' || *ct == ';';
}

const char *http_policy_cors(const http_policy *p, const char *origin) {
    if (!origin || !*origin) return NULL;
    if (p->any_origin) return "*";
    for (size_t i = 0; i < p->n_origins; i++)
        if (strcasecmp(p->origins[i], origin) == 0) return origin;
    return NULL;
}

int http_policy_auth_ok(const http_policy *p, const char *h) {
    if (!p->has_key) return 1;
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    uint8_t d[32];
    if (sha256_buffer(h, strlen(h), d) != 0) return 0;
    /* constant time: always all 32 bytes, no early exit */
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < sizeof d; i++) diff |= (uint8_t)(d[i] ^ p->key_digest[i]);
    return diff == 0;
}
