#!/usr/bin/env bash
# hardening_files.sh - what orch reads from disk cannot hang it, fool it or
# make it destroy a checkpoint (issue 12, defects 7, 8 and 9):
#   - FIFOs (and directories) where a file is expected - `latest`, a shard,
#     state.json, checksums.sha256, model.safetensors, meta.json, a --config
#     file, a GPT-2 vocabulary file, a --prepare input - are refused (or, for
#     `latest`, skipped with a warning) at once: every command runs under a
#     5 s timeout and a hang fails the test;
#   - bad numbers in state.json (step 1e300, -1, 1.5, "NaN", 2^64, 1e999, a
#     best_val_step after step, ...) make `train --resume` exit 2 naming the
#     field and the file, and every checkpoint, `latest` and metrics.jsonl
#     are unchanged afterwards (before the fix: resume restarted at step 0 and
#     retention deleted the real checkpoints);
#   - a failing `train` or `prepare` leaves no empty --out directory (nor the
#     parents it created), and an existing --out is kept;
#   - state.json that is not JSON says "DIR/state.json: not valid JSON (...)",
#     one that is JSON but not an object says so.
# Needs ORCH_BIN and ORCH_BUILD (set by tests/run_tests.sh).
set -u
: "${ORCH_BIN:?ORCH_BIN must name the orch binary}"
: "${ORCH_BUILD:?ORCH_BUILD must name the build directory}"
export ORCH_ENGINE_PATH="${ORCH_ENGINE_PATH:-$ORCH_BUILD}"
unset ORCH_MOCK_FAULT ORCH_MOCK_SLEEP_MS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failures=$((failures + 1)); }
cd "$work" || exit 1

for i in $(seq 1 80); do echo "And the evening and the morning were day $i."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prep.log 2>&1 || { cat prep.log; echo "FAIL: prepare"; exit 1; }
cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 24, "layers": 1,
            "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 3, "lr": 1e-3,
            "eval_every": 0, "eval_batches": 2, "checkpoint_every": 1,
            "keep_checkpoints": 2},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; echo "FAIL: train"; exit 1; }
[ "$(cat run/latest)" = ckpt-00000003 ] || { echo "FAIL: latest is $(cat run/latest)"; exit 1; }

# run_to DESC WANT_RC WANT_TEXT CMD...: the command ends within 5 s with
# WANT_RC and WANT_TEXT (fixed string) on stderr.
run_to() {
  local desc=$1 want_rc=$2 want=$3
  shift 3
  timeout -k 1 5 "$@" >out.txt 2>err.txt
  local rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "$desc: hung (killed after 5 s)"
  elif [ "$rc" -ne "$want_rc" ]; then
    fail "$desc: exit $rc, expected $want_rc"
    sed 's/^/      /' err.txt
  elif ! grep -qF -- "$want" err.txt; then
    fail "$desc: stderr lacks '$want'"
    sed 's/^/      /' err.txt
  else
    pass "$desc -> $(head -n 1 err.txt)"
  fi
}

# copy_run NAME: a copy of run to damage.
copy_run() { rm -rf "$1" && cp -r run "$1"; }
# fifo_at PATH: replace PATH with a FIFO.
fifo_at() { rm -rf "$1" && mkfifo "$1"; }
# reseal CKPT_DIR: rewrite checksums.sha256 over the files it lists.
reseal() {
  (cd "$1" && awk '{print $2}' checksums.sha256 | xargs sha256sum >sums.tmp &&
    mv sums.tmp checksums.sha256)
}

# ---- defect 7: FIFOs and directories where files belong ------------------------------
gen=("$ORCH_BIN" generate --prompt ab --max-tokens 2 --temperature 0 --checkpoint)

copy_run r_latest
fifo_at r_latest/latest
run_to "FIFO latest: generate falls back" 0 "'latest' is not a regular file; using ckpt-00000003" \
  "${gen[@]}" r_latest
run_to "FIFO latest: train --resume falls back" 0 "'latest' is not a regular file" \
  "$ORCH_BIN" train --resume=r_latest --steps 4
rm -rf r_latest/latest && mkdir r_latest/latest
run_to "directory latest: generate falls back" 0 "using ckpt-00000004" "${gen[@]}" r_latest

for f in state.json checksums.sha256 model.safetensors meta.json; do
  copy_run r_fifo
  fifo_at "r_fifo/ckpt-00000003/$f"
  case $f in
  checksums.sha256) why="checksums.sha256 is not a regular file" ;;
  *) why="not a regular file: $f" ;;
  esac
  run_to "FIFO $f: generate CKPT refuses" 2 "$why" "${gen[@]}" r_fifo/ckpt-00000003
  run_to "FIFO $f: eval RUN falls back" 0 "(skipped corrupt: ckpt-00000003)" \
    "$ORCH_BIN" eval --checkpoint r_fifo
  run_to "FIFO $f: train --resume=CKPT refuses" 2 "$why" \
    "$ORCH_BIN" train --resume=r_fifo/ckpt-00000003 --steps 5
done

# A FIFO given to import-gpt2 as the Hugging Face safetensors file.
mkfifo hf_fifo.safetensors
run_to "FIFO safetensors: import-gpt2 refuses" 2 "hf_fifo.safetensors: not a regular file" \
  "$ORCH_BIN" import-gpt2 hf_fifo.safetensors --out r_import
[ -e r_import ] && fail "import-gpt2 on a FIFO left r_import behind"

mkdir -p d_fifo d_dir
cp data/val_000.bin d_fifo/ && cp data/val_000.bin d_dir/
mkfifo d_fifo/train_000.bin
mkdir d_dir/train_000.bin
run_to "FIFO shard: train refuses" 2 "d_fifo/train_000.bin is not a regular file" \
  "$ORCH_BIN" train --config cfg.json --set 'data.train=d_fifo/train_*.bin' --out r_shard
run_to "directory shard: train refuses" 2 "d_dir/train_000.bin is not a regular file" \
  "$ORCH_BIN" train --config cfg.json --set 'data.train=d_dir/train_*.bin' --out r_shard
run_to "FIFO shard: eval --val refuses" 2 "d_fifo/train_000.bin is not a regular file" \
  "$ORCH_BIN" eval --checkpoint run --val 'd_fifo/train_*.bin'
mkfifo cfg_fifo.json
run_to "FIFO --config: train refuses" 2 "cfg_fifo.json: cannot open: not a regular file" \
  "$ORCH_BIN" train --config cfg_fifo.json --out r_cfg
run_to "FIFO --config: config check refuses" 2 "not a regular file" \
  "$ORCH_BIN" config check cfg_fifo.json
mkfifo input_fifo.txt
run_to "FIFO --input: prepare refuses" 2 "--input input_fifo.txt is not a regular file" \
  "$ORCH_BIN" prepare --tokenizer byte --input input_fifo.txt --out p_fifo
mkdir -p vocab
mkfifo vocab/encoder.json vocab/vocab.bpe
run_to "FIFO vocabulary: prepare gpt2 refuses" 2 "not found in vocab" \
  "$ORCH_BIN" prepare --tokenizer gpt2 --vocab-dir vocab --input corpus.txt --out p_vocab
for d in r_shard r_cfg p_fifo p_vocab; do [ -e "$d" ] && fail "refused, yet $d was created"; done

# A FIFO shard with SIGTERM on the way: orch neither waits for a writer nor
# ignores the signal (before the fix the open blocked and SIGTERM was caught
# and deferred by the training loop's handler).
timeout -s TERM -k 2 3 "$ORCH_BIN" train --config cfg.json --set 'data.train=d_fifo/train_*.bin' \
  --out r_term >/dev/null 2>&1
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then fail "FIFO shard + SIGTERM: still running after 3 s"; else pass "FIFO shard + SIGTERM: exit $rc"; fi

# ---- defect 8: bad numbers in state.json -------------------------------------------------
snapshot() { # a fingerprint of the whole run directory
  (cd r_num && find . -type f | sort | xargs sha256sum)
}
# Each case: PATH|VALUE, set as the first "LEAF": of ckpt-3's state.json.
for case in 'step|1e300' 'step|-1' 'step|1.5' 'step|"NaN"' 'step|18446744073709551616' \
  'step|1e999' 'step|null' 'total_steps|1e300' 'data.tokens_seen|-5' 'best_val_step|7' \
  'evals_since_best|4294967296' 'metrics.elapsed_s|-1' 'schedule.warmup_steps|0.5'; do
  path=${case%%|*} value=${case#*|} field=${case%%|*}
  field=${field##*.}
  copy_run r_num
  sed -i "0,/\"$field\":[[:space:]]*[^,}]*/s//\"$field\":\t$value/" r_num/ckpt-00000003/state.json
  grep -qF "\"$field\":	$value" r_num/ckpt-00000003/state.json || { fail "could not set $field"; continue; }
  reseal r_num/ckpt-00000003
  before=$(snapshot)
  run_to "state.json $path=$value: resume refuses" 2 "state.json: $path: " \
    "$ORCH_BIN" train --resume=r_num --steps 6 --set train.keep_checkpoints=1
  grep -qF "r_num/ckpt-00000003" err.txt || fail "$field=$value: message does not name the checkpoint"
  [ "$(snapshot)" = "$before" ] || fail "$field=$value: the run directory changed"
  [ -d r_num/ckpt-00000002 ] && [ -d r_num/ckpt-00000003 ] || fail "$field=$value: a checkpoint was deleted"
done
# meta.json's step is checked the same way (generate/eval print it).
copy_run r_meta
sed -i 's/"step":[[:space:]]*3/"step": 1e300/' r_meta/ckpt-00000003/meta.json
reseal r_meta/ckpt-00000003
run_to "meta.json step=1e300: eval refuses" 2 "meta.json: step: 1e+300 is out of range" \
  "$ORCH_BIN" eval --checkpoint r_meta/ckpt-00000003

# ---- defect 9: no empty --out after a failure; state.json messages -----------------------
run_to "train with missing shards" 2 "no such file or directory" \
  "$ORCH_BIN" train --config cfg.json --set 'data.train=nowhere/train_*.bin' --out new/deep/run
[ -e new ] && fail "a failed train left $(find new | tr '\n' ' ')" || pass "failed train left no --out directory"
run_to "train --init from a non-checkpoint" 2 "no such checkpoint" \
  "$ORCH_BIN" train --init nowhere --out init_out
[ -e init_out ] && fail "a failed train --init left init_out"
run_to "train with an unknown engine" 2 "not found" \
  "$ORCH_BIN" train --config cfg.json --engine no_such_engine --out eng_out
[ -e eng_out ] && fail "a failed train left eng_out" || pass "failed engine load left no --out"
mkdir keep_out && touch keep_out/mine
run_to "train into an existing --out fails" 2 "not found" \
  "$ORCH_BIN" train --config cfg.json --engine no_such_engine --out keep_out
[ -f keep_out/mine ] || fail "an existing --out lost its contents"
mkdir -p nobible
run_to "prepare --kjv without the bible program" 1 "bible" \
  env PATH="$work/nobible" "$ORCH_BIN" prepare --tokenizer byte --kjv --out kjv/out
[ -e kjv ] && fail "a failed prepare --kjv left $(find kjv | tr '\n' ' ')" || pass "failed prepare --kjv left no --out"
printf 'a single line' >one.txt
run_to "prepare of a one-line corpus" 1 "single line" \
  "$ORCH_BIN" prepare --tokenizer byte --input one.txt --out one_out
[ -e one_out ] && fail "a failed prepare left one_out"

copy_run r_json
printf '{"format": 1, "step": ' >r_json/ckpt-00000003/state.json
reseal r_json/ckpt-00000003
run_to "truncated state.json: generate" 2 \
  "r_json/ckpt-00000003/state.json: not valid JSON (unexpected end at line 1, column" \
  "${gen[@]}" r_json/ckpt-00000003
run_to "truncated state.json: train --resume" 2 \
  "r_json/ckpt-00000003/state.json: not valid JSON (" \
  "$ORCH_BIN" train --resume=r_json/ckpt-00000003 --steps 5
printf '[1, 2, 3]\n' >r_json/ckpt-00000003/state.json
reseal r_json/ckpt-00000003
run_to "state.json holding an array" 2 \
  "r_json/ckpt-00000003/state.json: not a JSON object (it holds an array)" \
  "${gen[@]}" r_json/ckpt-00000003
grep -q 'no "config" object' err.txt && fail "an array still reads as 'no config object'"

if [ "$failures" -gt 0 ]; then
  echo "hardening_files: $failures failed"
  exit 1
fi
echo "hardening_files: all passed"
