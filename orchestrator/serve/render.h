/*
 * render.h - the JSON the server sends back: the final body of a completion
 * or chat completion, the SSE events of a stream, usage, log-probabilities,
 * and the model objects of /v1/models.
 *
 * Shapes (OpenAI's): a final body is {"id","object","created","model",
 * "choices":[...],"usage":{...}} with object "text_completion" or
 * "chat.completion"; choice i is choice i % n of prompt i / n. Streams are
 * `data: {json}\n\n` events: chat starts each choice with a role delta, echo
 * sends the prompt first; then one event per generated token (a token whose
 * bytes end inside a UTF-8 character (utf8.h) or, without logprobs, add no
 * text is merged into the next event), the last one with its finish_reason;
 * a failed sequence sends one error event (api_error.h) instead; with
 * include_usage a final event with empty choices carries the usage; then
 * `data: [DONE]`. A chat choice that is a tool call (tool_calls.h) is answered
 * as message.tool_calls with content null and finish_reason "tool_calls"
 * (streams: a delta with the call's id, type and name, then argument
 * pieces, then the finish). Log-probabilities that are -inf are written as -9999 (as
 * OpenAI does).
 *
 * Memory: everything is appended to the caller's strbuf (check b->oom once);
 * a render_stream owns its per-choice array (render_stream_free).
 * Threads: reentrant; the caller holds the lock that guards the sequences'
 * outputs while rendering them (scheduler.h).
 * Errors: none besides b->oom; render_stream_init returns -1 when out of
 * memory.
 */
#ifndef ORCH_RENDER_H
#define ORCH_RENDER_H

#include <stdint.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/request.h"
#include "orchestrator/serve/scheduler.h"

/* One request's answer: what it asked and what its sequences produced. */
typedef struct gen_response {
    const gen_request *req;
    const sched_seq *seqs; /* [gen_request_n_seqs(req)] */
    const tokenizer *tok;  /* token strings of log-probabilities */
    const char *model;     /* the served model's name */
    const char *id;        /* "cmpl-..." or "chatcmpl-..." */
    long created;          /* Unix time */
} gen_response;

/* The body of a non-streaming answer (every sequence finished). */
void render_final(strbuf *b, const gen_response *r);

/* What a stream has sent so far. */
typedef struct render_choice {
    size_t sent_text;     /* bytes of the sequence's text sent */
    uint32_t sent_tokens; /* generated tokens whose logprobs were sent */
    int sent_first;       /* role chunk (chat) / echo chunk (completions) */
    int sent_finish;
    int tool_state; /* tool calls: 0 undecided, 1 text, 2 a call (header sent) */
} render_choice;

typedef struct render_stream {
    render_choice *choices; /* [n_seqs] */
    int done;               /* data: [DONE] written */
    int error_sent;
} render_stream;

int render_stream_init(render_stream *st, uint32_t n_seqs);
void render_stream_free(render_stream *st);

/* Append every event that is ready now. Returns 1 when it wrote the error
 * event of a failed sequence: the caller then cancels the request's other
 * sequences. st->done is set once [DONE] is written. */
int render_stream_events(strbuf *b, const gen_response *r, render_stream *st);

/* {"id":model,"object":"model","created",...,"max_model_len":context,
 * "architecture":arch} (no "architecture" when arch is NULL: still loading) */
void render_model_object(strbuf *b, const char *model, long created, uint32_t context,
                         const char *arch);

#endif
