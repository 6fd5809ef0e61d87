/*
 * render.c - final JSON bodies, SSE events, usage, log-probabilities, model
 * objects. See render.h.
 */
#include "orchestrator/serve/render.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/json_writer.h"
#include "orchestrator/core/utf8.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/tool_calls.h"

/* ------------------------------------------------------------------------- */
/* Pieces                                                                     */
/* ------------------------------------------------------------------------- */
static const char *finish_str(int f) {
    return f == SCHED_FINISH_STOP     ? "\"stop\""
           : f == SCHED_FINISH_LENGTH ? "\"length\""
                                      : "null";
}

/* A log-probability; -inf (and any non-finite value) as OpenAI's -9999. */
static void write_logprob(strbuf *b, double v) {
    json_write_double(b, isfinite(v) ? v : -9999.0);
}

static uint32_t n_seqs(const gen_response *r) { return gen_request_n_seqs(r->req); }

/* cached_tokens: per prompt, those of its first choice (prefix cache). */
static void write_usage(strbuf *b, const gen_response *r) {
    uint64_t p = 0, c = 0, cached = 0;
    for (uint32_t i = 0; i < r->req->n_prompts; i++) p += r->req->prompts[i].n_ids;
    for (uint32_t i = 0; i < n_seqs(r); i++) c += r->seqs[i].n_out;
    for (uint32_t i = 0; i < n_seqs(r); i += r->req->n)
        cached += r->seqs[i].cached_tokens;
    strbuf_printf(b,
                  "{\"prompt_tokens\":%" PRIu64 ",\"completion_tokens\":%" PRIu64
                  ",\"total_tokens\":%" PRIu64
                  ",\"prompt_tokens_details\":{\"cached_tokens\":%" PRIu64 "}}",
                  p, c, p + c, cached);
}

/* The bytes of token id (none for an unknown id). */
static void token_bytes(const gen_response *r, int32_t id, const char **bytes,
                        size_t *n) {
    *bytes = "";
    *n = 0;
    if (id < 0 || tokenizer_token_bytes(r->tok, id, bytes, n) != 0) {
        *bytes = "";
        *n = 0;
    }
}

static void write_token_str(strbuf *b, const gen_response *r, int32_t id) {
    const char *bytes;
    size_t n;
    token_bytes(r, id, &bytes, &n);
    json_write_string(b, bytes, n);
}

static void write_token_bytes(strbuf *b, const gen_response *r, int32_t id) {
    const char *bytes;
    size_t n;
    token_bytes(r, id, &bytes, &n);
    strbuf_puts(b, "[");
    for (size_t i = 0; i < n; i++)
        strbuf_printf(b, i ? ",%u" : "%u", (unsigned char)bytes[i]);
    strbuf_puts(b, "]");
}

/* One logprobs item: a prompt token (prompt_pos >= 0) or generated token. */
typedef struct lp_item {
    int32_t id;
    double lp; /* NaN = null (first prompt token) */
    const int32_t *top_ids;
    const double *top_lp;
    size_t offset;
} lp_item;

static lp_item item_of(const gen_response *r, const sched_seq *q, uint32_t p,
                       int prompt_pos, uint32_t gen_i, size_t echo_len,
                       size_t *prompt_off) {
    lp_item it;
    uint32_t k = r->req->top_logprobs;
    if (prompt_pos >= 0) {
        uint32_t j = (uint32_t)prompt_pos;
        it.id = r->req->prompts[p].ids[j];
        it.lp = (j > 0 && q->prompt_logprob) ? q->prompt_logprob[j] : NAN;
        it.top_ids =
            (j > 0 && q->prompt_top_ids) ? q->prompt_top_ids + (size_t)j * k : NULL;
        it.top_lp = (j > 0 && q->prompt_top_lp) ? q->prompt_top_lp + (size_t)j * k : NULL;
        it.offset = *prompt_off;
        const char *bytes;
        size_t n = 0;
        if (tokenizer_token_bytes(r->tok, it.id, &bytes, &n) != 0) n = 0;
        *prompt_off += n;
    } else {
        it.id = q->out_tokens[gen_i];
        it.lp = q->out_logprob ? q->out_logprob[gen_i] : NAN;
        it.top_ids = q->out_top_ids ? q->out_top_ids + (size_t)gen_i * k : NULL;
        it.top_lp = q->out_top_lp ? q->out_top_lp + (size_t)gen_i * k : NULL;
        it.offset = echo_len + (gen_i ? q->out_text_end[gen_i - 1] : 0);
    }
    return it;
}

/* {"TOKEN":lp,...} of one completions item (null for the first prompt token). */
static void write_cmpl_top(strbuf *b, const gen_response *r, const lp_item *it) {
    if (isnan(it->lp)) {
        strbuf_puts(b, "null");
        return;
    }
    strbuf_puts(b, "{");
    for (uint32_t j = 0, w = 0; it->top_ids && j < r->req->top_logprobs; j++) {
        if (it->top_ids[j] < 0) continue;
        if (w++) strbuf_puts(b, ",");
        write_token_str(b, r, it->top_ids[j]);
        strbuf_puts(b, ":");
        write_logprob(b, it->top_lp[j]);
    }
    strbuf_puts(b, "}");
}

/* Completions logprobs object over (prompt tokens if with_prompt) and
 * generated tokens [g0, g1). */
static void write_cmpl_logprobs(strbuf *b, const gen_response *r, const sched_seq *q,
                                uint32_t p, int with_prompt, uint32_t g0, uint32_t g1,
                                size_t echo_len) {
    uint32_t np = with_prompt ? r->req->prompts[p].n_ids : 0;
    uint32_t total = np + (g1 - g0);
    static const char *const keys[4] = { "{\"tokens\":[", "],\"token_logprobs\":[",
                                         "],\"top_logprobs\":[", "],\"text_offset\":[" };
    for (int pass = 0; pass < 4; pass++) {
        strbuf_puts(b, keys[pass]);
        size_t poff = 0;
        for (uint32_t t = 0; t < total; t++) {
            lp_item it =
                item_of(r, q, p, t < np ? (int)t : -1, g0 + (t - np), echo_len, &poff);
            if (t) strbuf_puts(b, ",");
            switch (pass) {
            case 0: write_token_str(b, r, it.id); break;
            case 1:
                if (isnan(it.lp))
                    strbuf_puts(b, "null");
                else
                    write_logprob(b, it.lp);
                break;
            case 2: write_cmpl_top(b, r, &it); break;
            default: strbuf_printf(b, "%zu", it.offset); break;
            }
        }
    }
    strbuf_puts(b, "]}");
}

/* {"token","logprob","bytes"} of one chat item, without the closing brace. */
static void write_chat_token(strbuf *b, const gen_response *r, int32_t id, double lp) {
    strbuf_puts(b, "{\"token\":");
    write_token_str(b, r, id);
    strbuf_puts(b, ",\"logprob\":");
    write_logprob(b, lp);
    strbuf_puts(b, ",\"bytes\":");
    write_token_bytes(b, r, id);
}

/* Chat logprobs object over generated tokens [g0, g1). */
static void write_chat_logprobs(strbuf *b, const gen_response *r, const sched_seq *q,
                                uint32_t g0, uint32_t g1) {
    uint32_t k = r->req->top_logprobs;
    strbuf_puts(b, "{\"content\":[");
    for (uint32_t i = g0; i < g1; i++) {
        if (i > g0) strbuf_puts(b, ",");
        write_chat_token(b, r, q->out_tokens[i],
                         q->out_logprob ? q->out_logprob[i] : 0.0);
        strbuf_puts(b, ",\"top_logprobs\":[");
        for (uint32_t j = 0, w = 0; q->out_top_ids && j < k; j++) {
            int32_t t = q->out_top_ids[(size_t)i * k + j];
            if (t < 0) continue;
            if (w++) strbuf_puts(b, ",");
            write_chat_token(b, r, t, q->out_top_lp[(size_t)i * k + j]);
            strbuf_puts(b, "}");
        }
        strbuf_puts(b, "]}");
    }
    strbuf_puts(b, "]}");
}

/* The end of a call's arguments in a text of len bytes: a finished call
 * (stop) ends with the '}' that closes the call object. */
static size_t args_end(const sched_seq *q, const tool_call_view *tv, size_t len,
                       int fin) {
    if (fin == SCHED_FINISH_STOP && len > tv->args_off && q->text[len - 1] == '}')
        return len - 1;
    return len < tv->args_off ? tv->args_off : len;
}

/* "tool_calls":[{...}] of choice i: with the id, type and name (head) and
 * the arguments: whole = the message's (up to args_end), else the stream
 * piece text[args_off, end) with the delta's "index". */
static void write_tool_call(strbuf *b, const gen_response *r, const sched_seq *q,
                            uint32_t i, const tool_call_view *tv, int head, int whole,
                            size_t end) {
    strbuf_puts(b, whole ? "\"tool_calls\":[{" : "\"tool_calls\":[{\"index\":0,");
    if (head) {
        char id[24];
        tool_call_id(r->id, i, id);
        strbuf_printf(b, "\"id\":\"%s\",\"type\":\"function\",", id);
    }
    strbuf_puts(b, "\"function\":{");
    if (head) {
        strbuf_puts(b, "\"name\":");
        json_write_string(b, tv->name, tv->name_len);
        strbuf_puts(b, ",");
    }
    strbuf_puts(b, "\"arguments\":");
    if (whole) {
        size_t e = args_end(q, tv, end, q->finish);
        json_write_string(b, q->text + tv->args_off, e - tv->args_off);
    } else {
        json_write_string(b, q->text + tv->args_off, end - tv->args_off);
    }
    strbuf_puts(b, "}}]");
}

static void write_head(strbuf *b, const gen_response *r, const char *object) {
    strbuf_puts(b, "{\"id\":\"");
    strbuf_puts(b, r->id);
    strbuf_printf(b, "\",\"object\":\"%s\",\"created\":%ld,\"model\":", object,
                  r->created);
    json_write_cstring(b, r->model);
}

/* ------------------------------------------------------------------------- */
/* Final bodies                                                               */
/* ------------------------------------------------------------------------- */
void render_final(strbuf *b, const gen_response *r) {
    const gen_request *rq = r->req;
    write_head(b, r, rq->chat ? "chat.completion" : "text_completion");
    strbuf_puts(b, ",\"choices\":[");
    for (uint32_t i = 0; i < n_seqs(r); i++) {
        const sched_seq *q = &r->seqs[i];
        uint32_t p = i / rq->n;
        if (i) strbuf_puts(b, ",");
        strbuf_printf(b, "{\"index\":%u,", i);
        tool_call_view tv = { 0 };
        if (rq->chat && rq->tool_mode != TOOL_MODE_NONE)
            tool_call_read(q->text ? q->text : "", q->text_len, &tv);
        if (tv.header) {
            strbuf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":null,");
            write_tool_call(b, r, q, i, &tv, 1, 1, q->text_len);
            strbuf_puts(b, "},\"logprobs\":");
            if (rq->logprobs)
                write_chat_logprobs(b, r, q, 0, q->n_out);
            else
                strbuf_puts(b, "null");
            strbuf_printf(b, ",\"finish_reason\":%s}",
                          q->finish == SCHED_FINISH_STOP ? "\"tool_calls\""
                                                         : finish_str(q->finish));
            continue;
        }
        if (rq->chat) {
            strbuf_puts(b, "\"message\":{\"role\":\"assistant\",\"content\":");
            json_write_string(b, q->text ? q->text : "", q->text_len);
            strbuf_puts(b, "},\"logprobs\":");
            if (rq->logprobs)
                write_chat_logprobs(b, r, q, 0, q->n_out);
            else
                strbuf_puts(b, "null");
        } else {
            size_t el = rq->echo ? rq->prompts[p].text_len : 0;
            strbuf_puts(b, "\"text\":");
            json_write_string2(b, rq->echo ? rq->prompts[p].text : "", el,
                               q->text ? q->text : "", q->text_len);
            strbuf_puts(b, ",\"logprobs\":");
            if (rq->logprobs)
                write_cmpl_logprobs(b, r, q, p, rq->echo, 0, q->n_out, el);
            else
                strbuf_puts(b, "null");
        }
        strbuf_printf(b, ",\"finish_reason\":%s}", finish_str(q->finish));
    }
    strbuf_puts(b, "],\"usage\":");
    write_usage(b, r);
    strbuf_puts(b, "}");
}

void render_model_object(strbuf *b, const char *model, long created, uint32_t context,
                         const char *arch) {
    strbuf_puts(b, "{\"id\":");
    json_write_cstring(b, model);
    strbuf_printf(b,
                  ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"orch\","
                  "\"max_model_len\":%u",
                  created, context);
    if (arch) {
        strbuf_puts(b, ",\"architecture\":");
        json_write_cstring(b, arch);
    }
    strbuf_puts(b, "}");
}

/* ------------------------------------------------------------------------- */
/* Streaming                                                                  */
/* ------------------------------------------------------------------------- */
int render_stream_init(render_stream *st, uint32_t n) {
    memset(st, 0, sizeof *st);
    st->choices = util_calloc(n ? n : 1, sizeof *st->choices);
    return st->choices ? 0 : -1;
}

void render_stream_free(render_stream *st) {
    free(st->choices);
    st->choices = NULL;
}

static void sse_begin(strbuf *b, const gen_response *r) {
    strbuf_puts(b, "data: ");
    write_head(b, r, r->req->chat ? "chat.completion.chunk" : "text_completion");
    strbuf_puts(b, ",\"choices\":[");
}

static void sse_end(strbuf *b, const gen_response *r) {
    strbuf_puts(b, "]");
    if (r->req->include_usage) strbuf_puts(b, ",\"usage\":null");
    strbuf_puts(b, "}\n\n");
}

/* One event for choice i: text [t0, t1), logprobs of generated tokens
 * [g0, g1), finish reason (NONE = null). */
static void emit_delta(strbuf *b, const gen_response *r, const sched_seq *q, uint32_t i,
                       size_t t0, size_t t1, uint32_t g0, uint32_t g1, int fin,
                       size_t echo_len) {
    const gen_request *rq = r->req;
    const char *t = q->text ? q->text + t0 : "";
    size_t n = t1 > t0 ? t1 - t0 : 0;
    sse_begin(b, r);
    strbuf_printf(b, "{\"index\":%u,", i);
    if (rq->chat) {
        if (n) {
            strbuf_puts(b, "\"delta\":{\"content\":");
            json_write_string(b, t, n);
            strbuf_puts(b, "}");
        } else {
            strbuf_puts(b, "\"delta\":{}");
        }
        strbuf_puts(b, ",\"logprobs\":");
        if (rq->logprobs)
            write_chat_logprobs(b, r, q, g0, g1);
        else
            strbuf_puts(b, "null");
    } else {
        strbuf_puts(b, "\"text\":");
        json_write_string(b, t, n);
        strbuf_puts(b, ",\"logprobs\":");
        if (rq->logprobs)
            write_cmpl_logprobs(b, r, q, i / rq->n, 0, g0, g1, echo_len);
        else
            strbuf_puts(b, "null");
    }
    strbuf_printf(b, ",\"finish_reason\":%s}", finish_str(fin));
    sse_end(b, r);
}

/* The error event of a failed sequence. */
static void emit_error(strbuf *b, const sched_seq *q) {
    api_error e;
    api_error_set(&e, q->http_status ? (unsigned)q->http_status : 500, NULL, NULL, "%s",
                  q->error[0] ? q->error : "request failed");
    strbuf_puts(b, "data: ");
    api_error_json(b, &e);
    strbuf_puts(b, "\n\n");
}

/* The first event of choice i (chat: the role; echo: the prompt). Returns 0
 * when it is not due yet (echo waits for the first token). */
static int emit_first(strbuf *b, const gen_response *r, const sched_seq *q, uint32_t i,
                      size_t echo_len) {
    const gen_request *rq = r->req;
    uint32_t p = i / rq->n;
    if (rq->chat) {
        sse_begin(b, r);
        strbuf_printf(b,
                      "{\"index\":%u,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                      "\"logprobs\":null,\"finish_reason\":null}",
                      i);
        sse_end(b, r);
    } else if (rq->echo) {
        if (q->n_out == 0 && !q->finish) return 0;
        sse_begin(b, r);
        strbuf_printf(b, "{\"index\":%u,\"text\":", i);
        json_write_string(b, rq->prompts[p].text, echo_len);
        strbuf_puts(b, ",\"logprobs\":");
        if (rq->logprobs)
            write_cmpl_logprobs(b, r, q, p, 1, 0, 0, echo_len);
        else
            strbuf_puts(b, "null");
        strbuf_puts(b, ",\"finish_reason\":null}");
        sse_end(b, r);
    }
    return 1;
}

/* The token events of choice i that are ready. */
static void emit_tokens(strbuf *b, const gen_response *r, const sched_seq *q, uint32_t i,
                        render_choice *st, size_t echo_len) {
    int fin = q->finish;
    size_t ready = fin ? q->text_len : q->text_ready;
    if (ready < st->sent_text) ready = st->sent_text;
    /* One event per token (tokens whose bytes end inside a UTF-8 character,
     * or add no text, merge into the next event). */
    uint32_t j = st->sent_tokens;
    while (j < q->n_out) {
        size_t end = q->out_text_end[j];
        if (end > ready) break;
        j++;
        int last = fin && j == q->n_out;
        if (!last && (utf8_complete_prefix_len(q->text, end) != end ||
                      (end == st->sent_text && !r->req->logprobs)))
            continue;
        emit_delta(b, r, q, i, st->sent_text, end, st->sent_tokens, j,
                   last ? fin : SCHED_FINISH_NONE, echo_len);
        st->sent_text = end;
        st->sent_tokens = j;
        if (last) st->sent_finish = 1;
    }
    if (fin && !st->sent_finish) {
        emit_delta(b, r, q, i, st->sent_text, ready, st->sent_tokens, q->n_out, fin,
                   echo_len);
        st->sent_text = ready;
        st->sent_tokens = q->n_out;
        st->sent_finish = 1;
    }
}

/* A tool-call piece of choice i: header (id, name) or arguments [from, to). */
static void emit_tool_delta(strbuf *b, const gen_response *r, const sched_seq *q,
                            uint32_t i, const tool_call_view *tv, int head, size_t from,
                            size_t to) {
    tool_call_view piece = *tv;
    piece.args_off = from;
    sse_begin(b, r);
    strbuf_printf(b, "{\"index\":%u,\"delta\":{", i);
    write_tool_call(b, r, q, i, &piece, head, 0, to);
    strbuf_puts(b, "},\"logprobs\":null,\"finish_reason\":null}");
    sse_end(b, r);
}

/* Streaming a choice that may be a tool call: decided on its first byte
 * ('{' = a call); a call streams its header once the name is complete,
 * then its arguments, holding back the last byte (it may be the '}' that
 * closes the call). */
static void emit_tool_tokens(strbuf *b, const gen_response *r, const sched_seq *q,
                             uint32_t i, render_choice *st, size_t echo_len) {
    int fin = q->finish;
    size_t ready = fin ? q->text_len : q->text_ready;
    tool_call_view tv;
    if (st->tool_state == 0) {
        if (ready == 0 && !fin) return;
        tool_call_read(q->text ? q->text : "", ready, &tv);
        if (!tv.is_call || (!tv.header && fin)) {
            st->tool_state = 1;
        } else if (tv.header) {
            emit_tool_delta(b, r, q, i, &tv, 1, tv.args_off, tv.args_off);
            st->sent_text = tv.args_off;
            st->tool_state = 2;
        } else {
            return; /* the header is not complete yet */
        }
    }
    if (st->tool_state == 1) {
        emit_tokens(b, r, q, i, st, echo_len);
        return;
    }
    tool_call_view full;
    tool_call_read(q->text, ready, &full);
    size_t end = fin ? args_end(q, &full, ready, fin) : (ready ? ready - 1 : 0);
    if (!fin) end = utf8_complete_prefix_len(q->text, end);
    if (end > st->sent_text) {
        emit_tool_delta(b, r, q, i, &full, 0, st->sent_text, end);
        st->sent_text = end;
    }
    st->sent_tokens = q->n_out;
    if (fin) {
        sse_begin(b, r);
        strbuf_printf(
            b, "{\"index\":%u,\"delta\":{},\"logprobs\":null,\"finish_reason\":%s}", i,
            fin == SCHED_FINISH_STOP ? "\"tool_calls\"" : finish_str(fin));
        sse_end(b, r);
        st->sent_finish = 1;
    }
}

int render_stream_events(strbuf *b, const gen_response *r, render_stream *st) {
    const gen_request *rq = r->req;
    int failed = 0, all_finished = 1;
    for (uint32_t i = 0; i < n_seqs(r); i++) {
        const sched_seq *q = &r->seqs[i];
        render_choice *c = &st->choices[i];
        if (c->sent_finish) continue;
        int fin = q->finish;
        if (fin == SCHED_FINISH_ERROR || fin == SCHED_FINISH_CANCELLED) {
            if (!st->error_sent) {
                emit_error(b, q);
                st->error_sent = 1;
                failed = 1;
            }
            c->sent_finish = 1;
            continue;
        }
        if (st->error_sent) {
            if (fin == SCHED_FINISH_NONE)
                all_finished = 0;
            else
                c->sent_finish = 1;
            continue;
        }
        size_t echo_len = rq->echo ? rq->prompts[i / rq->n].text_len : 0;
        if (!c->sent_first) {
            if (!emit_first(b, r, q, i, echo_len)) {
                all_finished = 0;
                continue;
            }
            c->sent_first = 1;
        }
        if (rq->chat && rq->tool_mode != TOOL_MODE_NONE)
            emit_tool_tokens(b, r, q, i, c, echo_len);
        else
            emit_tokens(b, r, q, i, c, echo_len);
        if (!fin) all_finished = 0;
    }
    if (all_finished && !st->done) {
        if (rq->include_usage && !st->error_sent) {
            strbuf_puts(b, "data: ");
            write_head(b, r, rq->chat ? "chat.completion.chunk" : "text_completion");
            strbuf_puts(b, ",\"choices\":[],\"usage\":");
            write_usage(b, r);
            strbuf_puts(b, "}\n\n");
        }
        strbuf_puts(b, "data: [DONE]\n\n");
        st->done = 1;
    }
    return failed;
}
