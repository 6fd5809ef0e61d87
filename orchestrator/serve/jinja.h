/*
 * jinja.h - the subset of Jinja that chat templates use, parsed once and
 * rendered per request, the way Hugging Face transformers renders a
 * tokenizer_config.json "chat_template" (Jinja2 with trim_blocks and
 * lstrip_blocks; undefined values are empty and falsy).
 *
 * Supported:
 *   text, {{ expr }}, {% ... %}, {# ... #}, the - modifiers of all three
 *   and + of a block tag;
 *   {% if %}/{% elif %}/{% else %}/{% endif %}; {% for x in expr %} ...
 *   {% endfor %} (also for a, b in pairs, for x in xs if c, and {% else %}
 *   for an empty loop) with loop.index, index0, revindex, revindex0, first,
 *   last, length, previtem, nextitem (each iteration is a scope: a set
 *   inside it does not leak out, as in Jinja2); {% set x = expr %} and
 *   {% set ns.attr = expr %} on a namespace();
 *   literals (strings with Python escapes, integers, true/false/none in both
 *   cases, lists, dicts), names, a.b, a[i] (negative i), a[start:stop:step]
 *   on lists and strings (by code point), calls, x if c else y, or, and,
 *   not, == != < > <= >=, in, not in, + - * // % (integers), + and ~ on
 *   strings, + on lists, unary -;
 *   filters trim, length, count, tojson (as transformers' json.dumps with
 *   ensure_ascii=False; indent=N), string, lower, upper and capitalize (ASCII
 *   letters), first, last, join, default, reverse, list, items, selectattr,
 *   rejectattr, select, reject, map(attribute=...); tests defined,
 *   undefined, none, string, number, integer, boolean, mapping, sequence,
 *   iterable, true, false, odd, even, eq/equalto, ne, in; string methods
 *   startswith, endswith, strip, lstrip, rstrip, split, replace, and upper,
 *   lower, title, capitalize (ASCII letters); dict methods get, items, keys,
 *   values; globals namespace(...), raise_exception(msg), range(...),
 *   strftime_now(fmt) (the local time, as transformers gives it).
 * Anything else (macro, call, filter blocks, break/continue, float
 * literals, a filter or test not listed) is refused with a one-line error
 * naming it: at parse time for statements and syntax, at render time for
 * names of filters, tests and methods.
 *
 * Limits: nesting 200 deep, 64 MiB of output, 2^20 items per list made by
 * the template, 256 MiB of memory, 10^7 steps per render (past one: an
 * error naming it).
 *
 * Limits: nesting 200 deep, 64 MiB of output, 2^20 items per list made by
 * the template, 256 MiB of memory, 10^7 steps per render (past one: an
 * error naming it).
 *
 * Variables come from a JSON object (cJSON): strings, numbers (integers
 * only), booleans, null (= none), arrays (lists) and objects (dicts); a
 * name not in it is undefined.
 *
 * Memory: jinja_parse returns a template owned by the caller
 * (jinja_free); jinja_render appends to the caller's strbuf and frees its
 * temporary memory before returning. Threads: a parsed template is
 * immutable; any number of threads may render it at once.
 * Errors: 0, or -1 with a message in err: parse errors name the line;
 * render errors give raise_exception's message or name what failed.
 */
#ifndef ORCH_JINJA_H
#define ORCH_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "orchestrator/core/strbuf.h"

typedef struct jinja_template jinja_template;

int jinja_parse(const char *src, size_t len, jinja_template **out, char *err,
                size_t err_cap);
void jinja_free(jinja_template *t);

/* Render t with the variables of vars (a JSON object; borrowed), appending
 * to out. raise_exception(msg) fails with msg. */
int jinja_render(const jinja_template *t, const cJSON *vars, strbuf *out, char *err,
                 size_t err_cap);

#endif
