/*
 * chat_template.h - renders OpenAI chat `messages` into the prompt text our
 * plain (base, non-instruction-tuned) GPT models continue.
 *
 * The template ("orch-plain-v1"), one line per message, then the cue:
 *
 *     System: <content>\n        (role "system" or "developer")
 *     User: <content>\n          (role "user")
 *     Assistant: <content>\n     (role "assistant"; its tool_calls, if any,
 *                                 follow the content as call JSON lines,
 *                                 tool_calls.h)
 *     Tool: <content>\n          (role "tool": a function's result)
 *     Assistant:                 (always appended; the model continues here)
 *
 * A chat request with `tools` starts with one more system line, `System:
 * Tools: <the tools array as compact JSON>` (request.c), so the model sees
 * the functions it may call. Content is used verbatim (it may contain
 * newlines). Roles other than
 * system, developer, user, assistant and tool are rejected. The server adds the
 * stop strings CHAT_TEMPLATE_STOPS ("\nUser:" and "\nSystem:") to every chat
 * request, so generation ends where the model starts writing the next turn;
 * a reply therefore never contains them.
 *
 * Memory: *out is malloc'd (NUL-terminated; caller frees).
 * Threads: reentrant. Errors: -1 with a message naming the message index.
 */
#ifndef ORCH_CHAT_TEMPLATE_H
#define ORCH_CHAT_TEMPLATE_H

#include <stddef.h>

#define CHAT_TEMPLATE_NAME    "orch-plain-v1"
#define CHAT_TEMPLATE_N_STOPS 2
extern const char *const CHAT_TEMPLATE_STOPS[CHAT_TEMPLATE_N_STOPS];

typedef struct chat_message {
    const char *role;    /* NUL-terminated */
    const char *content; /* content_len bytes (need not be NUL-terminated) */
    size_t content_len;
} chat_message;

/* 1 if role is accepted by the template. */
int chat_template_role_valid(const char *role);

int chat_template_render(const chat_message *msgs, size_t n, char **out, size_t *out_len,
                         char *err, size_t err_cap);

#endif
