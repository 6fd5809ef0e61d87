#!/usr/bin/env bash
# serve_chat_template.sh - `orch serve` picks the chat template of the model:
# a mock-engine checkpoint whose directory holds a tokenizer_config.json with
# Qwen3's real template (tests/fixtures/chat_templates) is served with
# chatml: the startup line names it, a chat request's prompt is exactly the
# chatml text (usage.prompt_tokens with the byte tokenizer, and the mock's
# greedy continuation of that text), `tools` are refused (400);
# --chat-template llama-3 overrides it; the checkpoint directory's file wins
# over the run directory's; a template of no supported family (TinyLlama's
# Zephyr) starts with a warning, refuses chat with the one-line message and
# still serves completions; a checkpoint without a template keeps
# orch-plain-v1; a bad --chat-template name or a file exits 2 with its
# message.
source "$(dirname "$0")/serve/common.sh"
FIX=$(cd "$(dirname "$0")/fixtures/chat_templates" && pwd)
cd "$T" || exit 1

for i in $(seq 1 50); do echo "In the beginning God created the heaven and the earth $i."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prep.log 2>&1 || { cat prep.log; fail "prepare"; }
cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 512, "layers": 1,
            "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 1, "lr": 1e-3,
            "eval_every": 0, "eval_batches": 1, "checkpoint_every": 1},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; fail "train"; }
ckpt=$(ls -d run/ckpt-* | tail -n 1)
[ -d "$ckpt" ] || fail "no checkpoint directory"

# tokenizer_config.json with a fixture's template (as HF writes it)
tok_config() { # fixture dir
  "$PY" -c 'import json,sys
json.dump({"bos_token": None, "eos_token": "<|im_end|>",
           "chat_template": open(sys.argv[1]).read()}, open(sys.argv[2], "w"), indent=2)' \
    "$FIX/$1" "$2/tokenizer_config.json"
}

cat >checks.py <<'EOF'
import json, sys
from client import check, greedy, post

port, want = int(sys.argv[1]), sys.argv[2]
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
texts = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
              "<|im_start|>assistant\n",
    "llama-3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "orch-plain-v1": "System: Be brief.\nUser: Hello there\nAssistant:",
}
st, js, _ = post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 5, "temperature": 0})
if want == "unsupported":
    check(st == 400 and js["error"]["param"] == "messages" and
          js["error"]["code"] == "unsupported_chat_template" and
          "is not one of the supported families (chatml, llama-2, llama-3); name one with "
          "--chat-template" in js["error"]["message"], "unsupported template: %s %s" % (st, js))
    st, js, _ = post(port, "/v1/completions", {"prompt": "Hi", "max_tokens": 3, "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == greedy("Hi", 3), "completions %s %s" % (st, js))
    sys.exit(0)
prompt = texts[want]
check(st == 200, "chat %s %s" % (st, js))
check(js["usage"]["prompt_tokens"] == len(prompt.encode()), "%s prompt tokens %s" % (want, js["usage"]))
check(js["choices"][0]["message"]["content"] == greedy(prompt, 5), "%s text %s" % (want, js))
tools = [{"type": "function", "function": {"name": "f"}}]
st, js, _ = post(port, "/v1/chat/completions", {"messages": msgs, "tools": tools})
if want == "orch-plain-v1":
    check(st == 200, "tools on orch-plain-v1 %s %s" % (st, js))
else:
    check(st == 400 and js["error"]["param"] == "tools" and js["error"]["message"] ==
          "'tools' are not supported by the %s chat template (only orch-plain-v1 renders them)" % want,
          "tools refused %s %s" % (st, js))
EOF

serve_check() { # name want [serve options...]
  local name=$1 want=$2; shift 2
  start_server "$name" --checkpoint run "$@"
  "$PY" checks.py "$PORT" "$want" || { cat "$T/$name.log"; fail "$name checks"; }
  stop_server "$PID" || fail "$name: exit status $? after SIGTERM"
}

# no template anywhere: orch-plain-v1, as before
serve_check plain orch-plain-v1
grep -q 'orch serve: chat template orch-plain-v1 (default)' plain.log || fail "plain: startup line"

# Qwen3's template in the run directory: chatml
tok_config qwen3.jinja run
serve_check qwen chatml
grep -qF 'orch serve: chat template chatml (run/tokenizer_config.json (<|im_start|>))' qwen.log ||
  { cat qwen.log; fail "qwen: startup line"; }
serve_check override llama-3 --chat-template llama-3
grep -qF 'orch serve: chat template llama-3 (--chat-template)' override.log || fail "override: startup line"

# the checkpoint directory's file wins over the run directory's
tok_config zephyr.jinja "$ckpt"
serve_check zephyr unsupported
grep -qF "orch: warning: serve: the chat template of $ckpt/tokenizer_config.json is not one of the supported families (chatml, llama-2, llama-3); name one with --chat-template; /v1/chat/completions is refused" zephyr.log ||
  { cat zephyr.log; fail "zephyr: warning line"; }
grep -q 'orch serve: ready' zephyr.log || fail "zephyr: not ready"

# bad flags exit 2 before serving
"$ORCH_BIN" serve --checkpoint run --port 0 --chat-template qwen 2>e1.txt; rc=$?
[ "$rc" -eq 2 ] || fail "unknown --chat-template: exit $rc"
grep -qF "serve: --chat-template: unknown template 'qwen' (choices: chatml, llama-2, llama-3, orch-plain-v1)" e1.txt ||
  { cat e1.txt; fail "unknown --chat-template message"; }
"$ORCH_BIN" serve --checkpoint run --port 0 --chat-template "$FIX/qwen3.jinja" 2>e2.txt; rc=$?
[ "$rc" -eq 2 ] || fail "--chat-template FILE: exit $rc"
grep -qF "Jinja template files are not interpreted" e2.txt || { cat e2.txt; fail "--chat-template FILE message"; }
"$ORCH_BIN" serve --help 2>&1 | grep -q -- '--chat-template NAME' || fail "serve --help lacks --chat-template"
echo "serve_chat_template: ok"
