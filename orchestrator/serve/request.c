/*
 * request.c - JSON body -> validated gen_request -> scheduler sequences.
 * See request.h.
 */
#include "orchestrator/serve/request.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/json_schema.h"
#include "orchestrator/serve/json_strict.h"
#include "orchestrator/serve/tool_calls.h"

/* ------------------------------------------------------------------------- */
/* Field readers                                                              */
/* ------------------------------------------------------------------------- */
/* The member k of root; a JSON null counts as absent. */
static cJSON *field(const cJSON *root, const char *k) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(root, k);
    return (x && cJSON_IsNull(x)) ? NULL : x;
}

static int get_bool(const cJSON *root, const char *k, int *out, api_error *e) {
    cJSON *x = field(root, k);
    if (!x) return 0;
    if (!cJSON_IsBool(x))
        return api_error_set(e, 400, k, "invalid_type", "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(x);
    return 0;
}

/* Integer in [lo, hi]; *present set when given. */
static int get_int(const cJSON *root, const char *k, double lo, double hi, int64_t *out,
                   int *present, api_error *e) {
    cJSON *x = field(root, k);
    if (present) *present = 0;
    if (!x) return 0;
    if (!cJSON_IsNumber(x))
        return api_error_set(e, 400, k, "invalid_type", "'%s' must be an integer", k);
    double v = x->valuedouble;
    if (!isfinite(v) || v != floor(v))
        return api_error_set(e, 400, k, "invalid_type", "'%s' must be an integer", k);
    if (v < lo || v > hi)
        return api_error_set(e, 400, k, "invalid_value",
                             "'%s' must be between %.0f and %.0f, got %.17g", k, lo, hi,
                             v);
    *out = (int64_t)v;
    if (present) *present = 1;
    return 0;
}

/* Number in [lo, hi] (lo excluded when lo_open). */
static int get_num(const cJSON *root, const char *k, double lo, double hi, int lo_open,
                   double *out, api_error *e) {
    cJSON *x = field(root, k);
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble))
        return api_error_set(e, 400, k, "invalid_type", "'%s' must be a number", k);
    double v = x->valuedouble;
    if (v < lo || v > hi || (lo_open && v == lo))
        return api_error_set(e, 400, k, "invalid_value",
                             "'%s' must be in %s%g, %g], got %.17g", k,
                             lo_open ? "(" : "[", lo, hi, v);
    *out = v;
    return 0;
}

/* The chat template of the limits: NULL when none is usable (chat_error). */
static const chat_template *lim_template(const request_limits *lim) {
    if (lim->chat_template) return lim->chat_template;
    return lim->chat_error ? NULL : chat_template_plain();
}

/* ------------------------------------------------------------------------- */
/* Prompts                                                                    */
/* ------------------------------------------------------------------------- */
static int alloc_prompts(gen_request *r, uint32_t n, api_error *e) {
    r->prompts = util_calloc(n, sizeof *r->prompts);
    if (!r->prompts) return api_error_set(e, 500, NULL, NULL, "out of memory");
    return 0;
}

/* Take ids (malloc'd, n of them) as the next prompt. */
static int add_prompt_ids(const request_limits *lim, gen_request *r, int32_t *ids,
                          uint32_t n, api_error *e) {
    gen_prompt *p = &r->prompts[r->n_prompts++];
    p->ids = ids;
    p->n_ids = n;
    char err[256];
    if (tokenizer_decode(lim->tok, ids, n, &p->text, &p->text_len, err, sizeof err) != 0)
        return api_error_set(e, 400, "prompt", "invalid_value", "prompt: %s", err);
    if (n == 0)
        return api_error_set(e, 400, "prompt", "invalid_value", "the prompt is empty");
    return 0;
}

/* The prompt (param) has at least n tokens, n >= the context. */
static int too_long(const request_limits *lim, const char *param, uint64_t n, int exact,
                    size_t bytes, api_error *e) {
    if (exact)
        return api_error_set(e, 400, param, "context_length_exceeded",
                             "This model's maximum context length is %u tokens, but the "
                             "%s has %" PRIu64 " tokens. Please shorten it.",
                             lim->context, param, n);
    return api_error_set(e, 400, param, "context_length_exceeded",
                         "This model's maximum context length is %u tokens, but the %s "
                         "has at least %" PRIu64
                         " tokens (%zu bytes). Please shorten it.",
                         lim->context, param, n, bytes);
}

/* tokenizer_encode_stream sink: collect ids, stop at the context. */
typedef struct enc_acc {
    int32_t *ids;
    size_t n, cap, limit;
    int over, oom;
} enc_acc;

static int enc_sink(void *user, const int32_t *ids, size_t n, size_t bytes_done) {
    (void)bytes_done;
    enc_acc *a = user;
    if (a->n + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap < a->n + n + 1) cap *= 2;
        int32_t *p = realloc(a->ids, cap * sizeof *p);
        if (!p) {
            a->oom = 1;
            return 1;
        }
        a->ids = p;
        a->cap = cap;
    }
    memcpy(a->ids + a->n, ids, n * sizeof *ids);
    a->n += n;
    a->over = a->n >= a->limit;
    return a->over;
}

/* Text -> the next prompt. A text certain not to fit the context is refused
 * before any work (every token is at most max_token_bytes long, so it has at
 * least len / max_token_bytes tokens), and tokenizing stops once the tokens
 * fill the context. */
static int add_prompt_text(const request_limits *lim, gen_request *r, const char *s,
                           size_t len, const char *param, api_error *e) {
    uint32_t mtb = lim->max_token_bytes;
    if (mtb && lim->context && len / mtb >= lim->context)
        return too_long(lim, param, len / mtb, mtb == 1, len, e);
    enc_acc a = { .limit = lim->context ? lim->context : SIZE_MAX };
    char err[256] = "";
    int rc = tokenizer_encode_stream(lim->tok, s, len, enc_sink, &a, err, sizeof err);
    if (a.over) {
        free(a.ids);
        return too_long(lim, param, a.n, 0, len, e);
    }
    if (a.oom || (rc == 0 && !a.ids && !(a.ids = malloc(sizeof *a.ids)))) {
        free(a.ids);
        return api_error_set(e, 500, NULL, NULL, "out of memory");
    }
    if (rc != 0) {
        free(a.ids);
        return api_error_set(e, 400, param, "invalid_value", "%s: %s", param, err);
    }
    /* The model's BOS (tokenizer_config's add_bos_token), unless the text,
     * e.g. a chat template's, already starts with it. */
    if (tokenizer_prepend_bos(lim->tok, &a.ids, &a.n) < 0) {
        free(a.ids);
        return api_error_set(e, 500, NULL, NULL, "out of memory");
    }
    if (a.n >= a.limit) {
        free(a.ids);
        return too_long(lim, param, a.n, 0, len, e);
    }
    if (a.n > UINT32_MAX) a.n = UINT32_MAX;
    return add_prompt_ids(lim, r, a.ids, (uint32_t)a.n, e);
}

/* A JSON array of token ids -> malloc'd ids. */
static int token_array(const request_limits *lim, const cJSON *arr, int32_t **out,
                       uint32_t *n_out, api_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (lim->context && (uint32_t)n >= lim->context) /* before decoding it */
        return too_long(lim, "prompt", (uint64_t)n, 1, 0, e);
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids) return api_error_set(e, 500, NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1.5;
        if (!cJSON_IsNumber(it) || v != floor(v) || v < 0 || v >= (double)lim->vocab) {
            free(ids);
            return api_error_set(
                e, 400, "prompt", "invalid_value",
                "prompt: token ids must be integers in [0, %u); element %d is not",
                lim->vocab, i);
        }
        ids[i++] = (int32_t)v;
    }
    *out = ids;
    *n_out = (uint32_t)i;
    return 0;
}

static int add_prompt_array(const request_limits *lim, gen_request *r, const cJSON *arr,
                            api_error *e) {
    int32_t *ids = NULL;
    uint32_t len = 0;
    if (token_array(lim, arr, &ids, &len, e)) return -1;
    return add_prompt_ids(lim, r, ids, len, e);
}

/* Completions 'prompt': a string, token ids, or a list of either. */
static int parse_prompt(const request_limits *lim, gen_request *r, const cJSON *root,
                        api_error *e) {
    const cJSON *p = field(root, "prompt");
    if (!p)
        return api_error_set(e, 400, "prompt", "missing_required_parameter",
                             "'prompt' is required");
    if (cJSON_IsString(p)) {
        if (alloc_prompts(r, 1, e)) return -1;
        return add_prompt_text(lim, r, p->valuestring, strlen(p->valuestring), "prompt",
                               e);
    }
    if (!cJSON_IsArray(p))
        return api_error_set(
            e, 400, "prompt", "invalid_type",
            "'prompt' must be a string, an array of token ids, or an array of either");
    int n = cJSON_GetArraySize(p);
    if (n == 0)
        return api_error_set(e, 400, "prompt", "invalid_value",
                             "'prompt' is an empty array");
    if (cJSON_IsNumber(p->child)) { /* one prompt as token ids */
        if (alloc_prompts(r, 1, e)) return -1;
        return add_prompt_array(lim, r, p, e);
    }
    if ((uint32_t)n > lim->max_seqs)
        return api_error_set(e, 400, "prompt", "invalid_value",
                             "at most %u prompts per request, got %d", lim->max_seqs, n);
    if (alloc_prompts(r, (uint32_t)n, e)) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        if (cJSON_IsString(it)) {
            if (add_prompt_text(lim, r, it->valuestring, strlen(it->valuestring),
                                "prompt", e))
                return -1;
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) > 0 &&
                   cJSON_IsNumber(it->child)) {
            if (add_prompt_array(lim, r, it, e)) return -1;
        } else {
            return api_error_set(
                e, 400, "prompt", "invalid_type",
                "prompt[%u] must be a string or a non-empty array of token ids",
                r->n_prompts);
        }
    }
    return 0;
}

/* Chat content: a string, or an array of {"type":"text","text":...} parts
 * (joined); null only for assistant messages. malloc'd into *out. */
static int chat_content(const cJSON *m, int idx, const char *role, char **out,
                        size_t *len, api_error *e) {
    const cJSON *c = field(m, "content");
    if (!c) {
        if (strcmp(role, "assistant") == 0) {
            *out = calloc(1, 1);
            *len = 0;
            return *out ? 0 : api_error_set(e, 500, NULL, NULL, "out of memory");
        }
        return api_error_set(e, 400, "messages", "missing_required_parameter",
                             "messages[%d].content is required", idx);
    }
    if (cJSON_IsString(c)) {
        *len = strlen(c->valuestring);
        *out = malloc(*len + 1);
        if (!*out) return api_error_set(e, 500, NULL, NULL, "out of memory");
        memcpy(*out, c->valuestring, *len + 1);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return api_error_set(
            e, 400, "messages", "invalid_type",
            "messages[%d].content must be a string or an array of text parts", idx);
    strbuf b = { 0 };
    strbuf_reserve(&b, 0);
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) ||
            strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
            free(b.p);
            return api_error_set(
                e, 400, "messages", "invalid_value",
                "messages[%d].content[%d] must be {\"type\":\"text\",\"text\":STRING} "
                "(only text parts are supported)",
                idx, k);
        }
        strbuf_puts(&b, text->valuestring);
        k++;
    }
    if (b.oom || !b.p) {
        free(b.p);
        return api_error_set(e, 500, NULL, NULL, "out of memory");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}

/* messages[] -> chat_message[] (contents malloc'd into contents[]). */
static int read_messages(const chat_template *t, const cJSON *msgs, chat_message *cm,
                         char **contents, api_error *e) {
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return api_error_set(e, 400, "messages", "invalid_type",
                                 "messages[%d] must be an object with a string 'role'",
                                 i);
        if (!chat_template_role_valid(role->valuestring))
            return api_error_set(
                e, 400, "messages", "invalid_value",
                "messages[%d].role '%.64s' is not one of system, developer, user, "
                "assistant, tool",
                i, role->valuestring);
        size_t len = 0;
        int is_tool = strcmp(role->valuestring, "tool") == 0;
        const cJSON *calls = field(m, "tool_calls");
        if (is_tool && !cJSON_IsString(field(m, "tool_call_id")))
            return api_error_set(e, 400, "messages", "missing_required_parameter",
                                 "messages[%d].tool_call_id (a string) is required for "
                                 "role tool",
                                 i);
        if (calls && strcmp(role->valuestring, "assistant") != 0)
            return api_error_set(e, 400, "messages", "invalid_value",
                                 "messages[%d].tool_calls is only allowed on assistant "
                                 "messages",
                                 i);
        if ((calls || is_tool) && !t->tools)
            return api_error_set(
                e, 400, "messages", "invalid_value",
                "messages[%d]%s: tool calls and results are not "
                "supported by the %s chat template (only " CHAT_TEMPLATE_PLAIN_NAME
                " renders them)",
                i, calls ? ".tool_calls" : ".role 'tool'", t->name);
        if (chat_content(m, i, role->valuestring, &contents[i], &len, e)) return -1;
        if (calls) { /* the calls as the model writes them, after the content */
            strbuf b = { 0 };
            strbuf_put(&b, contents[i], len);
            if (len) strbuf_puts(&b, "\n");
            strbuf t = { 0 };
            int rc = tool_calls_message_text(calls, i, &t, e);
            strbuf_put(&b, t.p ? t.p : "", t.len);
            strbuf_free(&t);
            if (rc) {
                strbuf_free(&b);
                return -1;
            }
            if (b.oom || !b.p) {
                strbuf_free(&b);
                return api_error_set(e, 500, NULL, NULL, "out of memory");
            }
            free(contents[i]);
            contents[i] = b.p;
            len = b.len;
        }
        cm[i].role = role->valuestring;
        cm[i].content = contents[i];
        cm[i].content_len = len;
        i++;
    }
    return 0;
}

/* Chat 'messages': rendered through the template into the one prompt. */
static int parse_messages(const request_limits *lim, gen_request *r, const cJSON *root,
                          api_error *e) {
    const cJSON *msgs = field(root, "messages");
    if (!msgs)
        return api_error_set(e, 400, "messages", "missing_required_parameter",
                             "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return api_error_set(e, 400, "messages", "invalid_type",
                             "'messages' must be a non-empty array");
    /* with tools (checked by parse_structured), a first system line lists
     * them for the model: "Tools: <the tools array, compact JSON>" */
    const cJSON *tools = field(root, "tools");
    int off = cJSON_IsArray(tools) ? 1 : 0;
    int n = cJSON_GetArraySize(msgs) + off;
    chat_message *cm = util_calloc((size_t)n, sizeof *cm);
    char **contents = util_calloc((size_t)n, sizeof *contents);
    int rc = 0;
    if (!cm || !contents) rc = api_error_set(e, 500, NULL, NULL, "out of memory");
    if (!rc && off) {
        char *js = cJSON_PrintUnformatted(tools);
        strbuf b = { 0 };
        strbuf_puts(&b, "Tools: ");
        strbuf_puts(&b, js ? js : "");
        cJSON_free(js);
        if (!js || b.oom) {
            strbuf_free(&b);
            rc = api_error_set(e, 500, NULL, NULL, "out of memory");
        } else {
            contents[0] = b.p;
            cm[0] =
                (chat_message){ .role = "system", .content = b.p, .content_len = b.len };
        }
    }
    const chat_template *t = lim_template(lim);
    if (!rc) rc = read_messages(t, msgs, cm + off, contents + off, e);
    if (!rc) {
        char *text = NULL;
        size_t tl = 0;
        char err[512];
        if (chat_template_render(t, cm, (size_t)n, 1, &text, &tl, err, sizeof err) != 0)
            rc = api_error_set(e, 400, "messages", "invalid_value", "%s", err);
        else if (tl == 0)
            rc = api_error_set(e, 400, "messages", "invalid_value",
                               "messages: the %s chat template renders them as an empty "
                               "prompt",
                               t->name);
        else if (alloc_prompts(r, 1, e))
            rc = -1;
        else
            rc = add_prompt_text(lim, r, text, tl, "messages", e);
        free(text);
    }
    for (int k = 0; contents && k < n; k++) free(contents[k]);
    free(contents);
    free(cm);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* Stop strings                                                               */
/* ------------------------------------------------------------------------- */
static int add_stop(gen_request *r, const char *s, api_error *e) {
    size_t l = strlen(s);
    if (l == 0)
        return api_error_set(e, 400, "stop", "invalid_value",
                             "stop strings must not be empty");
    if (l > REQUEST_MAX_STOP_LEN)
        return api_error_set(e, 400, "stop", "invalid_value",
                             "stop strings are limited to %u bytes",
                             REQUEST_MAX_STOP_LEN);
    if (r->n_stops >= REQUEST_MAX_STOPS + CHAT_TEMPLATE_MAX_STOPS)
        return api_error_set(e, 400, "stop", "invalid_value", "at most %u stop strings",
                             REQUEST_MAX_STOPS);
    char *d = malloc(l + 1);
    if (!d) return api_error_set(e, 500, NULL, NULL, "out of memory");
    memcpy(d, s, l + 1);
    r->stops[r->n_stops++] = d;
    return 0;
}

static int parse_stop(const request_limits *lim, gen_request *r, const cJSON *root,
                      api_error *e) {
    r->stops = util_calloc(REQUEST_MAX_STOPS + CHAT_TEMPLATE_MAX_STOPS, sizeof *r->stops);
    if (!r->stops) return api_error_set(e, 500, NULL, NULL, "out of memory");
    const cJSON *st = field(root, "stop");
    static const char *const bad_type = "'stop' must be a string or an array of strings";
    if (st && cJSON_IsString(st)) {
        if (add_stop(r, st->valuestring, e)) return -1;
    } else if (st && cJSON_IsArray(st)) {
        if ((unsigned)cJSON_GetArraySize(st) > REQUEST_MAX_STOPS)
            return api_error_set(e, 400, "stop", "invalid_value",
                                 "at most %u stop strings", REQUEST_MAX_STOPS);
        const cJSON *it;
        cJSON_ArrayForEach(it, st) {
            if (!cJSON_IsString(it))
                return api_error_set(e, 400, "stop", "invalid_type", "%s", bad_type);
            if (add_stop(r, it->valuestring, e)) return -1;
        }
    } else if (st) {
        return api_error_set(e, 400, "stop", "invalid_type", "%s", bad_type);
    }
    const chat_template *t = r->chat ? lim_template(lim) : NULL;
    for (unsigned i = 0; t && i < t->n_stops; i++)
        if (add_stop(r, t->stops[i], e)) return -1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* The request                                                                */
/* ------------------------------------------------------------------------- */
/* 'model', when given, names the served model (or another served model:
 * an adapter). */
static int check_model(const request_limits *lim, const cJSON *root, gen_request *r,
                       api_error *e) {
    const cJSON *model = field(root, "model");
    if (model && !cJSON_IsString(model))
        return api_error_set(e, 400, "model", "invalid_type", "'model' must be a string");
    if (model && strlen(model->valuestring) < sizeof r->model)
        snprintf(r->model, sizeof r->model, "%s", model->valuestring);
    if (model && strcmp(model->valuestring, lim->model_name) != 0 &&
        !(lim->model_known && strlen(model->valuestring) < sizeof r->model &&
          lim->model_known(lim->model_known_arg, model->valuestring))) {
        api_error_set(e, 404, "model", "model_not_found",
                      "the model '%.128s' does not exist; this server serves '%.128s'",
                      model->valuestring, lim->model_name);
        e->type = "invalid_request_error"; /* as OpenAI's API answers it */
        return -1;
    }
    return 0;
}

/* Chat needs a usable template (the model's may be of a family orch does not
 * render). */
static int check_template(const request_limits *lim, const gen_request *r, api_error *e) {
    if (r->chat && !lim_template(lim))
        return api_error_set(e, 400, "messages", "unsupported_chat_template", "%s",
                             lim->chat_error);
    return 0;
}

/* Unsupported features: only their neutral values are accepted. */
static int check_unsupported(const gen_request *r, const cJSON *root, api_error *e) {
    if (!r->chat && field(root, "suffix"))
        return api_error_set(e, 400, "suffix", "unsupported_parameter",
                             "'suffix' is not supported");
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Structured output                                                          */
/* ------------------------------------------------------------------------- */
/* A JSON Schema (object, or for structured_outputs.json also a JSON text)
 * -> regex. */
static int schema_regex(const cJSON *schema, const char *param, const char *path,
                        strbuf *re, api_error *e) {
    cJSON *parsed = NULL;
    if (cJSON_IsString(schema)) {
        parsed = cJSON_Parse(schema->valuestring);
        if (!parsed)
            return api_error_set(e, 400, param, "invalid_value",
                                 "%s: the schema string is not valid JSON", path);
        schema = parsed;
    }
    char err[512];
    int rc = 0;
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        rc = api_error_set(e, 400, param, "invalid_value",
                           "%s: must be a JSON Schema object", path);
    else if (json_schema_to_regex(schema, path, re, err, sizeof err) != 0)
        rc = api_error_set(e, 400, param, "invalid_value", "%s", err);
    cJSON_Delete(parsed);
    return rc;
}

/* A list of strings -> an alternation of them. */
static int choice_regex(const cJSON *c, const char *top, const char *param, strbuf *re,
                        api_error *e) {
    if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) == 0)
        return api_error_set(e, 400, top, "invalid_value",
                             "%s: must be a non-empty array of strings", param);
    int i = 0;
    const cJSON *it;
    strbuf_puts(re, "(?:");
    cJSON_ArrayForEach(it, c) {
        if (!cJSON_IsString(it))
            return api_error_set(e, 400, top, "invalid_value", "%s[%d]: must be a string",
                                 param, i);
        if (i++) strbuf_puts(re, "|");
        json_schema_regex_literal(re, it->valuestring, strlen(it->valuestring));
    }
    strbuf_puts(re, ")");
    return 0;
}

static int regex_field(const cJSON *x, const char *top, const char *param, strbuf *re,
                       api_error *e) {
    if (!cJSON_IsString(x))
        return api_error_set(e, 400, top, "invalid_value", "%s: must be a string", param);
    char err[256];
    if (regex_syntax_check(x->valuestring, strlen(x->valuestring), err, sizeof err) != 0)
        return api_error_set(e, 400, top, "invalid_value", "%s: %s", param, err);
    strbuf_puts(re, x->valuestring);
    return 0;
}

/* response_format -> regex (nothing for text). */
static int response_format_regex(const cJSON *rf, strbuf *re, api_error *e) {
    static const char *const P = "response_format";
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(t))
        return api_error_set(e, 400, P, "invalid_value",
                             "response_format must be an object with a string 'type'");
    const cJSON *k;
    cJSON_ArrayForEach(k, rf) {
        if (strcmp(k->string, "type") && strcmp(k->string, "json_schema"))
            return api_error_set(e, 400, P, "invalid_value",
                                 "response_format.%.64s: unknown field", k->string);
    }
    if (strcmp(t->valuestring, "text") == 0) return 0;
    if (strcmp(t->valuestring, "json_object") == 0) {
        json_schema_any_object(re);
        return 0;
    }
    if (strcmp(t->valuestring, "json_schema") != 0)
        return api_error_set(e, 400, P, "invalid_value",
                             "response_format.type must be text, json_object or "
                             "json_schema, got '%.64s'",
                             t->valuestring);
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return api_error_set(e, 400, P, "invalid_value",
                             "response_format.json_schema must be an object");
    cJSON_ArrayForEach(k, js) {
        if (strcmp(k->string, "name") && strcmp(k->string, "schema") &&
            strcmp(k->string, "strict") && strcmp(k->string, "description"))
            return api_error_set(e, 400, P, "invalid_value",
                                 "response_format.json_schema.%.64s: unknown field",
                                 k->string);
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return api_error_set(
            e, 400, P, "invalid_value",
            "response_format.json_schema.name must be a non-empty string");
    if (strict && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return api_error_set(e, 400, P, "invalid_value",
                             "response_format.json_schema.strict must be a boolean");
    if (!schema || cJSON_IsNull(schema)) { /* no schema: any JSON object */
        json_schema_any_object(re);
        return 0;
    }
    return schema_regex(schema, P, "response_format.json_schema.schema", re, e);
}

/* structured_outputs {json|regex|choice|json_object} -> regex. */
static int structured_outputs_regex(const cJSON *so, strbuf *re, api_error *e) {
    static const char *const P = "structured_outputs";
    if (!cJSON_IsObject(so))
        return api_error_set(e, 400, P, "invalid_value",
                             "'structured_outputs' must be an object");
    int given = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, so) {
        if (cJSON_IsNull(k)) continue;
        if (strcmp(k->string, "json") && strcmp(k->string, "regex") &&
            strcmp(k->string, "choice") && strcmp(k->string, "json_object"))
            return api_error_set(
                e, 400, P, "unsupported_parameter",
                "structured_outputs.%.64s is not supported (json, regex, "
                "choice, json_object are)",
                k->string);
        if (strcmp(k->string, "json_object") == 0 && !cJSON_IsTrue(k)) {
            if (cJSON_IsFalse(k)) continue;
            return api_error_set(e, 400, P, "invalid_value",
                                 "structured_outputs.json_object must be a boolean");
        }
        given++;
    }
    if (given != 1)
        return api_error_set(
            e, 400, P, "invalid_value",
            "structured_outputs needs exactly one of json, regex, choice, "
            "json_object");
    const cJSON *x;
    if ((x = field(so, "json")))
        return schema_regex(x, P, "structured_outputs.json", re, e);
    if ((x = field(so, "regex")))
        return regex_field(x, P, "structured_outputs.regex", re, e);
    if ((x = field(so, "choice")))
        return choice_regex(x, P, "structured_outputs.choice", re, e);
    json_schema_any_object(re);
    return 0;
}

/* Every structured-output field -> r->grammar (at most one of them). */
static int parse_structured(const request_limits *lim, gen_request *r, const cJSON *root,
                            api_error *e) {
    strbuf re = { 0 };
    int rc = 0, sources = 0;
    const char *param = NULL;
    const cJSON *x;
    if ((x = field(root, "response_format"))) {
        size_t before = re.len;
        rc = response_format_regex(x, &re, e);
        if (re.len > before) {
            sources++;
            param = "response_format";
        }
    }
    if (!rc && (x = field(root, "structured_outputs"))) {
        sources++;
        param = "structured_outputs";
        rc = structured_outputs_regex(x, &re, e);
    }
    if (!rc && (x = field(root, "guided_json"))) {
        sources++;
        param = "guided_json";
        rc = schema_regex(x, "guided_json", "guided_json", &re, e);
    }
    if (!rc && (x = field(root, "guided_regex"))) {
        sources++;
        param = "guided_regex";
        rc = regex_field(x, "guided_regex", "guided_regex", &re, e);
    }
    if (!rc && (x = field(root, "guided_choice"))) {
        sources++;
        param = "guided_choice";
        rc = choice_regex(x, "guided_choice", "guided_choice", &re, e);
    }
    if (!rc && r->chat && field(root, "tools") && !lim_template(lim)->tools) {
        rc = api_error_set(e, 400, "tools", "unsupported_parameter",
                           "'tools' are not supported by the %s chat template "
                           "(only " CHAT_TEMPLATE_PLAIN_NAME " renders them)",
                           lim_template(lim)->name);
    } else if (!rc && r->chat) {
        size_t before = re.len;
        rc = tool_calls_parse(root, &r->tool_mode, &re, e);
        if (!rc && r->tool_mode != TOOL_MODE_NONE && re.len > before) {
            sources++;
            param = "tools";
        }
    } else if (!rc && (field(root, "tools") || field(root, "tool_choice"))) {
        rc = api_error_set(e, 400, "tools", "unsupported_parameter",
                           "'tools' are only supported on /v1/chat/completions");
    }
    if (!rc && sources > 1)
        rc = api_error_set(e, 400, param, "invalid_value",
                           "only one of response_format (json), structured_outputs, "
                           "guided_json/regex/choice and tools may constrain the output");
    if (!rc && re.oom) rc = api_error_set(e, 500, NULL, NULL, "out of memory");
    if (!rc && sources == 1) {
        if (r->ignore_eos)
            rc = api_error_set(e, 400, "ignore_eos", "invalid_value",
                               "'ignore_eos' cannot be combined with structured output");
        else if (!lim->grammars)
            rc = api_error_set(e, 400, param, "unsupported_parameter",
                               "structured output is not available on this server");
        else {
            char err[300];
            if (grammar_cache_get(lim->grammars, re.p, re.len, &r->grammar, err,
                                  sizeof err) != 0)
                rc = api_error_set(e, 400, param, "invalid_value", "%s: %s", param, err);
        }
    }
    strbuf_free(&re);
    return rc;
}

/* max_tokens (chat: max_completion_tokens wins) as the client gave it. */
typedef struct max_tokens_arg {
    int64_t value;
    int given;
    const char *param; /* the field it came from (for errors) */
} max_tokens_arg;

/* Sampling, n, seed, max_tokens. */
static int parse_sampling(gen_request *r, const cJSON *root, max_tokens_arg *mt,
                          api_error *e) {
    double temperature = 1.0, top_p = 1.0;
    int64_t top_k = 0, n = 1, seed = 0, best_of = 1;
    if (get_num(root, "temperature", 0, 2, 0, &temperature, e)) return -1;
    if (get_num(root, "top_p", 0, 1, 1, &top_p, e)) return -1;
    if (get_int(root, "top_k", -1, 1e9, &top_k, NULL, e)) return -1;
    if (get_int(root, "n", 1, 128, &n, NULL, e)) return -1;
    if (get_int(root, "best_of", 1, 128, &best_of, NULL, e)) return -1;
    if (best_of != 1 && best_of != n)
        return api_error_set(e, 400, "best_of", "unsupported_parameter",
                             "'best_of' other than n is not supported");
    if (get_int(root, "seed", -9223372036854775808.0, 9223372036854774784.0, &seed,
                &r->has_seed, e))
        return -1;
    mt->value = -1;
    mt->param = "max_tokens";
    if (get_int(root, "max_tokens", 0, 1e9, &mt->value, &mt->given, e)) return -1;
    if (r->chat) {
        int64_t mct = 0;
        int has_mct = 0;
        if (get_int(root, "max_completion_tokens", 0, 1e9, &mct, &has_mct, e)) return -1;
        if (has_mct) {
            mt->value = mct;
            mt->given = 1;
            mt->param = "max_completion_tokens";
        }
    }
    double min_p = 0, presence = 0, frequency = 0, repetition = 1;
    if (get_num(root, "min_p", 0, 1, 0, &min_p, e)) return -1;
    if (get_num(root, "presence_penalty", -2, 2, 0, &presence, e)) return -1;
    if (get_num(root, "frequency_penalty", -2, 2, 0, &frequency, e)) return -1;
    if (get_num(root, "repetition_penalty", 0, 10, 1, &repetition, e)) return -1;
    r->sampling.temperature = (float)temperature;
    r->sampling.top_p = (float)top_p;
    r->sampling.top_k = top_k > 0 ? (uint32_t)top_k : 0;
    r->sampling.min_p = (float)min_p;
    r->sampling.presence_penalty = (float)presence;
    r->sampling.frequency_penalty = (float)frequency;
    r->sampling.repetition_penalty = (float)repetition;
    r->n = (uint32_t)n;
    r->seed = (uint64_t)seed;
    return 0;
}

/* stream, ignore_eos, stream_options, logprobs, echo. */
static int parse_output(gen_request *r, const cJSON *root, api_error *e) {
    if (get_bool(root, "stream", &r->stream, e)) return -1;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so))
            return api_error_set(e, 400, "stream_options", "invalid_type",
                                 "'stream_options' must be an object");
        if (!r->stream)
            return api_error_set(
                e, 400, "stream_options", "invalid_value",
                "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    int64_t lp = 0;
    int has_lp = 0;
    if (r->chat) {
        int on = 0;
        if (get_bool(root, "logprobs", &on, e)) return -1;
        if (get_int(root, "top_logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &lp, &has_lp, e))
            return -1;
        if (has_lp && !on)
            return api_error_set(e, 400, "top_logprobs", "invalid_value",
                                 "'top_logprobs' requires 'logprobs': true");
        r->logprobs = on;
    } else {
        if (get_bool(root, "echo", &r->echo, e)) return -1;
        if (get_int(root, "logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &lp, &has_lp, e))
            return -1;
        r->logprobs = has_lp;
    }
    r->top_logprobs = (uint32_t)lp;
    return 0;
}

/* logit_bias {"token id": bias in [-100, 100]}, stop_token_ids [id...],
 * min_tokens. */
static int parse_token_controls(const request_limits *lim, gen_request *r,
                                const cJSON *root, api_error *e) {
    const cJSON *lb = field(root, "logit_bias");
    if (lb && !cJSON_IsObject(lb))
        return api_error_set(e, 400, "logit_bias", "invalid_type",
                             "'logit_bias' must be an object of token id: bias");
    uint32_t nb = 0;
    const cJSON *it;
    if (lb) cJSON_ArrayForEach(it, lb) nb++;
    if (nb > REQUEST_MAX_LOGIT_BIAS)
        return api_error_set(e, 400, "logit_bias", "invalid_value",
                             "'logit_bias' has %u entries; at most %u", nb,
                             REQUEST_MAX_LOGIT_BIAS);
    if (nb) {
        r->bias_ids = util_calloc(nb, sizeof *r->bias_ids);
        r->bias = util_calloc(nb, sizeof *r->bias);
        if (!r->bias_ids || !r->bias)
            return api_error_set(e, 500, NULL, NULL, "out of memory");
        cJSON_ArrayForEach(it, lb) {
            const char *k = it->string;
            char *end = NULL;
            errno = 0;
            unsigned long long id = strtoull(k, &end, 10);
            if (!*k || *k < '0' || *k > '9' || *end || errno || id >= lim->vocab)
                return api_error_set(e, 400, "logit_bias", "invalid_value",
                                     "'logit_bias' key '%.64s' is not a token id "
                                     "(0..%u)",
                                     k, lim->vocab - 1);
            if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
                it->valuedouble < -100 || it->valuedouble > 100)
                return api_error_set(e, 400, "logit_bias", "invalid_value",
                                     "'logit_bias' value for token %llu must be a "
                                     "number in [-100, 100]",
                                     id);
            r->bias_ids[r->n_bias] = (int32_t)id;
            r->bias[r->n_bias++] = (float)it->valuedouble;
        }
    }
    const cJSON *st = field(root, "stop_token_ids");
    if (st) {
        if (!cJSON_IsArray(st))
            return api_error_set(e, 400, "stop_token_ids", "invalid_type",
                                 "'stop_token_ids' must be an array of token ids");
        uint32_t n = (uint32_t)cJSON_GetArraySize(st);
        if (n > SCHED_MAX_STOP_TOKEN_IDS)
            return api_error_set(e, 400, "stop_token_ids", "invalid_value",
                                 "at most %u stop token ids", SCHED_MAX_STOP_TOKEN_IDS);
        r->stop_token_ids = util_calloc(n ? n : 1, sizeof *r->stop_token_ids);
        if (!r->stop_token_ids) return api_error_set(e, 500, NULL, NULL, "out of memory");
        cJSON_ArrayForEach(it, st) {
            double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
            if (!isfinite(v) || v != floor(v) || v < 0 || v >= lim->vocab)
                return api_error_set(e, 400, "stop_token_ids", "invalid_value",
                                     "'stop_token_ids' entries must be token ids "
                                     "(0..%u)",
                                     lim->vocab - 1);
            r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)v;
        }
    }
    int64_t mt = 0;
    if (get_int(root, "min_tokens", 0, 1e9, &mt, NULL, e)) return -1;
    r->min_tokens = (uint32_t)mt;
    return 0;
}

/* The one place max_tokens is decided for a prompt of pl tokens. */
static int64_t resolve_max_tokens(const max_tokens_arg *mt, int chat, uint32_t pl,
                                  uint32_t context) {
    if (mt->given) return mt->value;
    int64_t v = chat ? (int64_t)(context - pl) : (int64_t)REQUEST_DEFAULT_MAX_TOKENS;
    if (pl + v > context) v = context - pl;
    return v;
}

/* Every prompt fits the context with its max_tokens; resolve them. */
static int check_context(const request_limits *lim, gen_request *r,
                         const max_tokens_arg *mt, api_error *e) {
    const char *what = r->chat ? "messages" : "prompt";
    uint32_t ctx = lim->context;
    for (uint32_t i = 0; i < r->n_prompts; i++) {
        uint32_t pl = r->prompts[i].n_ids;
        if (pl >= ctx)
            return api_error_set(
                e, 400, what, "context_length_exceeded",
                "This model's maximum context length is %u tokens, but the %s has "
                "%u tokens. Please shorten it.",
                ctx, what, pl);
        int64_t m = resolve_max_tokens(mt, r->chat, pl, ctx);
        if ((uint64_t)pl + (uint64_t)m > ctx)
            return api_error_set(
                e, 400, mt->param, "context_length_exceeded",
                "This model's maximum context length is %u tokens. However, you "
                "requested %" PRIu64 " tokens (%u in the %s, %" PRId64 " for the "
                "completion). Please reduce the %s or the completion length.",
                ctx, (uint64_t)pl + (uint64_t)m, pl, what, m, what);
        if (r->min_tokens > m)
            return api_error_set(e, 400, "min_tokens", "invalid_value",
                                 "'min_tokens' (%u) is more than the %" PRId64
                                 " tokens the completion may have",
                                 r->min_tokens, m);
        r->prompts[i].max_tokens = (uint32_t)m;
    }
    return 0;
}

/* Every top-level field a request may name, NUL-separated (error params
 * point into it). */
static const char request_fields[] =
    "model\0prompt\0messages\0max_tokens\0max_completion_tokens\0temperature\0"
    "top_p\0top_k\0min_p\0n\0best_of\0seed\0stream\0stream_options\0ignore_eos\0"
    "logprobs\0top_logprobs\0echo\0stop\0stop_token_ids\0min_tokens\0"
    "presence_penalty\0frequency_penalty\0repetition_penalty\0logit_bias\0"
    "suffix\0tools\0tool_choice\0parallel_tool_calls\0functions\0function_call\0"
    "response_format\0structured_outputs\0guided_json\0guided_regex\0guided_choice\0"
    "user\0";

/* A field orch does not know is refused, not ignored (as OpenAI's API). */
static int check_known(const cJSON *root, api_error *e) {
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const char *f = request_fields;
        while (*f && strcmp(f, it->string) != 0) f += strlen(f) + 1;
        if (!*f)
            return api_error_set(e, 400, NULL, "unknown_parameter",
                                 "Unrecognized request argument supplied: %.64s",
                                 it->string);
    }
    return 0;
}

/* Everything after the JSON parse, in the documented order. */
static int parse_fields(const request_limits *lim, gen_request *r, const cJSON *root,
                        api_error *e) {
    if (!cJSON_IsObject(root))
        return api_error_set(e, 400, NULL, "invalid_json",
                             "the request body must be a JSON object");
    max_tokens_arg mt;
    if (check_known(root, e) || check_model(lim, root, r, e) ||
        check_template(lim, r, e) || check_unsupported(r, root, e) ||
        parse_sampling(r, root, &mt, e) || parse_output(r, root, e) ||
        parse_stop(lim, r, root, e) || parse_token_controls(lim, r, root, e) ||
        parse_structured(lim, r, root, e))
        return -1;
    if (r->chat ? parse_messages(lim, r, root, e) : parse_prompt(lim, r, root, e))
        return -1;
    uint64_t seqs = (uint64_t)r->n_prompts * r->n;
    if (seqs > lim->max_seqs)
        return api_error_set(e, 400, "n", "invalid_value",
                             "n x prompts = %" PRIu64
                             " is over the limit of %u sequences per request",
                             seqs, lim->max_seqs);
    if (r->grammar) {
        r->matchers = util_calloc(seqs, sizeof *r->matchers);
        if (!r->matchers) return api_error_set(e, 500, NULL, NULL, "out of memory");
        for (uint64_t i = 0; i < seqs; i++)
            if (grammar_matcher_init(&r->matchers[i], r->grammar) != 0)
                return api_error_set(e, 500, NULL, NULL, "out of memory");
    }
    return check_context(lim, r, &mt, e);
}

uint32_t request_max_token_bytes(const tokenizer *tok) {
    uint32_t v = tokenizer_vocab_size(tok), best = 0;
    for (uint32_t i = 0; i < v; i++) {
        const char *b;
        size_t n = 0;
        if (tokenizer_token_bytes(tok, (int32_t)i, &b, &n) == 0 && n > best)
            best = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    }
    return best;
}

int gen_request_parse(const request_limits *lim, int chat, const char *body, size_t len,
                      gen_request *out, api_error *e) {
    memset(out, 0, sizeof *out);
    out->chat = chat;
    out->n = 1;
    out->sampling = (sampler_params){ .temperature = 1.0f, .top_k = 0, .top_p = 1.0f };
    const char *end = NULL;
    if (!body) {
        body = "";
        len = 0;
    }
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - body) : 0;
        return api_error_set(e, 400, NULL, "invalid_json",
                             "the request body is not valid JSON (error near byte %zu)",
                             at);
    }
    size_t parsed = end ? (size_t)(end - body) : len;
    int rc = json_strict_check(body, len, parsed, root, request_fields, e);
    if (rc == 0) rc = parse_fields(lim, out, root, e);
    cJSON_Delete(root);
    return rc;
}

void gen_request_free(gen_request *r) {
    if (!r) return;
    for (uint32_t i = 0; r->prompts && i < r->n_prompts; i++) {
        free(r->prompts[i].ids);
        free(r->prompts[i].text);
    }
    free(r->prompts);
    for (uint32_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->bias_ids);
    free(r->bias);
    free(r->stop_token_ids);
    if (r->matchers)
        for (uint32_t i = 0; i < r->n_prompts * r->n; i++)
            grammar_matcher_reset(&r->matchers[i]);
    free(r->matchers);
    grammar_release(r->grammar);
    memset(r, 0, sizeof *r);
}

uint32_t gen_request_n_seqs(const gen_request *r) { return r->n_prompts * r->n; }

void gen_request_seq(const gen_request *r, uint32_t i, uint64_t base_seed, sched_seq *q) {
    const gen_prompt *p = &r->prompts[i / r->n];
    q->prompt = p->ids;
    q->n_prompt = p->n_ids;
    q->max_tokens = p->max_tokens;
    q->sampling = r->sampling;
    sampler_rng_seed_stream(&q->rng, base_seed, i % r->n);
    q->stop = (const char *const *)r->stops;
    q->n_stop = r->n_stops;
    q->want_logprobs = r->logprobs;
    q->top_logprobs = r->top_logprobs;
    q->want_prompt_logprobs = r->echo && r->logprobs;
    q->stream = r->stream;
    q->ignore_eot = r->ignore_eos;
    q->bias_ids = r->bias_ids;
    q->bias = r->bias;
    q->n_bias = r->n_bias;
    q->stop_token_ids = r->stop_token_ids;
    q->n_stop_token_ids = r->n_stop_token_ids;
    q->min_tokens = r->min_tokens;
    if (r->matchers) grammar_matcher_attach(&r->matchers[i], q);
}
