/*
 * chat_template.c - the "orch-plain-v1" chat template. See chat_template.h.
 */
#include "orchestrator/serve/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "orchestrator/core/util.h"

const char *const CHAT_TEMPLATE_STOPS[CHAT_TEMPLATE_N_STOPS] = { "\nUser:", "\nSystem:" };

static const char *role_label(const char *role) {
    if (!role) return NULL;
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) return "System: ";
    if (strcmp(role, "user") == 0) return "User: ";
    if (strcmp(role, "assistant") == 0) return "Assistant: ";
    if (strcmp(role, "tool") == 0) return "Tool: ";
    return NULL;
}

int chat_template_role_valid(const char *role) { return role_label(role) != NULL; }

int chat_template_render(const chat_message *msgs, size_t n, char **out, size_t *out_len,
                         char *err, size_t err_cap) {
    static const char cue[] = "Assistant:";
    if (!out || (n && !msgs)) {
        util_set_err(err, err_cap, "messages: missing");
        return -1;
    }
    size_t total = sizeof cue;
    for (size_t i = 0; i < n; i++) {
        const char *label = role_label(msgs[i].role);
        if (!label) {
            util_set_err(err, err_cap,
                         "messages[%zu].role: '%s' is not one of system, "
                         "developer, user, assistant, tool",
                         i, msgs[i].role ? msgs[i].role : "(none)");
            return -1;
        }
        if (msgs[i].content_len && !msgs[i].content) {
            util_set_err(err, err_cap, "messages[%zu].content: missing", i);
            return -1;
        }
        total += strlen(label) + msgs[i].content_len + 1;
    }
    char *buf = malloc(total);
    if (!buf) {
        util_set_err(err, err_cap, "messages: out of memory");
        return -1;
    }
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *label = role_label(msgs[i].role);
        size_t ll = strlen(label);
        memcpy(buf + len, label, ll);
        len += ll;
        if (msgs[i].content_len) memcpy(buf + len, msgs[i].content, msgs[i].content_len);
        len += msgs[i].content_len;
        buf[len++] = '\n';
    }
    memcpy(buf + len, cue, sizeof cue);
    len += sizeof cue - 1;
    *out = buf;
    if (out_len) *out_len = len;
    return 0;
}
