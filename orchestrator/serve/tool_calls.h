/*
 * tool_calls.h - OpenAI function calling on /v1/chat/completions: `tools` and
 * `tool_choice` turned into an output grammar, the generated text read back
 * as a tool call, and tool calls of earlier assistant messages rendered into
 * the conversation.
 *
 * The model writes one call as compact JSON, {"name":"NAME","arguments":ARGS}
 * with ARGS valid against the function's `parameters` (json_schema.h; no
 * parameters = {}). tool_choice:
 *   "none"            no constraint, plain text (tools are not called);
 *   "required"        the output is a call of one of the functions;
 *   {"type":"function","function":{"name":N}}  a call of N;
 *   "auto" (default)  the model chooses: an output starting with '{' is a
 *                     call (then constrained as for "required"), anything
 *                     else is text (unconstrained after its first
 *                     character).
 * At most one call is generated per choice (parallel_tool_calls is
 * accepted; only one call is made). A call is answered as
 * message.tool_calls [{id "call_<16 hex>", type "function", function {name,
 * arguments (a JSON string)}}], content null, finish_reason "tool_calls".
 * Function names must match [A-Za-z0-9_-]{1,64}.
 *
 * Memory: regexes are appended to the caller's strbuf; views point into the
 * caller's text. Threads: reentrant. Errors: 0, or -1 with a 400 in *e whose
 * message names the JSON path (tools[1].function.parameters.properties.x:
 * ...).
 */
#ifndef ORCH_TOOL_CALLS_H
#define ORCH_TOOL_CALLS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "orchestrator/core/strbuf.h"
#include "orchestrator/serve/api_error.h"

enum { TOOL_MODE_NONE = 0, TOOL_MODE_CALL = 1, TOOL_MODE_AUTO = 2 };

/* tools / tool_choice / parallel_tool_calls of a chat body: *mode, and for
 * CALL / AUTO the output regex appended to re. */
int tool_calls_parse(const cJSON *root, int *mode, strbuf *re, api_error *e);

/* A generated text read as a call: header = `{"name":"N","arguments":` is
 * complete (name set); args = what follows (without the final '}' when
 * complete). */
typedef struct tool_call_view {
    int is_call;      /* the text starts with '{' */
    int header;       /* name known */
    const char *name; /* name_len bytes */
    size_t name_len;
    size_t args_off; /* where the arguments start in the text */
} tool_call_view;
void tool_call_read(const char *text, size_t len, tool_call_view *v);

/* "call_" + 16 hex digits from the response id and the choice index. */
void tool_call_id(const char *response_id, uint32_t choice, char out[24]);

/* An assistant message's tool_calls (messages[idx]) as the text the model
 * would have written (one call JSON per line) appended to out. */
int tool_calls_message_text(const cJSON *tool_calls, int idx, strbuf *out, api_error *e);

#endif
