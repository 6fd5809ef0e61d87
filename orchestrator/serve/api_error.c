/*
 * api_error.c - OpenAI-shaped API errors. See api_error.h.
 */
#include "orchestrator/serve/api_error.h"

#include <stdarg.h>
#include <stdio.h>

#include "orchestrator/core/json_writer.h"

static const char *type_of(unsigned status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "service_unavailable_error";
    default: return "invalid_request_error";
    }
}

int api_error_set(api_error *e, unsigned status, const char *param, const char *code,
                  const char *fmt, ...) {
    e->status = status;
    e->type = type_of(status);
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON string, or null for NULL. */
static void string_or_null(strbuf *b, const char *s) {
    if (s)
        json_write_cstring(b, s);
    else
        strbuf_puts(b, "null");
}

void api_error_json(strbuf *b, const api_error *e) {
    strbuf_puts(b, "{\"error\":{\"message\":");
    json_write_cstring(b, e->msg);
    strbuf_puts(b, ",\"type\":");
    json_write_cstring(b, e->type);
    strbuf_puts(b, ",\"param\":");
    string_or_null(b, e->param);
    strbuf_puts(b, ",\"code\":");
    string_or_null(b, e->code);
    strbuf_puts(b, "}}");
}
