/*
 * request.h - the body of POST /v1/completions or /v1/chat/completions,
 * parsed and validated into one typed generation request, and the scheduler
 * sequences it becomes (one per prompt and choice).
 *
 * Parsing checks, in this order: valid JSON with nothing after it, no stray
 * control bytes, no NUL in any string and no key twice in one object
 * (json_strict.h); a JSON object; no field orch does not know (400
 * unknown_parameter, as OpenAI's API); 'model' (must be the served model
 * when given, else 404 model_not_found); unsupported features (no suffix,
 * no functions); structured output (response_format text / json_object /
 * json_schema, structured_outputs {json|regex|choice|json_object}, vLLM's
 * older guided_json / guided_regex / guided_choice, and on chat tools +
 * tool_choice (tool_calls.h); at most one of them; compiled through
 * json_schema.h into a grammar of the request_limits' grammar cache; not
 * with ignore_eos); temperature [0, 2];
 * top_p (0, 1]; top_k >= -1 (<= 0 = off); n [1, 128]; best_of (= n); seed;
 * max_tokens (chat: max_completion_tokens wins); min_p [0, 1];
 * presence/frequency_penalty [-2, 2]; repetition_penalty (0, 10]; stream,
 * ignore_eos, stream_options (only with stream); logprobs (chat: logprobs +
 * top_logprobs; completions: logprobs = N) up to SCHED_MAX_TOP_LOGPROBS;
 * echo (completions); stop; logit_bias (token id -> [-100, 100], at most
 * REQUEST_MAX_LOGIT_BIAS); stop_token_ids (at most SCHED_MAX_STOP_TOKEN_IDS
 * ids); min_tokens (<= the resolved max_tokens); the prompt (completions:
 * a string, token ids, or a list of either) or messages (chat, rendered by
 * the limits' chat template, chat_template.h, and tokenized; `tools`, role
 * tool and assistant tool_calls only where the template renders tools); n x prompts <= max_seqs; each prompt shorter
 * than the context, and prompt + max_tokens within it.
 *
 * A prompt certain not to fit is refused without the work of reading it: a
 * token-id array of context or more elements before its ids are checked or
 * decoded, a text of context x max_token_bytes or more bytes before it is
 * tokenized ("has at least N tokens (B bytes)"; exact for the byte
 * tokenizer), and tokenizing stops as soon as the tokens fill the context.
 *
 * max_tokens is resolved once, here, per prompt: the client's value, else
 * REQUEST_DEFAULT_MAX_TOKENS (completions) or the rest of the context (chat),
 * in both cases cut to what the context leaves.
 *
 * Memory: gen_request_parse fills *out with malloc'd arrays that
 * gen_request_free releases (also after a failed parse; a zeroed request is
 * valid to free). Sequences made by gen_request_seq borrow the request's
 * prompt ids and stop strings: keep the request until they finish.
 * Threads: reentrant; the tokenizer must be safe to share (tokenizer.h).
 * Errors: gen_request_parse returns 0, or -1 with the client's error in *e
 * (400, or 500 for out of memory).
 */
#ifndef ORCH_REQUEST_H
#define ORCH_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/api_error.h"
#include "orchestrator/serve/chat_template.h"
#include "orchestrator/serve/grammar_mask.h"
#include "orchestrator/serve/sampler.h"
#include "orchestrator/serve/scheduler.h"

#define REQUEST_MAX_STOPS          16u   /* stop strings a client may give */
#define REQUEST_MAX_STOP_LEN       256u  /* bytes per stop string */
#define REQUEST_DEFAULT_MAX_TOKENS 16u   /* /v1/completions without max_tokens */
#define REQUEST_MAX_LOGIT_BIAS     1024u /* logit_bias entries */
#define REQUEST_MODEL_MAX          320u  /* bytes of a 'model' name */

/* What parsing is checked against. */
typedef struct request_limits {
    const tokenizer *tok;   /* encodes text prompts, decodes token prompts */
    const char *model_name; /* a given 'model' must equal it, or be known: */
    /* other served models (LoRA adapters, coserve.h): 1 when NAME is one;
     * NULL = only model_name */
    int (*model_known)(void *arg, const char *name);
    void *model_known_arg;
    uint32_t vocab;    /* token ids must be below it */
    uint32_t context;  /* prompt + max_tokens must fit in it */
    uint32_t max_seqs; /* prompts x n per request */
    /* Bytes of the longest token (request_max_token_bytes); 0 = unknown. A
     * text prompt of at least context x this many bytes is refused unread. */
    uint32_t max_token_bytes;
    /* Compiled structured-output grammars (grammar_mask.h); NULL = structured
     * output is refused (400). */
    grammar_cache *grammars;
    /* The chat template (chat_template.h) messages are rendered with and
     * whose stop strings chat requests get; NULL = orch-plain-v1, unless
     * chat_error is set: then no template is usable and chat requests are
     * refused (400) with that message. */
    const chat_template *chat_template;
    const char *chat_error;
} request_limits;

/* The byte length of tok's longest token (for request_limits). */
uint32_t request_max_token_bytes(const tokenizer *tok);

typedef struct gen_prompt {
    int32_t *ids; /* token ids (at least 1) */
    uint32_t n_ids;
    char *text; /* the ids decoded (echo), NUL-terminated */
    size_t text_len;
    uint32_t max_tokens; /* tokens to generate after it (resolved) */
} gen_prompt;

typedef struct gen_request {
    int chat;            /* chat completions (one prompt: the messages) */
    gen_prompt *prompts; /* [n_prompts] */
    uint32_t n_prompts;
    uint32_t n;   /* choices per prompt */
    char **stops; /* [n_stops]: the client's, then (chat) the template's */
    uint32_t n_stops;
    sampler_params sampling; /* temperature, top_k (0 = off), top_p */
    int has_seed;            /* seed given; otherwise the caller picks one */
    uint64_t seed;
    int stream;            /* SSE */
    int include_usage;     /* stream_options.include_usage (stream only) */
    int echo;              /* completions: the prompt text before the output */
    int logprobs;          /* log-probabilities of generated tokens */
    uint32_t top_logprobs; /* and this many alternatives */
    int ignore_eos;        /* keep going after the end-of-text token */
    int32_t *bias_ids;     /* logit_bias [n_bias] */
    float *bias;
    uint32_t n_bias;
    int32_t *stop_token_ids; /* [n_stop_token_ids] */
    uint32_t n_stop_token_ids;
    uint32_t min_tokens;
    /* Structured output: the grammar every sequence follows (NULL = none),
     * one matcher per sequence, and how the output is answered (tool_calls.h
     * TOOL_MODE_*: a tool call, or text). */
    grammar *grammar;
    grammar_matcher *matchers; /* [gen_request_n_seqs] */
    int tool_mode;
    /* the 'model' given ("" = none: the base model); answers echo it */
    char model[REQUEST_MODEL_MAX];
} gen_request;

int gen_request_parse(const request_limits *lim, int chat, const char *body, size_t len,
                      gen_request *out, api_error *e);
void gen_request_free(gen_request *r);

/* Sequences of the request: n_prompts x n; sequence i is choice i % n of
 * prompt i / n. */
uint32_t gen_request_n_seqs(const gen_request *r);

/* Fill the input fields of sequence i (prompt, max_tokens, sampling, the RNG
 * seeded with stream i % n of base_seed, stops, log-probability and stream
 * flags, and with structured output the grammar hooks of matcher i). The
 * caller sets lock, notify, user and cancel. */
void gen_request_seq(const gen_request *r, uint32_t i, uint64_t base_seed, sched_seq *q);

#endif
