/*
 * chat_template.c - the built-in chat templates (orch-plain-v1, chatml,
 * llama-2, llama-3), their selection from a model's Jinja template text and
 * rendering. See chat_template.h.
 */
#include "orchestrator/serve/chat_template.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/strbuf.h"
#include "orchestrator/core/util.h"
#include "orchestrator/serve/jinja.h"

static const chat_template builtins[] = {
    { .name = CHAT_TEMPLATE_PLAIN_NAME,
      .kind = CHAT_TEMPLATE_PLAIN,
      .stops = { "\nUser:", "\nSystem:" },
      .n_stops = 2,
      .tools = 1 },
    { .name = "chatml",
      .kind = CHAT_TEMPLATE_CHATML,
      .stops = { "<|im_end|>", "<|endoftext|>" },
      .n_stops = 2,
      .end_of_turn = "<|im_end|>" },
    { .name = "llama-2",
      .kind = CHAT_TEMPLATE_LLAMA2,
      .stops = { "</s>", "[INST]" },
      .n_stops = 2,
      .end_of_turn = "</s>",
      .bos_text = "<s>" },
    { .name = "llama-3",
      .kind = CHAT_TEMPLATE_LLAMA3,
      .stops = { "<|eot_id|>", "<|end_of_text|>" },
      .n_stops = 2,
      .end_of_turn = "<|eot_id|>",
      .bos_text = "<|begin_of_text|>" },
};
#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const chat_template *chat_template_plain(void) { return &builtins[0]; }

const chat_template *chat_template_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
    return NULL;
}

int chat_template_role_valid(const char *role) {
    static const char *const roles[] = { "system", "developer", "user", "assistant",
                                         "tool" };
    if (!role) return 0;
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i]) == 0) return 1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* White space as Python's str.strip() (and Jinja's trim filter) sees it      */
/* ------------------------------------------------------------------------- */
static int py_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* The code point of the well-formed UTF-8 sequence at s (n bytes left);
 * its length in *len, 0 when s does not start one. */
static unsigned utf8_at(const unsigned char *s, size_t n, size_t *len) {
    *len = 0;
    if (n == 0) return 0;
    if (s[0] < 0x80) {
        *len = 1;
        return s[0];
    }
    size_t k = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (k == 0 || k > n || s[0] > 0xf4) return 0;
    unsigned cp = s[0] & (0x7f >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    static const unsigned min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
    if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    *len = k;
    return cp;
}

/* Narrow [*s, *s + *n) to its text without leading and trailing white
 * space. */
static void py_strip(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, k;
    for (;;) {
        unsigned cp = utf8_at(p, len, &k);
        if (k == 0 || !py_space(cp)) break;
        p += k;
        len -= k;
    }
    while (len > 0) {
        size_t start = len - 1; /* the start of the last sequence */
        while (start > 0 && len - start < 4 && (p[start] & 0xc0) == 0x80) start--;
        unsigned cp = utf8_at(p + start, len - start, &k);
        if (k != len - start || !py_space(cp)) break;
        len = start;
    }
    *s = (const char *)p;
    *n = len;
}

/* ------------------------------------------------------------------------- */
/* Rendering                                                                  */
/* ------------------------------------------------------------------------- */
static int is_role(const chat_message *m, const char *r) {
    return strcmp(m->role, r) == 0;
}

/* system and developer are both the system role */
static int is_system(const chat_message *m) {
    return is_role(m, "system") || is_role(m, "developer");
}

/* The content of m (may be NULL when empty). */
static void put_content(strbuf *b, const chat_message *m) {
    if (m->content_len) strbuf_put(b, m->content, m->content_len);
}

static const char *plain_label(const chat_message *m) {
    if (is_system(m)) return "System: ";
    if (is_role(m, "user")) return "User: ";
    if (is_role(m, "assistant")) return "Assistant: ";
    return "Tool: ";
}

static void render_plain(const chat_message *msgs, size_t n, int gen, strbuf *b) {
    for (size_t i = 0; i < n; i++) {
        strbuf_puts(b, plain_label(&msgs[i]));
        put_content(b, &msgs[i]);
        strbuf_puts(b, "\n");
    }
    if (gen) strbuf_puts(b, "Assistant:");
}

static void render_chatml(const chat_message *msgs, size_t n, int gen, strbuf *b) {
    for (size_t i = 0; i < n; i++) {
        strbuf_puts(b, "<|im_start|>");
        strbuf_puts(b, is_system(&msgs[i]) ? "system" : msgs[i].role);
        strbuf_puts(b, "\n");
        put_content(b, &msgs[i]);
        strbuf_puts(b, "<|im_end|>\n");
    }
    if (gen) strbuf_puts(b, "<|im_start|>assistant\n");
}

static void render_llama3(const chat_message *msgs, size_t n, int gen, strbuf *b) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0) strbuf_puts(b, "<|begin_of_text|>");
        strbuf_puts(b, "<|start_header_id|>");
        strbuf_puts(b, is_system(&msgs[i]) ? "system" : msgs[i].role);
        strbuf_puts(b, "<|end_header_id|>\n\n");
        const char *c = msgs[i].content;
        size_t cl = msgs[i].content_len;
        if (cl) py_strip(&c, &cl);
        if (cl) strbuf_put(b, c, cl);
        strbuf_puts(b, "<|eot_id|>");
    }
    if (gen) strbuf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static int render_llama2(const chat_message *msgs, size_t n, strbuf *b, char *err,
                         size_t err_cap) {
    size_t first = n > 0 && is_system(&msgs[0]) ? 1 : 0; /* alone: renders "" */
    for (size_t i = first; i < n; i++) {
        const chat_message *m = &msgs[i];
        int want_user = (i - first) % 2 == 0;
        if (is_system(m)) {
            util_set_err(err, err_cap,
                         "messages[%zu]: the llama-2 template allows a system message "
                         "only as the first message",
                         i);
            return -1;
        }
        if (is_role(m, "user") != want_user) {
            util_set_err(err, err_cap,
                         "messages[%zu]: the llama-2 template needs roles that alternate "
                         "user/assistant/user/assistant/... (after an optional first "
                         "system message); got '%s' where '%s' was expected",
                         i, m->role, want_user ? "user" : "assistant");
            return -1;
        }
        strbuf t = { 0 }; /* the turn's text, stripped as a whole */
        if (i == first && first == 1) {
            strbuf_puts(&t, "<<SYS>>\n");
            put_content(&t, &msgs[0]);
            strbuf_puts(&t, "\n<</SYS>>\n\n");
        }
        put_content(&t, m);
        const char *c = t.p ? t.p : "";
        size_t cl = t.len;
        py_strip(&c, &cl);
        if (want_user) {
            strbuf_puts(b, "<s>[INST] ");
            strbuf_put(b, c, cl);
            strbuf_puts(b, " [/INST]");
        } else {
            strbuf_puts(b, " ");
            strbuf_put(b, c, cl);
            strbuf_puts(b, " </s>");
        }
        if (t.oom) b->oom = 1;
        strbuf_free(&t);
    }
    return 0;
}

/* The variables transformers gives a template: messages, add_generation_prompt,
 * tools (none), bos_token, eos_token. */
static int render_jinja(const chat_template *t, const chat_message *msgs, size_t n,
                        int gen, strbuf *b, char *err, size_t err_cap) {
    cJSON *vars = cJSON_CreateObject();
    cJSON *list = vars ? cJSON_AddArrayToObject(vars, "messages") : NULL;
    int oom = !list;
    for (size_t i = 0; !oom && i < n; i++) {
        char *c = malloc(msgs[i].content_len + 1);
        cJSON *m = cJSON_CreateObject();
        if (c && msgs[i].content_len) memcpy(c, msgs[i].content, msgs[i].content_len);
        if (c) c[msgs[i].content_len] = '\0';
        oom = !c || !m ||
              !cJSON_AddStringToObject(m, "role",
                                       is_system(&msgs[i]) ? "system" : msgs[i].role) ||
              !cJSON_AddStringToObject(m, "content", c);
        free(c);
        if (m && !cJSON_AddItemToArray(list, m)) {
            cJSON_Delete(m);
            oom = 1;
        }
    }
    if (!oom)
        oom = !cJSON_AddBoolToObject(vars, "add_generation_prompt", gen) ||
              !cJSON_AddNullToObject(vars, "tools") ||
              !(t->bos_token ? cJSON_AddStringToObject(vars, "bos_token", t->bos_token)
                             : cJSON_AddNullToObject(vars, "bos_token")) ||
              !(t->eos_token ? cJSON_AddStringToObject(vars, "eos_token", t->eos_token)
                             : cJSON_AddNullToObject(vars, "eos_token"));
    int rc = -1;
    if (oom)
        util_set_err(err, err_cap, "messages: out of memory");
    else
        rc = jinja_render(t->jinja, vars, b, err, err_cap);
    cJSON_Delete(vars);
    return rc;
}

int chat_template_render(const chat_template *t, const chat_message *msgs, size_t n,
                         int add_generation_prompt, char **out, size_t *out_len,
                         char *err, size_t err_cap) {
    if (!t) t = chat_template_plain();
    if (!out || (n && !msgs)) {
        util_set_err(err, err_cap, "messages: missing");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!chat_template_role_valid(msgs[i].role)) {
            util_set_err(err, err_cap,
                         "messages[%zu].role: '%.64s' is not one of system, "
                         "developer, user, assistant, tool",
                         i, msgs[i].role ? msgs[i].role : "(none)");
            return -1;
        }
        if (!t->tools && is_role(&msgs[i], "tool")) {
            util_set_err(err, err_cap,
                         "messages[%zu].role: 'tool' is not supported by the %s chat "
                         "template (only " CHAT_TEMPLATE_PLAIN_NAME " renders tools)",
                         i, t->name);
            return -1;
        }
        if (msgs[i].content_len && !msgs[i].content) {
            util_set_err(err, err_cap, "messages[%zu].content: missing", i);
            return -1;
        }
    }
    strbuf b = { 0 };
    strbuf_put(&b, "", 0); /* "" when nothing is rendered */
    switch (t->kind) {
    case CHAT_TEMPLATE_CHATML: render_chatml(msgs, n, add_generation_prompt, &b); break;
    case CHAT_TEMPLATE_LLAMA2:
        if (render_llama2(msgs, n, &b, err, err_cap) != 0) {
            strbuf_free(&b);
            return -1;
        }
        break;
    case CHAT_TEMPLATE_LLAMA3: render_llama3(msgs, n, add_generation_prompt, &b); break;
    case CHAT_TEMPLATE_JINJA:
        if (render_jinja(t, msgs, n, add_generation_prompt, &b, err, err_cap) != 0) {
            strbuf_free(&b);
            return -1;
        }
        break;
    default: render_plain(msgs, n, add_generation_prompt, &b); break;
    }
    if (b.oom || !b.p) {
        strbuf_free(&b);
        util_set_err(err, err_cap, "messages: out of memory");
        return -1;
    }
    *out = b.p;
    if (out_len) *out_len = b.len;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Selection                                                                  */
/* ------------------------------------------------------------------------- */
int chat_template_detect(const char *jinja, const char *source, const chat_template **out,
                         const char **marker, char *err, size_t err_cap) {
    static const struct {
        const char *marker, *name;
    } families[] = {
        { "<|im_start|>", "chatml" },
        { "<|start_header_id|>", "llama-3" },
        { "[INST]", "llama-2" },
    };
    for (size_t i = 0; jinja && i < sizeof families / sizeof families[0]; i++) {
        if (strstr(jinja, families[i].marker)) {
            *out = chat_template_find(families[i].name);
            if (marker) *marker = families[i].marker;
            return 0;
        }
    }
    util_set_err(err, err_cap,
                 "the chat template of %.400s is not one of the supported families "
                 "(chatml, llama-2, llama-3); name one with --chat-template",
                 source ? source : "the model");
    return -1;
}

static int is_file_like(const char *s) {
    struct stat st;
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 6 && strcmp(s + n - 6, ".jinja") == 0) ||
           stat(s, &st) == 0;
}

/* tokenizer_config.json's bos_token / eos_token: a string or an AddedToken
 * {"content": ...}; "" when absent or null. */
static int config_token(const cJSON *root, const char *key, const char *path, char *dst,
                        size_t cap, char *err, size_t err_cap) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, key);
    dst[0] = '\0';
    if (cJSON_IsObject(t)) t = cJSON_GetObjectItemCaseSensitive(t, "content");
    if (!t || cJSON_IsNull(t)) return 0;
    if (!cJSON_IsString(t) || strlen(t->valuestring) >= cap) {
        util_set_err(err, err_cap, "%.400s: %s must be a string of at most %zu bytes",
                     path, key, cap - 1);
        return -1;
    }
    snprintf(dst, cap, "%s", t->valuestring);
    return 0;
}

/* The template text of a tokenizer_config.json "chat_template" value: a
 * string, or a list of {name, template} (the one named "default"). NULL with
 * a message when it is neither. */
static const char *config_template(const cJSON *ct, const char *path, char *err,
                                   size_t err_cap) {
    if (cJSON_IsString(ct)) return ct->valuestring;
    if (cJSON_IsArray(ct)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0 &&
                cJSON_IsString(tmpl))
                return tmpl->valuestring;
        }
        util_set_err(err, err_cap,
                     "%.400s: chat_template is a list without a template named "
                     "'default'",
                     path);
        return NULL;
    }
    util_set_err(err, err_cap,
                 "%.400s: chat_template must be a string or a list of {name, template}",
                 path);
    return NULL;
}

/* dir's tokenizer_config.json: *found 0 when there is none; its special
 * tokens into out; *text (malloc'd) its chat template, NULL when it has
 * none. */
static int read_config(const char *dir, chat_template_choice *out, int *found,
                       char **text, char *err, size_t err_cap) {
    char path[4096];
    struct stat st;
    *found = 0;
    *text = NULL;
    snprintf(path, sizeof path, "%.4000s/tokenizer_config.json", dir);
    if (stat(path, &st) != 0) return 0;
    char *raw = NULL;
    if (fsio_read_file(path, (size_t)64 << 20, &raw, NULL, err, err_cap) != 0) return -1;
    cJSON *root = cJSON_Parse(raw);
    free(raw);
    int rc = 0;
    if (!cJSON_IsObject(root)) {
        util_set_err(err, err_cap, "%.400s: not a JSON object", path);
        rc = -1;
    }
    if (!rc)
        rc = config_token(root, "bos_token", path, out->bos, sizeof out->bos, err,
                          err_cap);
    if (!rc)
        rc = config_token(root, "eos_token", path, out->eos, sizeof out->eos, err,
                          err_cap);
    const cJSON *ct = rc ? NULL : cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (ct && !cJSON_IsNull(ct)) {
        const char *t = config_template(ct, path, err, err_cap);
        if (!t || !(*text = strdup(t))) {
            if (t) util_set_err(err, err_cap, "out of memory");
            rc = -1;
        }
    }
    cJSON_Delete(root);
    *found = rc == 0;
    return rc;
}

/* Decide from a template text: the model's own template through jinja.h
 * (with its family's stops), else its family's built-in, else none. */
static void use_text(const char *text, const char *path, chat_template_choice *out) {
    const chat_template *fam = NULL;
    const char *marker = NULL;
    char derr[768], perr[512];
    if (chat_template_detect(text, path, &fam, &marker, derr, sizeof derr) != 0)
        fam = NULL;
    if (jinja_parse(text, strlen(text), &out->prog, perr, sizeof perr) == 0) {
        chat_template *c = &out->custom;
        const char *bos = out->bos[0] ? out->bos : NULL,
                   *eos = out->eos[0] ? out->eos : NULL;
        memset(c, 0, sizeof *c);
        if (fam) {
            memcpy(c->stops, fam->stops, sizeof c->stops);
            c->n_stops = fam->n_stops;
            c->end_of_turn = fam->end_of_turn;
            c->bos_text = fam->bos_text;
        } else if (eos) {
            c->stops[0] = eos;
            c->n_stops = 1;
            c->end_of_turn = eos;
        }
        if (!fam && bos && strstr(text, "bos_token")) c->bos_text = bos;
        c->name = "jinja";
        c->kind = CHAT_TEMPLATE_JINJA;
        c->jinja = out->prog;
        c->bos_token = bos;
        c->eos_token = eos;
        out->tmpl = c;
        if (fam)
            snprintf(out->source, sizeof out->source, "%.900s, family %s: %s", path,
                     fam->name, marker);
        else
            snprintf(out->source, sizeof out->source, "%.900s, no known family", path);
    } else if (fam) {
        out->tmpl = fam;
        snprintf(out->source, sizeof out->source, "%.500s (%s), as the built-in: %.400s",
                 path, marker, perr);
    } else {
        out->tmpl = NULL;
        snprintf(out->source, sizeof out->source, "%.900s", path);
        snprintf(
            out->error, sizeof out->error,
            "the chat template of %.400s is not supported (%.400s) and is not one of "
            "the families chatml, llama-2, llama-3; name a template with "
            "--chat-template",
            path, perr);
    }
}

static int choose_file(const char *file, const char *const *dirs, size_t n_dirs,
                       chat_template_choice *out, char *err, size_t err_cap) {
    for (size_t i = 0; dirs && i < n_dirs; i++) { /* the model's special tokens */
        int found = 0;
        char *unused = NULL;
        if (!dirs[i]) continue;
        int rc = read_config(dirs[i], out, &found, &unused, err, err_cap);
        free(unused);
        if (rc) return -1;
        if (found) break;
    }
    char *text = NULL;
    char ferr[512];
    if (fsio_read_file(file, (size_t)16 << 20, &text, NULL, ferr, sizeof ferr) != 0) {
        util_set_err(err, err_cap, "--chat-template: %s", ferr);
        return -1;
    }
    use_text(text, file, out);
    free(text);
    return 0;
}

/* 1 when dir decided (out set), 0 when it holds no template, -1 on error. */
static int choose_dir(const char *dir, chat_template_choice *out, char *err,
                      size_t err_cap) {
    int found = 0;
    char *text = NULL;
    char path[4096];
    if (read_config(dir, out, &found, &text, err, err_cap) != 0) return -1;
    snprintf(path, sizeof path, "%.4000s/tokenizer_config.json", dir);
    if (!text) {
        struct stat st;
        snprintf(path, sizeof path, "%.4000s/chat_template.jinja", dir);
        if (stat(path, &st) != 0) {
            out->bos[0] = out->eos[0] = '\0';
            return 0;
        }
        if (fsio_read_file(path, (size_t)16 << 20, &text, NULL, err, err_cap) != 0)
            return -1;
    }
    use_text(text, path, out);
    free(text);
    return 1;
}

void chat_template_choice_free(chat_template_choice *c) {
    if (!c) return;
    jinja_free(c->prog);
    c->prog = NULL;
    if (c->tmpl == &c->custom) c->tmpl = NULL;
    memset(&c->custom, 0, sizeof c->custom);
}

int chat_template_choose(const char *flag, const char *const *dirs, size_t n_dirs,
                         chat_template_choice *out, char *err, size_t err_cap) {
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (flag) {
        out->tmpl = chat_template_find(flag);
        if (out->tmpl) {
            snprintf(out->source, sizeof out->source, "--chat-template");
            return 0;
        }
        if (!is_file_like(flag)) {
            util_set_err(err, err_cap,
                         "--chat-template: unknown template '%.300s' "
                         "(choices: " CHAT_TEMPLATE_NAMES ", or a Jinja template file)",
                         flag);
            return -1;
        }
        rc = choose_file(flag, dirs, n_dirs, out, err, err_cap);
    } else {
        for (size_t i = 0; dirs && i < n_dirs && rc == 0; i++)
            if (dirs[i]) rc = choose_dir(dirs[i], out, err, err_cap);
        if (rc == 0) {
            out->tmpl = chat_template_plain();
            snprintf(out->source, sizeof out->source, "default");
        }
    }
    if (rc < 0) {
        chat_template_choice_free(out);
        memset(out, 0, sizeof *out);
        return -1;
    }
    return 0;
}
