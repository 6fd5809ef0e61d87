#!/usr/bin/env bash
# generate_cli.sh - `orch generate` and `orch eval` end to end on the mock
# engine: exact greedy text (the mock's next-token rule, engines/mock/README.md),
# seeded sampling is reproducible, top-k 1 is greedy, the context limit stops
# generation (--no-context-shift) or shifts the window, a corrupt newest checkpoint falls back with a warning, usage
# errors exit 2; eval prints the run's own validation loss.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$work" || exit 1

for i in $(seq 1 100); do echo "And God said, Let there be light: and there was light $i."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prep.log 2>&1 || { cat prep.log; fail "prepare"; }
cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 24, "layers": 1,
            "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 3, "lr": 1e-3,
            "eval_every": 0, "eval_batches": 3, "checkpoint_every": 1,
            "keep_checkpoints": 5},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; fail "train"; }
[ -f run/latest ] || fail "no checkpoint"

# The mock's greedy continuation: next = 'a' + (sum of all ids so far) mod 26.
expect_greedy() { # prompt n
  local p=$1 n=$2 s=0 out=$1 i c
  for ((i = 0; i < ${#p}; i++)); do printf -v c '%d' "'${p:i:1}"; s=$((s + c)); done
  for ((i = 0; i < n; i++)); do
    c=$((97 + s % 26)); s=$((s + c))
    out+=$(printf "\\$(printf %03o "$c")")
  done
  printf '%s\n' "$out"
}

g() { "$ORCH_BIN" generate --checkpoint run --engine mock "$@"; }

# 1. Greedy text is exact (README example: "ab" -> "ab" "n" "t" ...).
out=$(g --prompt ab --max-tokens 10 --temperature 0 2>err.txt) || { cat err.txt; fail "greedy generate"; }
want=$(expect_greedy ab 10)
[ "$out" = "$want" ] || fail "greedy: got '$out', want '$want'"
[ "${out:0:4}" = "abnt" ] || fail "greedy does not start with the README example: '$out'"
[ -s err.txt ] && { cat err.txt; fail "greedy generate wrote to stderr"; }

# 2. --no-echo prints only the continuation; --max-tokens 0 only the prompt.
out=$(g --prompt ab --max-tokens 10 --temperature 0 --no-echo) || fail "no-echo"
[ "$out" = "${want:2}" ] || fail "no-echo: got '$out'"
out=$(g --prompt "héllo" --max-tokens 0) || fail "max-tokens 0"
[ "$out" = "héllo" ] || fail "max-tokens 0: got '$out'"
# Output ends with exactly one newline.
n=$(g --prompt ab --max-tokens 3 --temperature 0 | od -An -c | tr -s ' ' | tr -d '\n')
[ "$n" = " a b n t f \\n" ] || fail "byte stream: '$n'"

# 3. Seeded sampling is reproducible; top-k 1 is greedy at any temperature.
a=$(g --prompt "In the" --max-tokens 20 --temperature 1.5 --seed 7) || fail "sample"
b=$(g --prompt "In the" --max-tokens 20 --temperature 1.5 --seed 7) || fail "sample"
[ "$a" = "$b" ] || fail "same seed, different text: '$a' vs '$b'"
c=$(g --prompt "In the" --max-tokens 20 --temperature 1.5 --seed 8) || fail "sample"
[ "$a" != "$c" ] || fail "different seeds gave the same 20 sampled tokens"
out=$(g --prompt ab --max-tokens 10 --temperature 2 --top-k 1 --seed 3) || fail "top-k 1"
[ "$out" = "$want" ] || fail "top-k 1: got '$out'"
out=$(g --prompt ab --max-tokens 10 --temperature 0.7 --top-p 0.01 --seed 3) || fail "top-p"
[ "$out" = "$want" ] || fail "tiny top-p: got '$out'"

# 4. --no-context-shift: the context (24) stops generation with a warning
# after the token drawn from the last position; the text is still right.
out=$(g --prompt abcdefghij --max-tokens 100 --temperature 0 --no-context-shift 2>err.txt) || fail "context stop"
want=$(expect_greedy abcdefghij 15)
[ "$out" = "$want" ] || fail "context stop: got '$out', want '$want'"
grep -q "context of 24" err.txt || fail "no context warning: $(cat err.txt)"
# Default: a context shift keeps the newest 12 tokens and goes on. The mock's
# next token then sums only what is in the cache (the kept window).
expect_shift() { # prompt n context
  local p=$1 n=$2 ctx=$3 out=$1 i c keep=$(($3 / 2)) hist=()
  for ((i = 0; i < ${#p}; i++)); do printf -v c '%d' "'${p:i:1}"; hist+=("$c"); done
  for ((i = 0; i < n; i++)); do
    local s=0 v
    for v in "${hist[@]}"; do s=$((s + v)); done
    c=$((97 + s % 26))
    out+=$(printf "\\$(printf %03o "$c")")
    if [ "${#hist[@]}" -ge "$ctx" ]; then hist=("${hist[@]:${#hist[@]}-keep+1}" "$c"); else hist+=("$c"); fi
  done
  printf '%s\n' "$out"
}
out=$(g --prompt abcdefghij --max-tokens 40 --temperature 0 2>err.txt) || fail "context shift"
want=$(expect_shift abcdefghij 40 24)
[ "${#out}" -eq 50 ] || fail "context shift: expected 50 chars, got ${#out}: '$out'"
[ "$out" = "$want" ] || fail "context shift: got '$out', want '$want'"
[ -s err.txt ] && fail "context shift warned: $(cat err.txt)"
long=$(printf 'x%.0s' $(seq 1 30))
g --prompt "$long" >/dev/null 2>err.txt; rc=$?
[ $rc -eq 2 ] && grep -q "prompt is 30 tokens but the model's context is 24" err.txt ||
  fail "long prompt: rc $rc $(cat err.txt)"

# 5. Prompt from a file / stdin.
printf 'ab' >p.txt
out=$(g --prompt-file p.txt --max-tokens 10 --temperature 0) || fail "prompt-file"
[ "$out" = "$(expect_greedy ab 10)" ] || fail "prompt-file: '$out'"
out=$(printf 'ab' | g --prompt-file - --max-tokens 10 --temperature 0) || fail "prompt stdin"
[ "$out" = "$(expect_greedy ab 10)" ] || fail "prompt stdin: '$out'"

# 6. A corrupt newest checkpoint: warning, previous one used, same text.
newest=$(cat run/latest)
printf 'XXXX' | dd of="run/$newest/model.safetensors" bs=1 seek=100 conv=notrunc 2>/dev/null
out=$(g --prompt ab --max-tokens 10 --temperature 0 2>err.txt) || { cat err.txt; fail "fallback"; }
[ "$out" = "$(expect_greedy ab 10)" ] || fail "fallback text '$out'"
grep -q "warning: .*checksum mismatch for model.safetensors.*using ckpt-00000002" err.txt ||
  fail "fallback warning: $(cat err.txt)"
# Naming the corrupt checkpoint itself is an error.
g --checkpoint "run/$newest" --prompt ab >/dev/null 2>err.txt; rc=$?
[ $rc -eq 2 ] && grep -q "checksum mismatch" err.txt || fail "corrupt dir: rc $rc"
# A checkpoint directory can be named directly.
out=$(g --checkpoint run/ckpt-00000002 --prompt ab --max-tokens 10 --temperature 0) || fail "ckpt dir"
[ "$out" = "$(expect_greedy ab 10)" ] || fail "ckpt dir text"

# 7. Usage errors exit 2 with one line; --help exits 0.
"$ORCH_BIN" generate --help | grep -q "usage: orch generate" || fail "--help"
for bad in "--prompt x" "--checkpoint run --top-p 0" "--checkpoint run --temperature -1" \
           "--checkpoint run --max-tokens -3" "--checkpoint run --bogus" \
           "--checkpoint $work/none --prompt x" "--checkpoint run --engine nosuch --prompt x"; do
  # shellcheck disable=SC2086
  "$ORCH_BIN" generate $bad >/dev/null 2>err.txt; rc=$?
  [ $rc -eq 2 ] || fail "'generate $bad' exited $rc"
  [ "$(wc -l <err.txt)" -eq 1 ] && grep -q "^orch: error: " err.txt || fail "'generate $bad': $(cat err.txt)"
done

# 8. eval: the same validation loss the run logged at its last step.
rm -rf "run/$newest" && printf 'ckpt-00000002\n' >run/latest
out=$("$ORCH_BIN" eval --checkpoint run/ckpt-00000003 2>err.txt); rc=$?
[ $rc -eq 2 ] || fail "eval of a removed checkpoint: rc $rc"
"$ORCH_BIN" train --config cfg.json --out run --resume >train2.log 2>&1 || { cat train2.log; fail "re-train"; }
out=$("$ORCH_BIN" eval --checkpoint run 2>err.txt) || { cat err.txt; fail "eval"; }
echo "$out"
grep -q '^checkpoint: run/ckpt-00000003$' <<<"$out" || fail "eval checkpoint line"
grep -q '^tokens: 96 (3 batches x 2 x 16)$' <<<"$out" || fail "eval tokens line"
vl=$(sed -n 's/^val_loss: //p' <<<"$out")
ppl=$(sed -n 's/^perplexity: //p' <<<"$out")
[ -n "$vl" ] && [ -n "$ppl" ] || fail "eval output"
awk -v l="$vl" -v p="$ppl" 'BEGIN { e = exp(l); exit !(p > e * 0.999999 && p < e * 1.000001) }' ||
  fail "perplexity $ppl is not exp($vl)"
logged=$(grep '"val_loss"' run/metrics.jsonl | tail -n 1 | sed -E 's/.*"val_loss": ?([-0-9.eE+]+).*/\1/')
awk -v a="$vl" -v b="$logged" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-6 * (b < 0 ? -b : b) + 1e-9) }' ||
  fail "eval val_loss $vl differs from the run's logged $logged"
out2=$("$ORCH_BIN" eval --checkpoint run --batches 1) || fail "eval --batches"
grep -q '^tokens: 32 (1 batches x 2 x 16)$' <<<"$out2" || fail "eval --batches: $out2"
"$ORCH_BIN" eval --checkpoint run --val "$work/none*.bin" >/dev/null 2>err.txt; rc=$?
[ $rc -eq 2 ] && grep -q "validation data" err.txt || fail "eval without data: rc $rc $(cat err.txt)"
"$ORCH_BIN" eval --help | grep -q "usage: orch eval" || fail "eval --help"
"$ORCH_BIN" eval >/dev/null 2>&1; [ $? -eq 2 ] || fail "eval without --checkpoint"
echo "ok"
