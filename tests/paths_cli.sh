#!/usr/bin/env bash
# paths_cli.sh - a checkpoint works from any working directory: a tiny mock
# run trained with relative data globs (data/train_*.bin) stores them
# absolute in config.json and state.json, so `orch eval --checkpoint` and
# `orch generate --checkpoint` succeed from another directory and eval prints
# the same numbers; once the data is gone, eval's error says "no such file".
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$work/proj" "$work/elsewhere" || exit 1
cd "$work/proj" || exit 1
proj=$(pwd -P)

for i in $(seq 1 100); do echo "In the beginning was the word $i."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prep.log 2>&1 || { cat prep.log; fail "prepare"; }
cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 24, "layers": 1,
            "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 2, "lr": 1e-3,
            "eval_every": 0, "eval_batches": 2},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "./data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; fail "train"; }
[ -f run/latest ] || fail "no checkpoint"
ckpt=run/$(cat run/latest)

# 1. The stored config names the data by absolute paths (config.json and the
#    checkpoint's state.json), resolved through the data directory.
for f in run/config.json "$ckpt/state.json"; do
  grep -q "\"train\":[[:space:]]*\"$proj/data/train_\*\.bin\"" "$f" ||
    fail "$f: data.train is not absolute: $(grep '"train"' "$f")"
  grep -q "\"val\":[[:space:]]*\"$proj/data/val_\*\.bin\"" "$f" ||
    fail "$f: data.val is not absolute: $(grep '"val"' "$f")"
done

# 2. eval and generate from the run's directory and from another one agree.
"$ORCH_BIN" eval --checkpoint run >eval.here 2>eval.err || { cat eval.err; fail "eval here"; }
cd "$work/elsewhere" || exit 1
"$ORCH_BIN" eval --checkpoint "$work/proj/run" >eval.there 2>eval.err ||
  { cat eval.err; fail "eval from another directory"; }
[ -s eval.err ] && { cat eval.err; fail "eval from another directory warned"; }
grep -q '^val_loss: ' eval.there || fail "eval printed no val_loss: $(cat eval.there)"
diff <(grep -v '^checkpoint:' "$work/proj/eval.here") <(grep -v '^checkpoint:' eval.there) ||
  fail "eval differs between directories"
out=$("$ORCH_BIN" generate --checkpoint ../proj/run --prompt ab --max-tokens 4 \
  --temperature 0 2>gen.err) || { cat gen.err; fail "generate from another directory"; }
[ "$out" = "abntfd" ] || fail "generate from another directory: '$out'"
# A relative --checkpoint to the checkpoint directory itself works too.
"$ORCH_BIN" eval --checkpoint "../proj/$ckpt" >/dev/null 2>eval.err ||
  { cat eval.err; fail "eval of ../proj/$ckpt"; }

# 3. The data removed: eval says no such file (exit 2), naming the glob;
#    generate does not need the data and still works.
rm -rf "$work/proj/data"
"$ORCH_BIN" eval --checkpoint "$work/proj/run" >/dev/null 2>eval.err
rc=$?
[ "$rc" -eq 2 ] || fail "eval without data: exit $rc, want 2; $(cat eval.err)"
grep -q "no such file" eval.err || fail "eval without data: $(cat eval.err)"
grep -q "$proj/data/val_\*\.bin" eval.err || fail "eval without data names no glob: $(cat eval.err)"
[ "$(wc -l <eval.err)" -eq 1 ] || fail "eval without data: not one line: $(cat eval.err)"
"$ORCH_BIN" generate --checkpoint "$work/proj/run" --prompt ab --max-tokens 1 \
  --temperature 0 >/dev/null 2>gen.err || { cat gen.err; fail "generate without data"; }
echo "ok: checkpoint used from another directory; missing data says no such file"
