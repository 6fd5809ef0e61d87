#!/usr/bin/env bash
# llama_engine.sh - a llama model end to end on each engine of LLAMA_ENGINES
# (default: mock cpu cuda): config check; training whose loss falls;
# --resume reproducing an uninterrupted run's losses bit for bit (1 thread);
# eval; greedy generate equal to orch serve's greedy completion (KV-cached
# decoding through the scheduler), with /v1/models naming the architecture;
# kv_heads 1 and = heads, a tied head, linear and llama3 RoPE scaling; a
# checkpoint trained on the mock loading through the engine and back. An
# engine that is not built, cannot run here, or runs gpt2 only (its
# context_create refuses llama) is skipped with one line; the mock always
# runs.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$ROOT/tests/serve${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
top=$(mktemp -d)
SERVER=""
trap '[ -n "$SERVER" ] && kill -9 "$SERVER" 2>/dev/null; rm -rf "$top"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cfg="$ROOT/configs/llama_tiny.json"

# serve_up ARGS...: orch serve ARGS on $ENGINE (1 thread, any port) until
# ready; sets SERVER and port; the log is serve.log.
serve_up() {
  "$ORCH_BIN" serve "$@" --engine "$ENGINE" --threads 1 --port 0 2>serve.log &
  SERVER=$!
  port=""
  for _ in $(seq 1 1200); do
    port=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' serve.log | head -n1 | sed -E 's/.*:([0-9]+)$/\1/')
    [ -n "$port" ] && grep -q 'orch serve: ready' serve.log && return 0
    kill -0 "$SERVER" 2>/dev/null || fail "serve $* exited: $(cat serve.log)"
    sleep 0.05
  done
  fail "serve $*: not ready: $(cat serve.log)"
}
serve_down() {
  kill -TERM "$SERVER"
  wait "$SERVER" || fail "serve exit status"
  SERVER=""
}
# serve_check MAX_MODEL_LEN PROMPT N WANT: /v1/models says llama and
# MAX_MODEL_LEN; the greedy completion of PROMPT (N tokens) is WANT.
serve_check() {
  "$PY" - "$port" "$@" <<'PY' || fail "serve checks ($*)"
import json, sys, client
port, mml, prompt, n, want = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
st, _, body = client.request(port, "GET", "/v1/models")
m = json.loads(body)["data"][0]
assert st == 200 and m["architecture"] == "llama" and m["max_model_len"] == mml, m
st, js, _ = client.post(port, "/v1/completions",
                        {"prompt": prompt, "max_tokens": n, "temperature": 0})
assert st == 200, js
got = js["choices"][0]["text"]
assert got == want, "serve %r, generate %r" % (got, want)
PY
}

# serve_text PROMPT N: the greedy completion's text as the API returns it.
serve_text() {
  "$PY" -c 'import sys, client
st, js, _ = client.post(int(sys.argv[1]), "/v1/completions",
                        {"prompt": sys.argv[2], "max_tokens": int(sys.argv[3]), "temperature": 0})
sys.stdout.write(js["choices"][0]["text"] if st == 200 else "HTTP %d" % st)' "$port" "$@"
}

# check_engine ENGINE (in a subshell: fail exits it)
check_engine() {
ENGINE=$1
work="$top/$ENGINE"
mkdir "$work" && cd "$work" || exit 1
[ "$ENGINE" = mock ] || [ -f "$(dirname "$ORCH_BIN")/libengine_$ENGINE.so" ] ||
  { echo "skip: $ENGINE: libengine_$ENGINE.so is not built"; return 0; }
if ! "$ORCH_BIN" config check "$cfg" --engine "$ENGINE" >check.txt 2>&1; then
  if grep -q "is not supported by the $ENGINE engine\|does not load here" check.txt; then
    echo "skip: $ENGINE: $(cat check.txt)"
    return 0
  fi
  fail "$ENGINE: config check: $(cat check.txt)"
fi
for i in $(seq 1 300); do echo "verse $i: in the beginning was the word, and the word was with God."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; fail "prepare"; }
run=(--config "$cfg" --engine "$ENGINE" --set engine.threads=1 --set "data.train=data/train_*.bin"
  --set "data.val=data/val_*.bin" --set train.eval_every=0 --set train.checkpoint_every=10)
loss_at() { sed -n "${2}s/.*\"loss\":\([^,]*\).*/\1/p" "$1/metrics.jsonl"; }

# 1. Training: the loss falls; resume reproduces the uninterrupted losses.
"$ORCH_BIN" train "${run[@]}" --steps 20 --out a >a.log 2>&1 || { cat a.log; fail "train 20 steps"; }
first=$(loss_at a 1) last=$(loss_at a 20)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' || fail "loss did not fall: $first -> $last"
"$ORCH_BIN" train "${run[@]}" --steps 20 --stop-after 10 --out b >b.log 2>&1 ||
  { cat b.log; fail "train 10 of 20 steps"; }
"$ORCH_BIN" train --resume=b >b2.log 2>&1 || { cat b2.log; fail "resume"; }
for s in 1 11 15 20; do
  [ "$(loss_at a $s)" = "$(loss_at b $s)" ] || fail "resume: step $s loss $(loss_at b $s), uninterrupted $(loss_at a $s)"
done

# 2. eval, and greedy generate = serve's greedy completion.
"$ORCH_BIN" eval --checkpoint a >eval.txt 2>&1 || fail "eval: $(cat eval.txt)"
grep -q '^val_loss: [0-9.]*$' eval.txt || fail "eval: $(cat eval.txt)"
gen=$("$ORCH_BIN" generate --checkpoint a --engine "$ENGINE" --threads 1 --prompt "verse 7: in" \
  --max-tokens 12 --temperature 0 --no-echo 2>gen.err) || fail "generate: $(cat gen.err)"
serve_up a --max-model-len 30
grep -q "ready: model a (llama, engine $ENGINE, vocab 256, context 30)" serve.log || fail "serve: $(cat serve.log)"
serve_check 30 "verse 7: in" 12 "$gen"
serve_down

# 3. Shapes: GQA extremes, tied head, RoPE scaling.
for set in "model.kv_heads=1" "model.kv_heads=4" "model.tie_embeddings=true" \
  'model.rope_scaling={"type":"linear","factor":2}' \
  'model.rope_scaling={"type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_context":16}'; do
  "$ORCH_BIN" train "${run[@]}" --steps 3 --set "$set" --out s >s.log 2>&1 || { cat s.log; fail "train --set $set"; }
  "$ORCH_BIN" generate --checkpoint s --prompt ab --max-tokens 4 --temperature 0 >/dev/null 2>s.err ||
    fail "generate --set $set: $(cat s.err)"
  rm -rf s
done

# 4. Portability: trained on the mock, loaded here (and back).
if [ "$ENGINE" != mock ]; then
  "$ORCH_BIN" train "${run[@]}" --engine mock --steps 3 --out m >m.log 2>&1 || { cat m.log; fail "mock train"; }
  "$ORCH_BIN" eval --checkpoint m --engine "$ENGINE" >/dev/null 2>m.err || fail "mock checkpoint on $ENGINE: $(cat m.err)"
  "$ORCH_BIN" eval --checkpoint a --engine mock >/dev/null 2>m.err || fail "$ENGINE checkpoint on mock: $(cat m.err)"
fi
# 5. The same model served as a Hugging Face directory and as a GGUF file
# (orch export hf / gguf; orch serve imports them on the fly): the
# checkpoint's greedy text. Needs the GPT-2 vocabulary (GGUF carries a real
# tokenizer) and a llama export (skipped with one line before it exists).
if ! echo x | "$ORCH_BIN" tokenize --tokenizer gpt2 >/dev/null 2>&1; then
  echo "skip: $ENGINE: llama as HF / GGUF: GPT-2 vocabulary missing (run tools/setup.sh)"
else
  "$ORCH_BIN" prepare --tokenizer gpt2 --input corpus.txt --out data_g --val-fraction 0.1 \
    >prep.log 2>&1 || { cat prep.log; fail "prepare gpt2"; }
  "$ORCH_BIN" train "${run[@]}" --steps 5 --set model.vocab_size=50304 --set data.tokenizer=gpt2 \
    --set "data.train=data_g/train_*.bin" --set "data.val=data_g/val_*.bin" --out g >g.log 2>&1 ||
    { cat g.log; fail "train llama with the gpt2 tokenizer"; }
  if ! "$ORCH_BIN" export hf g --out hf_g >exp.log 2>&1; then
    grep -q "has no Hugging Face export yet" exp.log || fail "export hf: $(cat exp.log)"
    echo "skip: $ENGINE: llama as HF / GGUF: $(cat exp.log)"
  else
    "$ORCH_BIN" export gguf g --out g.gguf >exp.log 2>&1 || fail "export gguf: $(cat exp.log)"
    # The checkpoint's served text (the mock's letters are not UTF-8 in the
    # GPT-2 vocabulary, so served text is compared with served text).
    serve_up g
    want=$(serve_text "verse 7: in" 8)
    serve_down
    # orch's HF export of the GPT-2 tokenizer is vocab.json + merges.txt (no
    # tokenizer.json): the import is told which tokenizer it is.
    for how in "hf_g --tokenizer gpt2" "g.gguf"; do
      # shellcheck disable=SC2086 # MODEL and its flags
      serve_up $how
      grep -q "imported the .* into " serve.log || fail "$how: no import line: $(cat serve.log)"
      serve_check 32 "verse 7: in" 8 "$want"
      serve_down
    done
  fi
fi
echo "ok: llama on $ENGINE"
}

for e in ${LLAMA_ENGINES:-mock cpu cuda}; do
  (check_engine "$e") || exit 1
done
echo "llama_engine: ok"
