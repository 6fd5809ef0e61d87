/*
 * http_policy.h - what `orch serve` checks in a request's headers before it
 * looks at the body: the Host (DNS rebinding), the media type of JSON bodies
 * (cross-site form posts), CORS origins, and the API key.
 *
 *   Host: when the server is bound to a loopback address (127.0.0.0/8), only
 *     loopback names are accepted: localhost, 127.0.0.1, [::1], the bound
 *     address itself, each with any port or none, plus every --allowed-host
 *     name (any port). Bound elsewhere, any Host is accepted unless
 *     --allowed-host names are given, which then (with the loopback names)
 *     are the only ones. Names compare case-insensitively. A request without
 *     Host is accepted only in HTTP/1.0 (HTTP/1.1 requires it).
 *   Content-Type of JSON routes: application/json, optionally with
 *     parameters (e.g. "; charset=utf-8"), any case.
 *   CORS: an Origin listed in --cors-origin (exactly, or any with "*") gets
 *     Access-Control-Allow-Origin (the origin itself, or "*") and Vary:
 *     Origin; preflight (OPTIONS) is answered only for such an origin.
 *     Without --cors-origin no CORS header is ever sent.
 *   API key: "Authorization: Bearer KEY" compared as SHA-256 digests with a
 *     constant-time comparison, so the time taken depends neither on where
 *     a wrong key differs nor on the key's length.
 *
 * Memory: a policy copies the strings it is given; http_policy_free releases
 * them. Threads: immutable after http_policy_init; the checks are reentrant.
 * Errors: http_policy_init returns -1 with a message (out of memory, an
 * empty --allowed-host or --cors-origin value).
 */
#ifndef ORCH_HTTP_POLICY_H
#define ORCH_HTTP_POLICY_H

#include <stddef.h>
#include <stdint.h>

typedef struct http_policy_config {
    const char *bind_host;            /* the IPv4 address bound (dotted quad) */
    const char *const *allowed_hosts; /* --allowed-host values */
    size_t n_allowed_hosts;
    const char *const *cors_origins; /* --cors-origin values ("*" = any) */
    size_t n_cors_origins;
    const char *api_key; /* NULL or "" = none */
} http_policy_config;

typedef struct http_policy {
    int check_host; /* Host names are restricted */
    char **hosts;   /* accepted names, lower case, without port */
    size_t n_hosts;
    char **origins;
    size_t n_origins;
    int any_origin;
    int has_key;
    uint8_t key_digest[32];
} http_policy;

int http_policy_init(http_policy *p, const http_policy_config *c, char *err,
                     size_t err_cap);
void http_policy_free(http_policy *p);

/* 1 when the Host header value (NULL: absent) is accepted; http10: the
 * request is HTTP/1.0. */
int http_policy_host_ok(const http_policy *p, const char *host, int http10);
/* 1 when a Content-Type value (NULL: absent) is application/json. */
int http_policy_is_json(const char *content_type);
/* The Access-Control-Allow-Origin value for an Origin header (NULL: absent),
 * or NULL when that origin gets no CORS headers. Points into p or origin. */
const char *http_policy_cors(const http_policy *p, const char *origin);
/* 1 when no key is set or the Authorization value carries the key. */
int http_policy_auth_ok(const http_policy *p, const char *authorization);

#endif
