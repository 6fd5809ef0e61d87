/*
 * chat_template.h - renders OpenAI chat `messages` into the prompt text a
 * model continues, through the model's own Jinja template (jinja.h) or one
 * of four built-in templates, and picks the template for a model (its
 * tokenizer_config.json "chat_template", or `orch serve --chat-template
 * NAME|FILE`).
 *
 * Built-ins (exact text; "\n" is a newline; developer messages count as
 * system messages in every template):
 *
 * "orch-plain-v1" (orch's own base models; the default):
 *     System: <content>\n        (role "system" or "developer")
 *     User: <content>\n          (role "user")
 *     Assistant: <content>\n     (role "assistant"; its tool_calls, if any,
 *                                 follow the content as call JSON lines,
 *                                 tool_calls.h)
 *     Tool: <content>\n          (role "tool": a function's result)
 *     Assistant:                 (the generation prompt; the model continues)
 *   A chat request with `tools` starts with one more system line, `System:
 *   Tools: <the tools array as compact JSON>` (request.c). Stops: "\nUser:",
 *   "\nSystem:". No BOS.
 *
 * "chatml" (Qwen 2/2.5/3, SmolLM, ...):
 *     <|im_start|>ROLE\n<content><|im_end|>\n     per message
 *     <|im_start|>assistant\n                     (the generation prompt)
 *   Content verbatim. Stops "<|im_end|>", "<|endoftext|>"; end of turn
 *   "<|im_end|>"; no BOS. Not rendered: a model's own default system prompt
 *   (Qwen2.5's "You are Qwen, ...", SmolLM's) and Qwen3's <think> handling
 *   of earlier assistant turns.
 *
 * "llama-2" (Llama-2-chat; meta-llama/Llama-2-7b-chat-hf's template):
 *   an optional first system message is folded into the first user turn;
 *   then user and assistant must alternate, starting with user:
 *     <s>[INST] <<SYS>>\n<system>\n<</SYS>>\n\n<user> [/INST]   (first turn)
 *     <s>[INST] <user> [/INST]                                 (later turns)
 *      <assistant> </s>                 (one space before and after)
 *   where the text of a turn (for the first: from <<SYS>> to the user's
 *   content) is stripped of leading and trailing white space as Python's
 *   str.strip() does; a system message alone renders as "". No generation
 *   prompt (the text after [/INST] is the model's). Stops "</s>", "[INST]"; end of turn "</s>"; BOS text "<s>".
 *
 * "llama-3" (Meta-Llama-3-Instruct):
 *     <|begin_of_text|>                       (before the first message)
 *     <|start_header_id|>ROLE<|end_header_id|>\n\n<content stripped><|eot_id|>
 *     <|start_header_id|>assistant<|end_header_id|>\n\n  (generation prompt)
 *   Stops "<|eot_id|>", "<|end_of_text|>"; end of turn "<|eot_id|>"; BOS text
 *   "<|begin_of_text|>".
 *
 * Roles other than system, developer, user, assistant and tool are rejected.
 * Only orch-plain-v1 renders tools: on the other templates `tools`, role
 * "tool" and assistant tool_calls are refused (request.c, 400).
 *
 * The model's own template ("jinja"): its Jinja text rendered by jinja.h
 * with messages ({role, content}; developer as system), add_generation_prompt
 * true, tools none, bos_token and eos_token of tokenizer_config.json. Its
 * family (below) gives the stop strings, end of turn and BOS text; a
 * template of no known family stops at its eos_token and has the BOS text
 * bos_token when the template writes bos_token. Tools are not rendered.
 *
 * Families: a Jinja chat template maps to the built-in whose characteristic
 * markers its text contains, checked in this order: "<|im_start|>" chatml,
 * "<|start_header_id|>" llama-3, "[INST]" llama-2. A template the
 * interpreter cannot parse is rendered by its family's built-in; with no
 * family either it is unsupported: chat requests are then refused with one
 * line naming --chat-template (completions still work).
 *
 * Memory: rendered text is malloc'd (NUL-terminated; caller frees); the
 * templates are static. Threads: everything is reentrant.
 * Errors: -1 with a one-line message (naming the message index, the name or
 * the file) in err.
 */
#ifndef ORCH_CHAT_TEMPLATE_H
#define ORCH_CHAT_TEMPLATE_H

#include <stddef.h>

#define CHAT_TEMPLATE_PLAIN_NAME "orch-plain-v1"
#define CHAT_TEMPLATE_MAX_STOPS  2 /* stop strings of any built-in */
#define CHAT_TEMPLATE_NAMES      "chatml, llama-2, llama-3, orch-plain-v1"

enum {
    CHAT_TEMPLATE_PLAIN = 0,
    CHAT_TEMPLATE_CHATML = 1,
    CHAT_TEMPLATE_LLAMA2 = 2,
    CHAT_TEMPLATE_LLAMA3 = 3,
    CHAT_TEMPLATE_JINJA = 4, /* the model's own template through jinja.h */
};

struct jinja_template;

typedef struct chat_template {
    const char *name; /* "chatml", ... */
    int kind;         /* CHAT_TEMPLATE_* */
    /* Stop strings the server adds to every chat request. */
    const char *stops[CHAT_TEMPLATE_MAX_STOPS];
    unsigned n_stops;
    /* The text that ends an assistant turn ("<|im_end|>"; NULL for
     * orch-plain-v1, whose turns end at a newline). */
    const char *end_of_turn;
    /* The BOS text the rendered prompt starts with (NULL = none): a server
     * must not add a second BOS token in front of it. */
    const char *bos_text;
    int tools; /* 1: renders tools, tool results and tool calls */
    /* CHAT_TEMPLATE_JINJA: the parsed template and the special tokens it
     * is given (NULL = none) */
    const struct jinja_template *jinja;
    const char *bos_token, *eos_token;
} chat_template;

typedef struct chat_message {
    const char *role;    /* NUL-terminated */
    const char *content; /* content_len bytes (need not be NUL-terminated) */
    size_t content_len;
} chat_message;

/* orch-plain-v1. */
const chat_template *chat_template_plain(void);

/* The built-in called name, or NULL. */
const chat_template *chat_template_find(const char *name);

/* 1 if role is one of system, developer, user, assistant, tool. */
int chat_template_role_valid(const char *role);

/* Render msgs through t (NULL = orch-plain-v1); add_generation_prompt
 * appends the cue for the assistant's next turn (llama-2 has none). Errors:
 * an unknown role, role tool where t has no tools, a missing content,
 * llama-2's alternation rule, out of memory. */
int chat_template_render(const chat_template *t, const chat_message *msgs, size_t n,
                         int add_generation_prompt, char **out, size_t *out_len,
                         char *err, size_t err_cap);

/* The built-in for a Jinja template text (the markers above): 0 with *out
 * set, or -1 with "the chat template of SOURCE is not one of the supported
 * families (chatml, llama-2, llama-3); name one with --chat-template" in
 * err. *marker (may be NULL) gets the marker that matched. */
int chat_template_detect(const char *jinja, const char *source, const chat_template **out,
                         const char **marker, char *err, size_t err_cap);

/* What serving uses: the template (NULL when none is usable, error says
 * why) and where it came from, for the startup line. A "jinja" template
 * lives in the choice (custom, prog, tokens): keep the choice while the
 * template is used and release it with chat_template_choice_free. */
typedef struct chat_template_choice {
    const chat_template *tmpl;
    char source[1024]; /* "--chat-template", "DIR/tokenizer_config.json
                          (family chatml)", "default" */
    char error[1024];  /* the refusal of chat requests when tmpl is NULL */
    chat_template custom;
    struct jinja_template *prog;
    char bos[256], eos[256];
} chat_template_choice;

/* Choose for serving. flag (--chat-template; NULL = not given): a
 * built-in's name, or a file with a Jinja template (a path: it exists,
 * names a directory or ends in .jinja); without it the first of
 * dirs[0..n_dirs) (NULLs skipped) holding tokenizer_config.json with a
 * "chat_template" (a string, or HF's list of {name, template} from which
 * "default" is taken), or a chat_template.jinja, gives the template; with
 * neither, orch-plain-v1. bos_token / eos_token come from that directory's
 * (for a FILE: the first directory's) tokenizer_config.json (a string, or
 * {"content": ...}). An unsupported template is not an error here:
 * out->tmpl is NULL and out->error says why. Returns -1 (message in err)
 * for an unknown name, an unreadable file or a malformed
 * tokenizer_config.json. */
int chat_template_choose(const char *flag, const char *const *dirs, size_t n_dirs,
                         chat_template_choice *out, char *err, size_t err_cap);

/* Release what a choice holds (its jinja template); safe on a zeroed or
 * freed choice. */
void chat_template_choice_free(chat_template_choice *c);

#endif
