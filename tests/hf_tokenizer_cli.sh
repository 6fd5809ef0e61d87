#!/usr/bin/env bash
# hf_tokenizer_cli.sh - the "hf" tokenizer kind from the command line and in
# a checkpoint: `orch tokenize/detokenize --tokenizer-dir DIR` and
# `--tokenizer hf:DIR` on the committed tiny ByteLevel tokenizer (exact ids,
# exact bytes back, special tokens in text), a one-line error for an
# unsupported file, `orch prepare --tokenizer hf:DIR`, and `orch generate` on a mock-engine checkpoint whose
# state.json says "tokenizer": "hf" with tokenizer.json in the checkpoint
# directory (the mock's greedy rule over the hf ids gives the exact text).
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BIN=$(cd "$(dirname "$ORCH_BIN")" && pwd)/$(basename "$ORCH_BIN")
FIX=$(cd "$(dirname "$0")" && pwd)/fixtures/hf-tokenizer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$work" || exit 1

# 1. tokenize / detokenize with a tokenizer directory (both spellings).
got=$(printf '<|im_start|>user\nhi<|im_end|> the in' | "$ORCH_BIN" tokenize --tokenizer-dir "$FIX/tiny-bytelevel") ||
  fail "tokenize --tokenizer-dir"
[ "$got" = "262 117 115 101 114 10 104 105 263 258 260" ] || fail "tokenize: got '$got'"
got2=$(printf '<|im_start|>user\nhi<|im_end|> the in' | "$ORCH_BIN" tokenize --tokenizer "hf:$FIX/tiny-bytelevel") ||
  fail "tokenize --tokenizer hf:DIR"
[ "$got2" = "$got" ] || fail "hf:DIR differs: '$got2'"
back=$(echo "$got" | "$ORCH_BIN" detokenize --tokenizer-dir "$FIX/tiny-bytelevel") || fail "detokenize"
[ "$back" = "$(printf '<|im_start|>user\nhi<|im_end|> the in')" ] || fail "detokenize: got '$back'"
"$ORCH_BIN" tokenize --help 2>&1 | grep -q -- "--tokenizer-dir" || fail "--help lacks --tokenizer-dir"
echo 265 | "$ORCH_BIN" detokenize --tokenizer-dir "$FIX/tiny-bytelevel" 2>err.txt && fail "id 265 accepted"
grep -q "265" err.txt || fail "bad id error: $(cat err.txt)"
: | "$ORCH_BIN" tokenize --tokenizer-dir "$FIX/bad-wordpiece" 2>err.txt && fail "WordPiece accepted"
[ "$(wc -l <err.txt)" -eq 1 ] && grep -q "model.type 'WordPiece' is not supported" err.txt ||
  fail "WordPiece error: $(cat err.txt)"

# prepare writes hf shards (the vocabulary size of the file).
printf 'the in <|im_end|>\n%.0s' $(seq 1 50) >small.txt
"$ORCH_BIN" prepare --tokenizer "hf:$FIX/tiny-bytelevel" --input small.txt --out hfdata >prep.log 2>&1 ||
  { cat prep.log; fail "prepare --tokenizer hf:DIR"; }
grep -q "tokenizer hf (vocab 265)" prep.log || fail "prepare: $(cat prep.log)"
[ -f hfdata/train_000.bin ] || fail "prepare wrote no shard"

# 2. A checkpoint with "tokenizer": "hf" opens DIR/tokenizer.json.
for i in $(seq 1 40); do echo "the in the in $i"; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; fail "prepare"; }
cat >cfg.json <<'JSON'
{
  "model": {"arch": "gpt2", "vocab_size": 272, "context": 24, "layers": 1, "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 1, "lr": 1e-3, "eval_every": 0,
            "eval_batches": 1, "checkpoint_every": 1, "keep_checkpoints": 2},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
JSON
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; fail "train"; }
ck=$(find run -mindepth 1 -maxdepth 1 -type d -name 'ckpt-*' | sort | tail -n 1)
[ -n "$ck" ] && [ -f "$ck/state.json" ] || fail "no checkpoint directory in run/: $(ls run)"
/usr/bin/python3 - "$ck/state.json" <<'PY' || fail "cannot edit state.json"
import json, sys
p = sys.argv[1]
s = json.load(open(p))
s["tokenizer"] = "hf"
json.dump(s, open(p, "w"))
PY
sum=$(cd "$ck" && sha256sum state.json)
sed -i "s|^[0-9a-f]\{64\}  state.json\$|$sum|" "$ck/checksums.sha256" 2>/dev/null ||
  fail "no checksums file"
g() { "$ORCH_BIN" generate --checkpoint run --engine mock --temperature 0 "$@"; }
g --prompt the --max-tokens 3 >out.txt 2>err.txt && fail "hf checkpoint without tokenizer.json opened"
grep -q "cannot read .*/tokenizer.json" err.txt || fail "missing tokenizer.json error: $(cat err.txt)"
cp "$FIX/tiny-bytelevel/"*.json "$ck/"
out=$(g --prompt the --max-tokens 3 2>err.txt) || { cat err.txt; fail "generate on an hf checkpoint"; }
# "the" is [116, 256] in the hf vocabulary; the mock's greedy next id is
# 97 + (sum of all ids) mod 26, a single-byte token each time.
s=$((116 + 256)) want=the
for _ in 1 2 3; do c=$((97 + s % 26)); s=$((s + c)); want+=$(printf "\\$(printf %03o "$c")"); done
[ "$out" = "$want" ] || fail "generate: got '$out', want '$want'"
echo "ok"
