#!/usr/bin/env python3
"""chat_template_ref.py - reference renderings of real chat templates.

Renders the Jinja chat templates in tests/fixtures/chat_templates/*.jinja with
the real Jinja2 (the environment Hugging Face transformers' apply_chat_template
uses: a sandboxed environment with trim_blocks and lstrip_blocks, the
loopcontrols extension, raise_exception and a tojson filter) over a fixed set
of conversations, and writes what each gives (or the exception it raises) to
tests/fixtures/chat_templates/rendered.json. tests/test_chat_template.c checks
that orch's built-in templates (orchestrator/serve/chat_template.c) give the
same text byte for byte.

usage: /usr/bin/python3 tools/chat_template_ref.py [--check]
  --check  render and compare with the committed rendered.json instead of
           writing it (exit 1 on a difference). Needs the jinja2 module.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "chat_templates")

# template file -> (the built-in that must give the same text, special tokens,
# cases where the built-in differs on purpose (chat_template.h says how))
QWEN3_DIFFERS = {"no_generation_prompt", "ends_with_assistant", "think"}  # Qwen3: <think>
TEMPLATES = {
    "qwen3.jinja": ("chatml", {"bos_token": None, "eos_token": "<|im_end|>"}, QWEN3_DIFFERS),
    "llama3-npm.jinja": ("llama-3", {"bos_token": "<|begin_of_text|>",
                                     "eos_token": "<|end_of_text|>"},
                         {"no_generation_prompt"}),  # its generation prompt is unconditional
    "llama3-instruct.jinja": ("llama-3", {"bos_token": "<|begin_of_text|>",
                                          "eos_token": "<|end_of_text|>"}, set()),
    "llama2-chat.jinja": ("llama-2", {"bos_token": "<s>", "eos_token": "</s>"}, set()),
    "zephyr.jinja": (None, {"bos_token": "<s>", "eos_token": "</s>"}, set()),
    "features.jinja": (None, {"bos_token": "<s>", "eos_token": "</s>"}, set()),
}
# More real templates (from the template strings in llama.cpp's
# tests/test-chat-template.cpp), rendered by the interpreter only.
for _name in ("gemma-7b-it", "deepseek-coder-33b-instruct", "vicuna-13b-1.1",
              "fusionnet-34bx2-moe", "c4ai-command-r-plus", "openchat-3.5-0106",
              "phi-3-vision", "orion-14b-chat",
              # and llama.cpp's models/templates/ copies of the published ones
              "deepseek-r1-distill-qwen-32b", "mistral-small-3.1-24b-instruct-2503"):
    TEMPLATES[_name + ".jinja"] = (None, {"bos_token": "<s>", "eos_token": "</s>"}, set())
# Templates whose text holds today's date (strftime_now) unless the
# conversation starts with a system message: only those conversations.
DATED = {"mistral-small-3.1-24b-instruct-2503.jinja"}


def m(role, content):
    return {"role": role, "content": content}


# (name, messages, add_generation_prompt); the llama2_* cases only for
# templates that are not chatml-like
CONVERSATIONS = [
    ("user", [m("user", "Hello!")], True),
    ("system_user", [m("system", "You are terse."), m("user", "Hi")], True),
    ("multi_turn", [m("system", "Be kind."), m("user", "What is 2+2?"),
                    m("assistant", "4."), m("user", "And 3+3?")], True),
    ("no_system_multi", [m("user", "a"), m("assistant", "b"), m("user", "c")], True),
    ("whitespace", [m("user", "  padded \n"), m("assistant", "\n reply\t"),
                    m("user", "\u3000wide space\u00a0")], True),
    ("multiline", [m("user", "line one\nline two\n\nline four")], True),
    ("utf8", [m("system", "Réponds en français."), m("user", "Ça va ? \U0001F600")], True),
    ("no_generation_prompt", [m("user", "Hi"), m("assistant", "Hello.")], False),
    ("ends_with_assistant", [m("user", "Hi"), m("assistant", "Hello.")], True),
    ("think", [m("user", "Hi"), m("assistant", "<think>\nhmm\n</think>\n\nHello."),
               m("user", "Again")], True),
    ("llamacpp", [m("system", "You are a helpful assistant"), m("user", "Hello"),
                  m("assistant", "Hi there"), m("user", "Who are you"),
                  m("assistant", "   I am an assistant   "), m("user", "Another question")], True),
    ("llama2_system_only", [m("system", "s")], True),
    ("llama2_two_users", [m("user", "a"), m("user", "b")], True),
    ("llama2_assistant_first", [m("assistant", "a"), m("user", "b")], True),
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def render_all():
    env = environment()
    out = []
    for fname, (builtin, tokens, differs) in TEMPLATES.items():
        with open(os.path.join(FIXTURES, fname), encoding="utf-8") as f:
            tmpl = env.from_string(f.read())
        for name, msgs, gen in CONVERSATIONS:
            if name.startswith("llama2_") and fname not in ("llama2-chat.jinja", "features.jinja"):
                continue
            if fname in DATED and msgs[0]["role"] != "system":
                continue
            case = {"template": fname,
                    "builtin": builtin if name not in differs else None,
                    "case": name, "add_generation_prompt": gen, "messages": msgs,
                    "vars": tokens}
            try:
                case["text"] = tmpl.render(messages=msgs, add_generation_prompt=gen,
                                           tools=None, **tokens)
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            out.append(case)
    return out


def main():
    cases = render_all()
    text = json.dumps(cases, ensure_ascii=False, indent=1) + "\n"
    path = os.path.join(FIXTURES, "rendered.json")
    if "--check" in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                print("chat_template_ref: %s differs from what jinja2 renders" % path)
                return 1
        print("chat_template_ref: %d renderings match" % len(cases))
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print("chat_template_ref: wrote %d renderings to %s" % (len(cases), path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
