/*
 * api_error.h - the error a client of the OpenAI-compatible API gets: an HTTP
 * status and the body {"error":{"message","type","param","code"}}, with the
 * type that OpenAI uses for the status (400 invalid_request_error, 401
 * authentication_error, 404 not_found_error, 429 rate_limit_error, 500
 * server_error, 503 service_unavailable_error).
 *
 * Request parsing (request.h) fills one, the HTTP layer (http.h) answers with
 * it, and a stream that fails sends its body as an SSE event (render.h).
 *
 * Memory: an api_error is a plain value; param, code and type point at
 * static strings (or strings that outlive it). Threads: reentrant. Errors:
 * api_error_set always returns -1 (so parsers can `return api_error_set(..)`).
 */
#ifndef ORCH_API_ERROR_H
#define ORCH_API_ERROR_H

#include "orchestrator/core/strbuf.h"

typedef struct api_error {
    unsigned status;   /* HTTP status */
    const char *type;  /* from the status */
    const char *param; /* the request field at fault, or NULL (null) */
    const char *code;  /* machine-readable code, or NULL (null) */
    char msg[512];     /* human-readable message */
} api_error;

/* Fill e (the message printf-style, truncated to fit). Returns -1. */
int api_error_set(api_error *e, unsigned status, const char *param, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Append {"error":{...}} for e. */
void api_error_json(strbuf *b, const api_error *e);

#endif
