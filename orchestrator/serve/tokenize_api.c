/*
 * tokenize_api.c - POST /tokenize and /detokenize bodies and answers. See
 * tokenize_api.h.
 */
#include "orchestrator/serve/tokenize_api.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/utf8.h"
#include "orchestrator/serve/json_strict.h"

static const char tokenize_fields[] =
    "model\0content\0prompt\0add_special\0add_special_tokens\0with_pieces\0";
static const char detokenize_fields[] = "model\0tokens\0";

static cJSON *field(const cJSON *root, const char *k) {
    cJSON *x = cJSON_GetObjectItemCaseSensitive(root, k);
    return (x && cJSON_IsNull(x)) ? NULL : x;
}

/* Parse and check the body: a JSON object of known fields whose 'model',
 * when given, is the served one. *root to cJSON_Delete on success. */
static int parse_body(const tokenize_api_limits *lim, const char *body, size_t len,
                      const char *fields, cJSON **root, api_error *e) {
    const char *end = NULL;
    if (!body) {
        body = "";
        len = 0;
    }
    cJSON *r = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!r)
        return api_error_set(e, 400, NULL, "invalid_json",
                             "the request body is not valid JSON (error near byte %zu)",
                             end ? (size_t)(end - body) : 0);
    size_t parsed = end ? (size_t)(end - body) : len;
    if (json_strict_check(body, len, parsed, r, fields, e) != 0) {
        cJSON_Delete(r);
        return -1;
    }
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return api_error_set(e, 400, NULL, "invalid_json",
                             "the request body must be a JSON object");
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, r) {
        const char *f = fields;
        while (*f && strcmp(f, it->string) != 0) f += strlen(f) + 1;
        if (!*f) {
            api_error_set(e, 400, NULL, "unknown_parameter",
                          "Unrecognized request argument supplied: %.64s", it->string);
            cJSON_Delete(r);
            return -1;
        }
    }
    const cJSON *model = field(r, "model");
    if (model && !cJSON_IsString(model)) {
        cJSON_Delete(r);
        return api_error_set(e, 400, "model", "invalid_type", "'model' must be a string");
    }
    if (model && strcmp(model->valuestring, lim->model_name) != 0) {
        api_error_set(e, 404, "model", "model_not_found",
                      "the model '%.128s' does not exist; this server serves '%.128s'",
                      model->valuestring, lim->model_name);
        e->type = "invalid_request_error";
        cJSON_Delete(r);
        return -1;
    }
    *root = r;
    return 0;
}

static int get_bool(const cJSON *root, const char *k, int *out, api_error *e) {
    const cJSON *x = field(root, k);
    if (!x) return 0;
    if (!cJSON_IsBool(x))
        return api_error_set(e, 400, k, "invalid_type", "'%s' must be a boolean", k);
    *out = cJSON_IsTrue(x);
    return 0;
}

/* content / prompt: exactly one, a string. */
static int text_of(const cJSON *root, const char **text, size_t *len, api_error *e) {
    const cJSON *c = field(root, "content"), *p = field(root, "prompt");
    if (c && p)
        return api_error_set(e, 400, "prompt", "invalid_value",
                             "give either 'content' or 'prompt', not both");
    const cJSON *x = c ? c : p;
    const char *name = c ? "content" : "prompt";
    if (!x)
        return api_error_set(e, 400, "content", "missing_required_parameter",
                             "'content' (or 'prompt') is required");
    if (!cJSON_IsString(x))
        return api_error_set(e, 400, name, "invalid_type", "'%s' must be a string", name);
    *text = x->valuestring;
    *len = strlen(x->valuestring);
    return 0;
}

static int well_formed(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len(s + i, n - i);
        if (k == 0) return 0;
        i += k;
    }
    return 1;
}

static void write_piece(strbuf *b, const char *bytes, size_t n) {
    if (well_formed(bytes, n)) {
        json_write_string(b, bytes, n);
        return;
    }
    strbuf_puts(b, "[");
    for (size_t i = 0; i < n; i++)
        strbuf_printf(b, "%s%u", i ? "," : "", (unsigned)(unsigned char)bytes[i]);
    strbuf_puts(b, "]");
}

int tokenize_api_tokenize(const tokenize_api_limits *lim, const char *body, size_t len,
                          strbuf *out, api_error *e) {
    cJSON *root = NULL;
    if (parse_body(lim, body, len, tokenize_fields, &root, e) != 0) return -1;
    int add_special = 1, with_pieces = 0, rc = -1;
    const char *text = NULL;
    size_t tlen = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256] = "";
    if (get_bool(root, "add_special", &add_special, e) ||
        get_bool(root, "add_special_tokens", &add_special, e) ||
        get_bool(root, "with_pieces", &with_pieces, e) || text_of(root, &text, &tlen, e))
        goto done;
    if (tokenizer_encode(lim->tok, text, tlen, &ids, &n, err, sizeof err) != 0) {
        api_error_set(e, 400, "content", "invalid_value", "cannot tokenize: %s", err);
        goto done;
    }
    /* The model's BOS, as a completion prompt gets it (request.c). */
    if (add_special && tokenizer_prepend_bos(lim->tok, &ids, &n) < 0) {
        api_error_set(e, 500, NULL, NULL, "out of memory");
        goto done;
    }
    strbuf_puts(out, "{\"tokens\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) strbuf_puts(out, ",");
        if (!with_pieces) {
            strbuf_printf(out, "%d", ids[i]);
            continue;
        }
        const char *bytes = "";
        size_t nb = 0;
        if (tokenizer_token_bytes(lim->tok, ids[i], &bytes, &nb) != 0) nb = 0;
        strbuf_printf(out, "{\"id\":%d,\"piece\":", ids[i]);
        write_piece(out, bytes, nb);
        strbuf_puts(out, "}");
    }
    strbuf_printf(out, "],\"count\":%zu,\"max_model_len\":%u}", n, lim->context);
    rc = out->oom ? api_error_set(e, 500, NULL, NULL, "out of memory") : 0;
done:
    free(ids);
    cJSON_Delete(root);
    return rc;
}

int tokenize_api_detokenize(const tokenize_api_limits *lim, const char *body, size_t len,
                            strbuf *out, api_error *e) {
    cJSON *root = NULL;
    if (parse_body(lim, body, len, detokenize_fields, &root, e) != 0) return -1;
    int rc = -1;
    int32_t *ids = NULL;
    char *text = NULL;
    size_t tlen = 0;
    uint32_t vocab = tokenizer_vocab_size(lim->tok);
    const cJSON *t = field(root, "tokens");
    if (!t) {
        api_error_set(e, 400, "tokens", "missing_required_parameter",
                      "'tokens' is required");
        goto done;
    }
    if (!cJSON_IsArray(t)) {
        api_error_set(e, 400, "tokens", "invalid_type",
                      "'tokens' must be an array of token ids");
        goto done;
    }
    size_t n = (size_t)cJSON_GetArraySize(t), i = 0;
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        api_error_set(e, 500, NULL, NULL, "out of memory");
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, t) {
        double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!isfinite(v) || v != floor(v) || v < 0 || v >= vocab) {
            api_error_set(e, 400, "tokens", "invalid_value",
                          "tokens: token ids must be integers in [0, %u); element %zu is "
                          "not",
                          vocab, i);
            goto done;
        }
        ids[i++] = (int32_t)v;
    }
    char err[256] = "";
    if (tokenizer_decode(lim->tok, ids, n, &text, &tlen, err, sizeof err) != 0) {
        api_error_set(e, 400, "tokens", "invalid_value", "cannot decode: %s", err);
        goto done;
    }
    /* bytes that are not UTF-8 on their own (a character cut between tokens)
     * are written as U+FFFD by the JSON writer */
    strbuf_puts(out, "{\"content\":");
    json_write_string(out, text, tlen);
    strbuf_puts(out, ",\"prompt\":");
    json_write_string(out, text, tlen);
    strbuf_puts(out, "}");
    rc = out->oom ? api_error_set(e, 500, NULL, NULL, "out of memory") : 0;
done:
    free(text);
    free(ids);
    cJSON_Delete(root);
    return rc;
}
