#!/usr/bin/env bash
# serve_chat_template.sh - `orch serve` picks the chat template of the model
# (mock engine, byte tokenizer; real templates of tests/fixtures/chat_templates):
# without one, orch-plain-v1; Qwen3's template in the run directory's
# tokenizer_config.json is rendered by orch's Jinja interpreter with chatml's
# stops: the startup line names it, a chat request's prompt is exactly the
# chatml text (usage.prompt_tokens, and the mock's greedy continuation of that
# text), `tools` are refused (400); --chat-template llama-3 overrides it with
# the built-in; --chat-template FILE renders Llama 3's Jinja file with the
# special tokens of the model's tokenizer_config.json; the checkpoint
# directory's file wins over the run directory's (TinyLlama's Zephyr template:
# no known family, stops at its eos_token); a template the interpreter cannot
# parse and of no family starts with a warning, refuses chat with one line
# and still serves completions; a bad --chat-template name or a missing file
# exits 2 with its message.
source "$(dirname "$0")/serve/common.sh"
FIX=$(cd "$(dirname "$0")/fixtures/chat_templates" && pwd)
cd "$T" || exit 1

for i in $(seq 1 50); do echo "In the beginning God created the heaven and the earth $i."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prep.log 2>&1 || { cat prep.log; fail "prepare"; }
cat >cfg.json <<'JSON'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 512, "layers": 1,
            "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 1, "lr": 1e-3,
            "eval_every": 0, "eval_batches": 1, "checkpoint_every": 1},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
JSON
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; fail "train"; }
ckpt=$(ls -d run/ckpt-* | tail -n 1)
[ -d "$ckpt" ] || fail "no checkpoint directory"

# tokenizer_config.json as HF writes it (fixture "-" = no chat_template)
tok_config() { # dir fixture|- bos eos
  local src=-
  [ "$2" = - ] || src="$FIX/$2"
  "$PY" -c 'import json,sys
d = {"bos_token": sys.argv[3] or None, "eos_token": sys.argv[4]}
if sys.argv[1] != "-":
    d["chat_template"] = open(sys.argv[1]).read()
json.dump(d, open(sys.argv[2], "w"), indent=2)' "$src" "$1/tokenizer_config.json" "$3" "$4"
}

cat >checks.py <<'PY'
import sys
from client import check, greedy, post

port, want, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
texts = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
              "<|im_start|>assistant\n",
    "llama-3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "zephyr": "<|system|>\nBe brief.</s>\n<|user|>\nHello there</s>\n<|assistant|>\n",
    "orch-plain-v1": "System: Be brief.\nUser: Hello there\nAssistant:",
}
st, js, _ = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 5, "temperature": 0})
if want == "unsupported":
    check(st == 400 and js["error"]["param"] == "messages" and
          js["error"]["code"] == "unsupported_chat_template" and
          "is not supported (chat template: line 1: the tag 'macro' is not supported) and is not one "
          "of the families chatml, llama-2, llama-3; name a template with --chat-template"
          in js["error"]["message"], "unsupported template: %s %s" % (st, js))
    st, js, _ = post(port, "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == greedy("Hi", 3), "completions %s %s" % (st, js))
    sys.exit(0)
prompt = texts[want]
check(st == 200, "chat %s %s" % (st, js))
check(js["usage"]["prompt_tokens"] == len(prompt.encode()), "%s prompt tokens %s" % (want, js["usage"]))
check(js["choices"][0]["message"]["content"] == greedy(prompt, 5), "%s text %s" % (want, js))
tools = [{"type": "function", "function": {"name": "f"}}]
st, js, _ = post(port, "/v1/chat/completions", {"messages": msgs, "tools": tools})
if name == "orch-plain-v1":
    check(st == 200, "tools on orch-plain-v1 %s %s" % (st, js))
else:
    check(st == 400 and js["error"]["param"] == "tools" and js["error"]["message"] ==
          "'tools' are not supported by the %s chat template (only orch-plain-v1 renders them)" % name,
          "tools refused %s %s" % (st, js))
PY

serve_check() { # name want template-name [serve options...]
  local name=$1 want=$2 tname=$3; shift 3
  start_server "$name" --checkpoint run "$@"
  "$PY" checks.py "$PORT" "$want" "$tname" || { cat "$T/$name.log"; fail "$name checks"; }
  stop_server "$PID" || fail "$name: exit status $? after SIGTERM"
}
line() { # name text: the log has the line "orch serve: chat template TEXT"
  grep -qxF "orch serve: chat template $2" "$1.log" || { cat "$1.log"; fail "$1: no line 'chat template $2'"; }
}

# no template anywhere: orch-plain-v1, as before; a tokenizer_config.json
# without chat_template changes nothing
serve_check plain orch-plain-v1 orch-plain-v1
line plain "orch-plain-v1 (default)"
tok_config run - '<|begin_of_text|>' '<|end_of_text|>'
serve_check plain2 orch-plain-v1 orch-plain-v1
line plain2 "orch-plain-v1 (default)"
# a Jinja file, with the model's special tokens
serve_check file llama-3 jinja --chat-template "$FIX/llama3-instruct.jinja"
line file "jinja ($FIX/llama3-instruct.jinja, family llama-3: <|start_header_id|>)"

# Qwen3's template in the run directory: its own Jinja, chatml's stops
tok_config run qwen3.jinja '' '<|im_end|>'
serve_check qwen chatml jinja
line qwen "jinja (run/tokenizer_config.json, family chatml: <|im_start|>)"
serve_check override llama-3 llama-3 --chat-template llama-3
line override "llama-3 (--chat-template)"

# the checkpoint directory's file wins over the run directory's
tok_config "$ckpt" zephyr.jinja '<s>' '</s>'
serve_check zephyr zephyr jinja
line zephyr "jinja ($ckpt/tokenizer_config.json, no known family)"

# a template orch cannot render: chat refused, completions served
"$PY" -c 'import json,sys
json.dump({"eos_token": "</s>", "chat_template": "{% macro m() %}<|user|>{% endmacro %}"}, open(sys.argv[1], "w"))' \
  "$ckpt/tokenizer_config.json"
serve_check macro unsupported -
grep -qxF "orch: warning: serve: the chat template of $ckpt/tokenizer_config.json is not supported (chat template: line 1: the tag 'macro' is not supported) and is not one of the families chatml, llama-2, llama-3; name a template with --chat-template; /v1/chat/completions is refused" macro.log ||
  { cat macro.log; fail "macro: warning line"; }

# bad flags exit 2 before serving
"$ORCH_BIN" serve --checkpoint run --port 0 --chat-template qwen 2>e1.txt; rc=$?
[ "$rc" -eq 2 ] || fail "unknown --chat-template: exit $rc"
grep -qxF "orch: error: serve: --chat-template: unknown template 'qwen' (choices: chatml, llama-2, llama-3, orch-plain-v1, or a Jinja template file)" e1.txt ||
  { cat e1.txt; fail "unknown --chat-template message"; }
"$ORCH_BIN" serve --checkpoint run --port 0 --chat-template nothere.jinja 2>e2.txt; rc=$?
[ "$rc" -eq 2 ] || fail "--chat-template missing FILE: exit $rc"
grep -qxF "orch: error: serve: --chat-template: nothere.jinja: no such file or directory" e2.txt ||
  { cat e2.txt; fail "--chat-template FILE message"; }
"$ORCH_BIN" serve --help 2>&1 | grep -q -- '--chat-template NAME|FILE' || fail "serve --help lacks --chat-template"
echo "serve_chat_template: ok"
