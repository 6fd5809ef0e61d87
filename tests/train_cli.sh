#!/usr/bin/env bash
# train_cli.sh - the `orch train` and `orch config` command lines: help,
# config check, one-line errors with exit 2 (bad config, missing data,
# unknown engine, bad flags) and exit 1 (engine failure mid-run, with the
# last checkpoint kept), early stopping, epochs, --metrics-port, the
# metrics.jsonl fields, tools/plot_loss, and the built-in default run
# (configs/default.json found next to the binary, KJV prepared on first use).
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BUILD=${ORCH_BUILD:-build}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$ORCH_BUILD}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect STATUS PATTERN cmd... : exit status and one stderr line matching.
expect() {
  local want=$1 pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne "$want" ]; then
    fail "'$*': exit $rc, want $want; stderr: $(head -c 300 "$tmp/err")"
    return
  fi
  if [ -n "$pat" ]; then
    grep -q -- "$pat" "$tmp/err" || fail "'$*': stderr lacks '$pat': $(head -c 300 "$tmp/err")"
    [ "$(grep -c 'orch: error' "$tmp/err")" -le 1 ] || fail "'$*': more than one error line"
  fi
}

tiny="$root/configs/tiny-test.json"

# --- help and config check --------------------------------------------------
"$ORCH_BIN" train --help >"$tmp/help" || fail "train --help"
grep -q "status 3" "$tmp/help" && grep -q "SIGUSR1" "$tmp/help" && grep -q "130" "$tmp/help" ||
  fail "train --help does not document the signal exit statuses"
"$ORCH_BIN" config --help >/dev/null || fail "config --help"
for f in default tiny-test gpt2-124m llama_tiny; do
  "$ORCH_BIN" config check "$root/configs/$f.json" >"$tmp/out" 2>&1 ||
    fail "config check configs/$f.json: $(cat "$tmp/out")"
  grep -q ": ok:" "$tmp/out" || fail "config check $f: $(cat "$tmp/out")"
done
expect 2 "train.lrr: unknown key (did you mean train.lr?)" \
  "$ORCH_BIN" config check "$tiny" --set train.lrr=1
expect 2 "model.heads: 3 does not divide model.width" \
  "$ORCH_BIN" config check "$tiny" --set model.heads=3
expect 2 "train.seq_len: 64 exceeds model.context" \
  "$ORCH_BIN" config check "$tiny" --set train.seq_len=64
expect 2 "nope.json: cannot open" "$ORCH_BIN" config check "$tmp/nope.json"
expect 2 "unknown subcommand" "$ORCH_BIN" config frobnicate "$tiny"
"$ORCH_BIN" config show "$tiny" --set train.lr=0.5 >"$tmp/show" || fail "config show"
grep -q '"lr":[[:space:]]*0.5' "$tmp/show" || fail "config show does not apply --set"
printf '{"model": {"width": 64,}}' >"$tmp/bad.json"
expect 2 "bad.json: line 1, column" "$ORCH_BIN" config check "$tmp/bad.json"

# --- data ---------------------------------------------------------------------
awk 'BEGIN { for (i = 0; i < 300; i++) printf "verse %d: in the beginning was the word.\n", i }' \
  >"$tmp/corpus.txt"
"$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/data" \
  --val-fraction 0.1 >/dev/null 2>&1 || { echo "FAIL: orch prepare"; exit 1; }
data=(--set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin")

# --- input errors: exit 2, one line, nothing written ---------------------------
expect 2 "unknown argument '--bogus'" "$ORCH_BIN" train --config "$tiny" --bogus
expect 2 "--steps 'x'" "$ORCH_BIN" train --config "$tiny" --steps x
expect 2 "train.lr: out of range" "$ORCH_BIN" train --config "$tiny" "${data[@]}" \
  --set train.lr=0 --out "$tmp/r0"
expect 2 "data.train:" "$ORCH_BIN" train --config "$tiny" \
  --set "data.train=$tmp/none/train_*.bin" --set "data.val=$tmp/data/val_*.bin" --out "$tmp/r1"
expect 2 "engine 'libengine_nosuch.so'" "$ORCH_BIN" train --config "$tiny" "${data[@]}" \
  --engine nosuch --out "$tmp/r2"
expect 2 "unknown option" "$ORCH_BIN" train --config "$tiny" "${data[@]}" \
  --set engine.options=colour=red --out "$tmp/r3"
expect 2 "--resume" "$ORCH_BIN" train --resume="$tmp/empty-run"
[ ! -e "$tmp/r0" ] || fail "a rejected config created its run directory"

# --- runtime failure: exit 1, the last checkpoint is kept ----------------------
expect 1 "step 5: engine mock: optimizer_step failed" "$ORCH_BIN" train --config "$tiny" \
  "${data[@]}" --set train.checkpoint_every=2 --set engine.options=fault=optimizer_step:5 \
  --out "$tmp/fault"
grep -q "last good checkpoint: .*ckpt-00000004" "$tmp/err" || fail "fault: no last-checkpoint hint: $(cat "$tmp/err")"
[ "$(cat "$tmp/fault/latest" 2>/dev/null)" = "ckpt-00000004" ] || fail "fault: latest is not ckpt-00000004"
"$ORCH_BIN" train --resume="$tmp/fault" --set engine.options= --steps 6 >/dev/null 2>&1 ||
  fail "fault: the kept checkpoint does not resume"

# --- a normal run: metrics.jsonl, config.json, summary, plot --------------------
"$ORCH_BIN" train --config "$tiny" "${data[@]}" --out "$tmp/ok" >"$tmp/ok.log" 2>&1 ||
  { cat "$tmp/ok.log"; fail "tiny mock run"; }
[ "$(wc -l <"$tmp/ok/metrics.jsonl")" -eq 40 ] || fail "metrics.jsonl does not have 40 lines"
head -n 1 "$tmp/ok/metrics.jsonl" |
  grep -Eq '^\{"step":1,"loss":[0-9.e+-]+,"lr":[0-9.e+-]+,"grad_norm":[0-9.e+-]+,"tokens_per_s":[0-9.]+,"elapsed":[0-9.]+\}$' ||
  fail "metrics.jsonl line 1: $(head -n 1 "$tmp/ok/metrics.jsonl")"
[ "$(grep -c '"val_loss"' "$tmp/ok/metrics.jsonl")" -eq 4 ] || fail "expected 4 evaluations (every 10 of 40)"
grep -q '"step":40,.*"val_ppl"' "$tmp/ok/metrics.jsonl" || fail "no evaluation at the last step"
grep -q "^done at step 40/40" "$tmp/ok.log" || fail "no summary: $(tail -n 3 "$tmp/ok.log")"
grep -q "val loss .* (perplexity" "$tmp/ok.log" || fail "summary lacks perplexity"
[ -f "$tmp/ok/config.json" ] || fail "no config.json in the run directory"
ls -d "$tmp/ok"/ckpt-* | wc -l | grep -qx 3 || fail "keep_checkpoints 3: $(ls "$tmp/ok")"
"$root/tools/plot_loss" "$tmp/ok/metrics.jsonl" -o "$tmp/loss.png" >/dev/null ||
  fail "plot_loss failed"
[ "$(head -c 8 "$tmp/loss.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] ||
  fail "plot_loss did not write a PNG"
expect 2 "no such file" "$root/tools/plot_loss" "$tmp/nothing.jsonl"

# --- --init: a new run from trained weights (fine-tuning) ----------------------
"$ORCH_BIN" train --init "$tmp/ok" --steps 3 --out "$tmp/ft" >"$tmp/ft.log" 2>&1 ||
  { cat "$tmp/ft.log"; fail "--init run"; }
grep -q "starting from the weights of .*ckpt-00000040" "$tmp/ft.log" || fail "--init: no start line"
a=$(sed -n '1s/.*"loss":\([^,]*\).*/\1/p' "$tmp/ok/metrics.jsonl")
b=$(sed -n '1s/.*"loss":\([^,]*\).*/\1/p' "$tmp/ft/metrics.jsonl")
awk -v a="$a" -v b="$b" 'BEGIN { exit !(b < a) }' || fail "--init: first loss $b is not below a fresh run's $a"
expect 2 "model section" "$ORCH_BIN" train --init "$tmp/ok" --config "$tiny" "${data[@]}" \
  --set model.layers=3 --out "$tmp/ft2"
expect 2 "cannot be combined" "$ORCH_BIN" train --init "$tmp/ok" --resume

# --- early stopping: lr so small that the validation loss never improves ------
"$ORCH_BIN" train --config "$tiny" "${data[@]}" --set train.lr=1e-30 --set train.min_lr=0 \
  --set train.weight_decay=0 --set train.eval_every=5 --set train.early_stop_patience=2 \
  --out "$tmp/early" >"$tmp/early.log" 2>&1 || { cat "$tmp/early.log"; fail "early stop run"; }
grep -q "^stopped early at step 15/40" "$tmp/early.log" ||
  fail "early stopping: $(grep -E 'early|stopped|done' "$tmp/early.log")"
[ "$(cat "$tmp/early/latest")" = "ckpt-00000015" ] || fail "early stopping: no checkpoint at step 15"

# --- epochs instead of max_steps ----------------------------------------------
# 1 epoch of the train split at 4 x 16 x 2 tokens per step.
"$ORCH_BIN" train --config "$tiny" "${data[@]}" --set train.max_steps=null \
  --set train.epochs=1 --out "$tmp/epochs" >"$tmp/ep.log" 2>&1 || { cat "$tmp/ep.log"; fail "epochs run"; }
ntrain=$(( ($(stat -c %s "$tmp"/data/train_000.bin) - 64) / 2 )) # 2-byte tokens
want=$(( (ntrain + 127) / 128 ))
[ "$(wc -l <"$tmp/epochs/metrics.jsonl")" -eq "$want" ] || fail "1 epoch: $(wc -l <"$tmp/epochs/metrics.jsonl") steps, want $want"

# --- --metrics-port: Prometheus text while training ---------------------------
"$ORCH_BIN" train --config "$tiny" "${data[@]}" --set engine.options=sleep_ms=20 \
  --metrics-port 0 --steps 100000 --set train.eval_every=0 --out "$tmp/prom" >"$tmp/prom.log" 2>&1 &
pid=$!
url=""
for i in $(seq 100); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*/metrics' "$tmp/prom.log" | head -n 1)
  [ -n "$url" ] && [ -f "$tmp/prom/metrics.jsonl" ] && [ "$(wc -l <"$tmp/prom/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
if [ -z "$url" ]; then
  fail "--metrics-port: no URL printed: $(cat "$tmp/prom.log")"
else
  curl -sf "$url" >"$tmp/prom.txt" || fail "--metrics-port: GET $url failed"
  for m in orch_train_step orch_train_loss orch_train_learning_rate orch_train_tokens_per_second \
           orch_train_grad_norm orch_train_tokens_total; do
    grep -q "^$m " "$tmp/prom.txt" || fail "--metrics-port: $m missing"
  done
  step=$(sed -n 's/^orch_train_step \([0-9]*\).*/\1/p' "$tmp/prom.txt")
  [ -n "$step" ] && [ "$step" -ge 3 ] || fail "--metrics-port: orch_train_step is '$step'"
  if command -v promtool >/dev/null; then
    promtool check metrics <"$tmp/prom.txt" >/dev/null 2>&1 || fail "promtool rejects the exposition"
  fi
fi
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=""
[ $rc -eq 3 ] || fail "--metrics-port run: SIGTERM exit $rc"

# --- llama (configs/llama_tiny.json) on the mock: train, checkpoint layout,
# resume, eval, generate; a tied head has no lm_head.weight ------------------
llama="$root/configs/llama_tiny.json"
"$ORCH_BIN" train --config "$llama" "${data[@]}" --steps 6 --set train.checkpoint_every=3 \
  --out "$tmp/llama" >"$tmp/llama.log" 2>&1 || { cat "$tmp/llama.log"; fail "llama run"; }
grep -q "^done at step 6/6" "$tmp/llama.log" || fail "llama run: $(tail -n 3 "$tmp/llama.log")"
st_meta() { # FILE: "layout names..." of a safetensors file
  python3 -c 'import json,struct,sys
f=open(sys.argv[1],"rb"); h=json.loads(f.read(struct.unpack("<Q",f.read(8))[0]))
m=h.pop("__metadata__"); print(m["format"], m["layout"], m["layout_version"], " ".join(sorted(h)))' "$1"
}
meta=$(st_meta "$tmp/llama/ckpt-00000006/model.safetensors")
[[ "$meta" == "orch orch-llama 1 lm_head.weight model.embed_tokens.weight model.layers.0."* ]] ||
  fail "llama checkpoint layout: ${meta:0:200}"
[[ "$(st_meta "$tmp/llama/ckpt-00000006/optimizer.safetensors")" == "orch orch-llama 1 m.lm_head.weight "* ]] ||
  fail "llama optimizer layout"
"$ORCH_BIN" train --resume="$tmp/llama" --steps 8 >"$tmp/llama2.log" 2>&1 ||
  { cat "$tmp/llama2.log"; fail "llama resume"; }
grep -q "^done at step 8/8" "$tmp/llama2.log" || fail "llama resume: $(tail -n 3 "$tmp/llama2.log")"
"$ORCH_BIN" eval --checkpoint "$tmp/llama" >"$tmp/llama.eval" 2>&1 || fail "llama eval: $(cat "$tmp/llama.eval")"
grep -q "^val_loss: [0-9.]*$" "$tmp/llama.eval" || fail "llama eval: $(cat "$tmp/llama.eval")"
out=$("$ORCH_BIN" generate --checkpoint "$tmp/llama" --prompt ab --max-tokens 10 --temperature 0 2>&1) ||
  fail "llama generate: $out"
[ "$out" = abntfdzrbvjl ] || fail "llama generate: '$out'" # the mock's next-token rule
"$ORCH_BIN" train --config "$llama" "${data[@]}" --steps 2 --set model.tie_embeddings=true \
  --out "$tmp/llama_tied" >"$tmp/llama3.log" 2>&1 || { cat "$tmp/llama3.log"; fail "tied llama run"; }
[[ "$(st_meta "$tmp/llama_tied/ckpt-00000002/model.safetensors")" == "orch orch-llama 1 model.embed_tokens.weight "* ]] ||
  fail "tied llama: lm_head.weight written"
expect 2 "model section" "$ORCH_BIN" train --init "$tmp/llama" --config "$tiny" "${data[@]}" \
  --out "$tmp/llama_ft"
expect 2 "model.rope_scaling.type: 'ntk' is not one of linear,llama3" "$ORCH_BIN" train \
  --config "$llama" "${data[@]}" --set 'model.rope_scaling={"type":"ntk","factor":2}' --out "$tmp/l4"
expect 2 "model.arch: 'mamba' is not one of gpt2,llama" "$ORCH_BIN" train --config "$llama" \
  "${data[@]}" --set model.arch=mamba --out "$tmp/l5"
[ ! -e "$tmp/l4" ] && [ ! -e "$tmp/l5" ] || fail "a refused llama config created its run directory"
# gpt2 weights under a config relabelled llama (checksums redone): refused by
# the file's layout, naming both.
cp -r "$tmp/ok/ckpt-00000040" "$tmp/relabel"
python3 -c 'import json,sys; p=sys.argv[1]; j=json.load(open(p)); j["config"]["model"]["arch"]="llama"; json.dump(j,open(p,"w"))' \
  "$tmp/relabel/state.json"
(cd "$tmp/relabel" && awk '{print $2}' checksums.sha256 | xargs sha256sum >sums.new && mv sums.new checksums.sha256)
expect 2 "relabel/model.safetensors: layout 'orch-gpt2' is not model.arch 'llama' of the checkpoint's config" \
  "$ORCH_BIN" generate --checkpoint "$tmp/relabel" --prompt a --max-tokens 1

# --- the built-in default: configs/default.json next to the binary -------------
if command -v bible >/dev/null; then
  mkdir -p "$tmp/inst/bin" "$tmp/inst/configs" "$tmp/cwd"
  cp "$ORCH_BIN" "$tmp/inst/bin/orch"
  # The real default, made tiny and mock for speed.
  "$ORCH_BIN" config show "$root/configs/default.json" --set engine.name=mock \
    --set train.max_steps=3 --set train.eval_batches=1 >"$tmp/inst/configs/default.json" ||
    fail "config show default"
  (cd "$tmp/cwd" && "$tmp/inst/bin/orch" train >"$tmp/default.log" 2>&1) ||
    { cat "$tmp/default.log"; fail "default run"; }
  grep -q "preparing the King James Bible" "$tmp/default.log" || fail "default run did not prepare KJV"
  ls "$tmp/inst/data/kjv-byte"/train_*.bin >/dev/null 2>&1 || fail "KJV shards not under <root>/data"
  [ "$(cat "$tmp/cwd/runs/default/latest" 2>/dev/null)" = "ckpt-00000003" ] ||
    fail "default run: no runs/default checkpoint"
  # A second run continues the same run directory (already complete).
  (cd "$tmp/cwd" && "$tmp/inst/bin/orch" train >"$tmp/default2.log" 2>&1) ||
    fail "second default run: $(cat "$tmp/default2.log")"
  grep -q "nothing to do" "$tmp/default2.log" || fail "second default run: $(cat "$tmp/default2.log")"
  grep -q "preparing" "$tmp/default2.log" && fail "second default run prepared the corpus again"
  # `orch` with no arguments only prints the usage: it trains nothing.
  (cd "$tmp/cwd" && "$tmp/inst/bin/orch" >"$tmp/default3.log" 2>&1) ||
    fail "orch without arguments: $(cat "$tmp/default3.log")"
  head -n 1 "$tmp/default3.log" | grep -q "^usage: orch COMMAND" ||
    fail "orch without arguments: $(head -n 3 "$tmp/default3.log")"
  grep -Eq "nothing to do|^step |^done at|preparing" "$tmp/default3.log" &&
    fail "orch without arguments trained: $(cat "$tmp/default3.log")"
else
  echo "skip: default run: 'bible' (bible-kjv) is not installed"
fi

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all train CLI checks passed"
