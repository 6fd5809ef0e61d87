/*
 * tokenize_api.h - POST /tokenize and POST /detokenize: the served model's
 * tokenizer over HTTP, answering both llama.cpp's and vLLM's forms.
 *
 *   /tokenize    {"model"?: name, "content" | "prompt": text,
 *                 "add_special"? | "add_special_tokens"?: bool,
 *                 "with_pieces"?: bool}
 *             -> {"tokens": [ids] (with_pieces: [{"id", "piece"}]),
 *                 "count": n, "max_model_len": context}
 *                A piece is its text when it is valid UTF-8 on its own, else
 *                the array of its byte values (as llama.cpp). add_special
 *                (default true, as vLLM's add_special_tokens) puts the model's
 *                BOS in front when its tokenizer_config asks for one and the
 *                text does not already start with it, as a completion prompt
 *                gets it; false gives the text's tokens alone. byte and gpt2
 *                tokenizers add nothing either way.
 *   /detokenize  {"model"?: name, "tokens": [ids]}
 *             -> {"content": text, "prompt": text} (llama.cpp's and vLLM's
 *                name for the same string)
 *
 * The body is checked as generation requests are (json_strict.h): exactly
 * one of content / prompt, no unknown field (400 unknown_parameter), a
 * 'model' other than the served one is 404 model_not_found, token ids
 * outside the vocabulary are 400 naming the position.
 *
 * Memory: the answer is appended to *out (the caller frees out->p, also on
 * error). Threads: reentrant (the tokenizer is shared read-only). Errors: 0,
 * or -1 with the client's error in *e (400/404, 500 out of memory).
 */
#ifndef ORCH_TOKENIZE_API_H
#define ORCH_TOKENIZE_API_H

#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/data/tokenizer.h"
#include "orchestrator/serve/api_error.h"

typedef struct tokenize_api_limits {
    const tokenizer *tok;
    const char *model_name; /* a given 'model' must equal it */
    uint32_t context;       /* reported as max_model_len */
} tokenize_api_limits;

int tokenize_api_tokenize(const tokenize_api_limits *lim, const char *body, size_t len,
                          strbuf *out, api_error *e);
int tokenize_api_detokenize(const tokenize_api_limits *lim, const char *body, size_t len,
                            strbuf *out, api_error *e);

#endif
