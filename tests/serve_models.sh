#!/usr/bin/env bash
# serve_models.sh - `orch serve MODEL` on the mock engine: MODEL as an orch
# run directory (a llama checkpoint: /v1/models id, max_model_len and
# architecture; --served-model-name; --max-model-len capping prompt +
# completion and refused above the context), as a Hugging Face model
# directory and as a GGUF file (both exported from a gpt2 checkpoint and
# imported on the fly into a temporary checkpoint that is gone after the
# server stops; the same greedy text as the checkpoint itself), -m/--model,
# --tokenizer for an imported Hugging Face model, and MODEL errors (one line,
# exit 2). The Hugging Face and GGUF part needs
# the GPT-2 vocabulary (skipped with one line otherwise).
source "$(dirname "$0")/serve/common.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$T" || exit 1
mkdir tmp
export TMPDIR="$T/tmp"

# models_json PORT: the /v1/models body.
models_json() { "$PY" -c "import sys,client; sys.stdout.write(client.request($1,'GET','/v1/models')[2].decode())"; }
# complete PORT MODEL PROMPT MAX: the greedy text (or the error message).
complete() {
  "$PY" - "$@" <<'PY'
import sys, client
port, model, prompt, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
st, js, _ = client.post(port, "/v1/completions",
                        {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0})
sys.stdout.write(js["choices"][0]["text"] if st == 200 else "%d %s" % (st, js["error"]["message"]))
PY
}
# expect_err STATUS TEXT CMD...: exit STATUS, the last stderr line is the
# error and contains TEXT.
expect_err() {
  local want=$1 text=$2; shift 2
  "$@" >out.txt 2>err.txt
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat err.txt; fail "$* exited $rc, not $want"; }
  [ "$(grep -c '^orch: error: ' err.txt)" -eq 1 ] || { cat err.txt; fail "$*: not one error line"; }
  grep -qF -- "$text" err.txt || fail "$*: '$(cat err.txt)' lacks '$text'"
}

# 1. A llama checkpoint trained on the mock (byte tokenizer).
for i in $(seq 1 200); do echo "verse $i: in the beginning was the word."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data_byte --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; fail "prepare byte"; }
"$ORCH_BIN" train --config "$ROOT/configs/llama_tiny.json" --set "data.train=data_byte/train_*.bin" \
  --set "data.val=data_byte/val_*.bin" --steps 4 --out run_llama >train.log 2>&1 ||
  { cat train.log; fail "train llama_tiny"; }

start_server llama run_llama --served-model-name tl --max-model-len 24
grep -q 'ready: model tl (llama, engine mock, vocab 256, context 24)' "$T/llama.log" ||
  fail "ready line: $(cat "$T/llama.log")"
js=$(models_json "$PORT")
"$PY" -c 'import json,sys; m=json.loads(sys.argv[1])["data"][0]; assert (m["id"],m["max_model_len"],m["architecture"])==("tl",24,"llama"), m' "$js" ||
  fail "/v1/models: $js"
out=$(complete "$PORT" tl ab 5)
[ "$out" = ntfdz ] || fail "llama greedy text: '$out'" # the mock rule: ab -> n, t, f, d, z
out=$(complete "$PORT" tl abcdefghijkl 20)
[ "$out" = "400 This model's maximum context length is 24 tokens. However, you requested 32 tokens (12 in the prompt, 20 for the completion). Please reduce the prompt or the completion length." ] ||
  fail "--max-model-len cap: '$out'"
out=$(complete "$PORT" other ab 1)
[[ "$out" == 404* ]] || fail "another model name accepted: '$out'"
stop_server "$PID" || fail "llama server exit status"

expect_err 2 "serve: --max-model-len 33 exceeds the model's context (32 tokens, model.context)" \
  "$ORCH_BIN" serve run_llama --engine=mock --port 0 --max-model-len 33
expect_err 2 "serve: give the model once (MODEL, -m/--model or --checkpoint)" \
  "$ORCH_BIN" serve run_llama -m run_llama --engine=mock --port 0
expect_err 2 "serve: more than one MODEL given ('a', 'b')" "$ORCH_BIN" serve a b
expect_err 2 "serve: MODEL is required (orch serve MODEL, -m/--model or --checkpoint DIR" "$ORCH_BIN" serve
expect_err 2 "serve: MODEL 'nothere': No such file or directory" \
  "$ORCH_BIN" serve nothere --engine=mock --port 0
expect_err 2 "serve: MODEL 'data_byte': a directory that is neither an orch checkpoint (state.json or latest) nor a Hugging Face model" \
  "$ORCH_BIN" serve data_byte --engine=mock --port 0
expect_err 2 "serve: MODEL 'corpus.txt': a file that is neither GGUF (no \"GGUF\" magic) nor Hugging Face weights (.safetensors)" \
  "$ORCH_BIN" serve corpus.txt --engine=mock --port 0
expect_err 2 "serve: MODEL 'run_llama': a tokenizer ('gpt2') applies to a Hugging Face model only (this is an orch checkpoint, which names its own)" \
  "$ORCH_BIN" serve run_llama --tokenizer gpt2 --engine=mock --port 0
expect_err 2 "serve: --tokenizer applies to a Hugging Face MODEL imported on the fly" \
  "$ORCH_BIN" serve --checkpoint run_llama --tokenizer gpt2 --engine=mock --port 0
printf 'GGUF\003\000\000\000' >bad.gguf
expect_err 2 "serve: importing the GGUF file 'bad.gguf': " "$ORCH_BIN" serve bad.gguf --engine=mock --port 0
[ -z "$(ls -A tmp)" ] || fail "a failed import left $(ls tmp)"

# 2. gpt2 with the GPT-2 vocabulary: exported as HF and GGUF, served back.
if ! echo x | "$ORCH_BIN" tokenize --tokenizer gpt2 >/dev/null 2>&1; then
  echo "skip: Hugging Face and GGUF models: GPT-2 vocabulary missing (run tools/setup.sh)"
  echo "serve_models: ok"
  exit 0
fi
"$ORCH_BIN" prepare --tokenizer gpt2 --input corpus.txt --out data_gpt2 --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; fail "prepare gpt2"; }
cat >g.json <<'JSON'
{"model": {"arch": "gpt2", "vocab_size": 50304, "context": 32, "layers": 2, "heads": 2, "width": 32},
 "train": {"micro_batch": 4, "seq_len": 16, "max_steps": 3, "lr": 1e-2, "eval_every": 0, "eval_batches": 1},
 "data": {"tokenizer": "gpt2", "train": "data_gpt2/train_*.bin", "val": "data_gpt2/val_*.bin"},
 "engine": {"name": "mock", "threads": 1}}
JSON
"$ORCH_BIN" train --config g.json --out run_gpt2 >train.log 2>&1 || { cat train.log; fail "train gpt2"; }
"$ORCH_BIN" export hf run_gpt2 --out hf_model >exp.log 2>&1 || { cat exp.log; fail "export hf"; }
"$ORCH_BIN" export gguf run_gpt2 --out model.gguf >exp.log 2>&1 || { cat exp.log; fail "export gguf"; }

start_server ck --checkpoint run_gpt2
want=$(complete "$PORT" run_gpt2 "In the beginning" 6)
stop_server "$PID" || fail "checkpoint server exit status"
if [ -z "$want" ] || [[ "$want" == [0-9]* ]]; then fail "checkpoint completion: '$want'"; fi

k=0
for how in "hf_model" "-m model.gguf" "--model hf_model/" "--tokenizer gpt2 hf_model"; do
  k=$((k + 1))
  # shellcheck disable=SC2086 # $how is a flag and its value
  start_server imp$k $how
  name=$(basename "${how##* }")
  kind="Hugging Face model"; [ "$name" = model.gguf ] && kind="GGUF file"
  grep -q "imported the $kind ${how##* } into $T/tmp/orch-model-" "$T/imp$k.log" ||
    fail "$how: no import line: $(cat "$T/imp$k.log")"
  js=$(models_json "$PORT")
  "$PY" -c 'import json,sys; m=json.loads(sys.argv[1])["data"][0]; assert (m["id"],m["max_model_len"],m["architecture"])==(sys.argv[2],32,"gpt2"), m' "$js" "$name" ||
    fail "$how: /v1/models: $js"
  out=$(complete "$PORT" "$name" "In the beginning" 6)
  [ "$out" = "$want" ] || fail "$how: text '$out', the checkpoint's '$want'"
  [ -n "$(ls -A tmp)" ] || fail "$how: no temporary checkpoint while serving"
  stop_server "$PID" || fail "$how: server exit status"
  [ -z "$(ls -A tmp)" ] || fail "$how: the temporary checkpoint is left: $(ls tmp)"
done
echo "serve_models: ok"
