/*
 * tool_calls.c - tools / tool_choice -> call grammar; generated text -> call;
 * conversation tool calls -> text. See tool_calls.h.
 */
#include "orchestrator/serve/tool_calls.h"

#include <stdio.h>
#include <string.h>

#include "orchestrator/core/rng.h"
#include "orchestrator/serve/json_schema.h"

static const char HEADER[] = "{\"name\":\"";
static const char ARGS_KEY[] = "\",\"arguments\":";

static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int bad(api_error *e, const char *param, const char *fmt, const char *a,
               const char *b) {
    return api_error_set(e, 400, param, "invalid_value", fmt, a, b);
}

/* One call of function f (tools[i]) as a regex. */
static int call_regex(const cJSON *f, int i, strbuf *re, api_error *e) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    strbuf_puts(re, "\\{\"name\":\"");
    json_schema_regex_literal(re, name->valuestring, strlen(name->valuestring));
    strbuf_puts(re, "\",\"arguments\":");
    if (!params || cJSON_IsNull(params)) {
        strbuf_puts(re, "\\{\\}");
    } else {
        char path[64], err[512];
        snprintf(path, sizeof path, "tools[%d].function.parameters", i);
        if (!cJSON_IsObject(params))
            return api_error_set(e, 400, "tools", "invalid_value",
                                 "%s: must be a JSON Schema object", path);
        if (json_schema_to_regex(params, path, re, err, sizeof err) != 0)
            return api_error_set(e, 400, "tools", "invalid_value", "%s", err);
    }
    strbuf_puts(re, "\\}");
    return 0;
}

int tool_calls_parse(const cJSON *root, int *mode, strbuf *re, api_error *e) {
    *mode = TOOL_MODE_NONE;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls");
    if (cJSON_IsNull(tools)) tools = NULL;
    if (cJSON_IsNull(choice)) choice = NULL;
    if (par && !cJSON_IsNull(par) && !cJSON_IsBool(par))
        return api_error_set(e, 400, "parallel_tool_calls", "invalid_type",
                             "'parallel_tool_calls' must be a boolean");
    if (cJSON_GetObjectItemCaseSensitive(root, "functions") ||
        cJSON_GetObjectItemCaseSensitive(root, "function_call"))
        return api_error_set(e, 400, "functions", "unsupported_parameter",
                             "'functions' / 'function_call' are not supported; use "
                             "'tools' / 'tool_choice'");
    if (!tools) {
        if (choice)
            return api_error_set(e, 400, "tool_choice", "invalid_value",
                                 "'tool_choice' is only allowed when 'tools' are given");
        return 0;
    }
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0)
        return api_error_set(e, 400, "tools", "invalid_type",
                             "'tools' must be a non-empty array");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char p[64];
        snprintf(p, sizeof p, "tools[%d]", i);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "function") != 0)
            return bad(e, "tools", "%s.type: only \"function\" tools are supported%s", p,
                       "");
        if (!cJSON_IsObject(f))
            return bad(e, "tools", "%s.function: must be an object%s", p, "");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(name) || !name_ok(name->valuestring))
            return bad(e, "tools",
                       "%s.function.name: must be 1 to 64 of a-z, A-Z, 0-9, _ and -%s", p,
                       "");
        const cJSON *k;
        cJSON_ArrayForEach(k, f) {
            if (strcmp(k->string, "name") && strcmp(k->string, "description") &&
                strcmp(k->string, "parameters") && strcmp(k->string, "strict"))
                return bad(e, "tools", "%s.function: the field '%.64s' is not supported",
                           p, k->string);
        }
        for (const cJSON *u = tools->child; u != t; u = u->next) {
            const cJSON *un = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(u, "function"), "name");
            if (strcmp(un->valuestring, name->valuestring) == 0)
                return bad(e, "tools", "%s.function.name: '%s' is defined twice", p,
                           name->valuestring);
        }
        i++;
    }
    const char *named = NULL;
    int m = TOOL_MODE_AUTO;
    if (cJSON_IsString(choice)) {
        const char *c = choice->valuestring;
        if (strcmp(c, "none") == 0)
            m = TOOL_MODE_NONE;
        else if (strcmp(c, "required") == 0)
            m = TOOL_MODE_CALL;
        else if (strcmp(c, "auto") != 0)
            return api_error_set(e, 400, "tool_choice", "invalid_value",
                                 "'tool_choice' must be none, auto, required or "
                                 "{\"type\":\"function\",\"function\":{\"name\":...}}");
    } else if (choice) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsObject(choice) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
            return api_error_set(e, 400, "tool_choice", "invalid_value",
                                 "'tool_choice' must be none, auto, required or "
                                 "{\"type\":\"function\",\"function\":{\"name\":...}}");
        named = name->valuestring;
        m = TOOL_MODE_CALL;
    }
    /* every function's parameters are checked, whichever is used */
    strbuf calls = { 0 };
    int n_calls = 0, rc = 0;
    i = 0;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        strbuf one = { 0 };
        if (call_regex(f, i, &one, e) != 0) {
            strbuf_free(&one);
            rc = -1;
            break;
        }
        if (!named || strcmp(named, name->valuestring) == 0) {
            strbuf_puts(&calls, n_calls++ ? "|" : "");
            strbuf_put(&calls, one.p, one.len);
        }
        strbuf_free(&one);
        i++;
    }
    if (rc == 0 && named && n_calls == 0)
        rc = api_error_set(e, 400, "tool_choice", "invalid_value",
                           "tool_choice names the function '%.64s', which is not in "
                           "'tools'",
                           named);
    if (rc == 0 && m != TOOL_MODE_NONE) {
        if (m == TOOL_MODE_AUTO)
            strbuf_puts(re, "(?:(?:");
        else
            strbuf_puts(re, "(?:");
        strbuf_put(re, calls.p, calls.len);
        strbuf_puts(re, m == TOOL_MODE_AUTO ? ")|[^{][\\s\\S]*)?" : ")");
        if (re->oom) rc = api_error_set(e, 500, NULL, NULL, "out of memory");
    }
    strbuf_free(&calls);
    if (rc == 0) *mode = m;
    return rc;
}

void tool_call_read(const char *text, size_t len, tool_call_view *v) {
    memset(v, 0, sizeof *v);
    if (len == 0 || text[0] != '{') return;
    v->is_call = 1;
    size_t hl = sizeof HEADER - 1;
    if (len < hl || memcmp(text, HEADER, hl) != 0) return;
    const char *q = memchr(text + hl, '"', len - hl);
    if (!q) return;
    size_t name_len = (size_t)(q - (text + hl));
    size_t after = hl + name_len, al = sizeof ARGS_KEY - 1;
    if (len < after + al || memcmp(text + after, ARGS_KEY, al) != 0) return;
    v->header = 1;
    v->name = text + hl;
    v->name_len = name_len;
    v->args_off = after + al;
}

void tool_call_id(const char *response_id, uint32_t choice, char out[24]) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = response_id; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h ^= (uint64_t)choice * 0x9E3779B97F4A7C15ull;
    uint64_t z = rng_splitmix64(&h);
    snprintf(out, 24, "call_%016llx", (unsigned long long)z);
}

int tool_calls_message_text(const cJSON *tool_calls, int idx, strbuf *out, api_error *e) {
    if (!cJSON_IsArray(tool_calls))
        return api_error_set(e, 400, "messages", "invalid_type",
                             "messages[%d].tool_calls must be an array", idx);
    int j = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, tool_calls) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(c, "id");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsObject(c) || !cJSON_IsString(id) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name) ||
            !cJSON_IsString(args))
            return api_error_set(e, 400, "messages", "invalid_value",
                                 "messages[%d].tool_calls[%d] must be {\"id\":STRING,"
                                 "\"type\":\"function\",\"function\":{\"name\":STRING,"
                                 "\"arguments\":STRING}}",
                                 idx, j);
        if (out->len) strbuf_puts(out, "\n");
        strbuf_puts(out, HEADER);
        strbuf_puts(out, name->valuestring);
        strbuf_puts(out, ARGS_KEY);
        strbuf_puts(out, args->valuestring);
        strbuf_puts(out, "}");
        j++;
    }
    return 0;
}
