#!/usr/bin/env bash
# kv_dtype_cli.sh - `--kv-cache-dtype auto|f32|bf16|int8` end to end on the CPU
# engine: a tiny model trained with `orch train --engine cpu`; --help of
# generate, serve and bench lists the flag; `orch generate` with f32 prints
# what the default (auto = f32 for fp32 weights) prints, with --quantize int8
# the default (auto = bf16) prints what bf16 prints; bf16 greedy text is
# compared with f32 (printed; the first 8 characters must agree), so is
# int8 (fp32 weights and --quantize int8 against --quantize int8 with f32);
# `orch
# serve --kv-cache-dtype bf16` answers greedily what generate prints; a
# type that does not exist is a one-line usage error listing the choices;
# the mock engine (no kv= option) gives its own error through generate and
# serve; `orch bench infer --kv-cache-dtype bf16` and int8 run. Skips (77) when
# build/libengine_cpu.so is missing.
source "$(dirname "$0")/serve/common.sh"
[ -f "${ORCH_BUILD:-$(dirname "$ORCH_BIN")}/libengine_cpu.so" ] || { echo "skip: libengine_cpu.so is not built"; exit 77; }
cd "$T" || exit 1
for i in $(seq 1 200); do echo "And God said, Let there be light: and there was light. Verse $i of the day."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; echo "skip: orch prepare failed"; exit 77; }
cat >cfg.json <<'JSON'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 64, "layers": 2,
            "heads": 2, "width": 64, "mlp_width": 256},
  "train": {"micro_batch": 8, "seq_len": 32, "max_steps": 120, "lr": 3e-3,
            "warmup_steps": 5, "eval_every": 0, "eval_batches": 4, "checkpoint_every": 0},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "cpu", "threads": 1}
}
JSON
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { tail -n 5 train.log; fail "orch train --engine cpu"; }

for c in generate serve; do
  "$ORCH_BIN" $c --help 2>&1 | grep -q -- '--kv-cache-dtype T' || fail "orch $c --help lacks --kv-cache-dtype"
done
"$ORCH_BIN" bench --help 2>&1 | grep -q -- '--kv-cache-dtype' || fail "orch bench --help lacks --kv-cache-dtype"

gen() { "$ORCH_BIN" generate --checkpoint run --threads 1 --max-tokens 40 --temperature 0 --no-echo "$@"; }
gen --prompt "And God said" >default.txt 2>gen.log || { cat gen.log; fail "generate"; }
gen --prompt "And God said" --kv-cache-dtype f32 >f32.txt 2>gen.log || { cat gen.log; fail "generate --kv-cache-dtype f32"; }
gen --prompt "And God said" --kv-cache-dtype auto >auto.txt 2>gen.log || { cat gen.log; fail "generate --kv-cache-dtype auto"; }
gen --prompt "And God said" --kv-cache-dtype bf16 >bf16.txt 2>gen.log || { cat gen.log; fail "generate --kv-cache-dtype bf16"; }
[ -s gen.log ] && { cat gen.log; fail "generate --kv-cache-dtype bf16 wrote to stderr"; }
cmp -s default.txt f32.txt || fail "fp32 weights: the default is not kv f32"
cmp -s default.txt auto.txt || fail "--kv-cache-dtype auto differs from the default"
gen --prompt "And God said" --quantize int8 >q8.txt 2>gen.log || { cat gen.log; fail "generate --quantize int8"; }
gen --prompt "And God said" --quantize int8 --kv-cache-dtype bf16 >q8bf.txt 2>gen.log || { cat gen.log; fail "--quantize int8 --kv-cache-dtype bf16"; }
gen --prompt "And God said" --quantize int8 --kv-cache-dtype int8 >q8i8.txt 2>gen.log || { cat gen.log; fail "--quantize int8 --kv-cache-dtype int8"; }
cmp -s q8.txt q8bf.txt || fail "--quantize int8: the default is not kv bf16"
same=$("$PY" -c 'import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
print(n if a != b else -1)' f32.txt bf16.txt)
if [ "$same" = -1 ]; then
  echo "kv_dtype_cli: greedy 40 tokens: kv bf16 equals f32"
else
  echo "kv_dtype_cli: greedy 40 tokens: kv bf16 differs from f32 from byte $same"
  [ "$same" -ge 8 ] || fail "bf16 greedy text differs from f32 at byte $same: $(cat bf16.txt) vs $(cat f32.txt)"
fi

# int8: fp32 weights against kv f32, int8 weights against int8 weights with kv f32.
gen --prompt "And God said" --kv-cache-dtype int8 >i8.txt 2>gen.log || { cat gen.log; fail "generate --kv-cache-dtype int8"; }
[ -s gen.log ] && { cat gen.log; fail "generate --kv-cache-dtype int8 wrote to stderr"; }
gen --prompt "And God said" --quantize int8 --kv-cache-dtype f32 >q8f.txt 2>gen.log || { cat gen.log; fail "--quantize int8 --kv-cache-dtype f32"; }
for pair in "f32.txt i8.txt" "q8f.txt q8i8.txt" "q8f.txt q8bf.txt"; do
  set -- $pair
  same=$("$PY" -c 'import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
print(n if a != b else -1)' "$1" "$2")
  if [ "$same" = -1 ]; then
    echo "kv_dtype_cli: greedy 40 tokens: $2 equals $1 (kv f32)"
  else
    echo "kv_dtype_cli: greedy 40 tokens: $2 differs from $1 (kv f32) from byte $same"
    [ "$same" -ge 8 ] || fail "$2 greedy text differs from $1 at byte $same: $(cat "$2") vs $(cat "$1")"
  fi
done

# A type that does not exist: one line, the choices, exit 2.
gen --prompt x --kv-cache-dtype fp8 >out.txt 2>err.txt
rc=$?
[ $rc -eq 2 ] || fail "--kv-cache-dtype fp8: exit $rc, want 2"
[ "$(wc -l <err.txt)" -eq 1 ] && grep -q "unknown type 'fp8' (choices: auto, f32, bf16, int8)" err.txt ||
  { cat err.txt; fail "--kv-cache-dtype fp8 message"; }
# The mock engine has no kv= option: its own error, through generate and serve.
gen --prompt x --kv-cache-dtype bf16 --engine mock >out.txt 2>err.txt && fail "mock accepted kv=bf16"
grep -q "kv=bf16" err.txt || { cat err.txt; fail "mock's error does not name the option"; }
"$ORCH_BIN" serve --checkpoint run --engine mock --kv-cache-dtype bf16 --port 0 >out.txt 2>err.txt && fail "serve: mock accepted kv=bf16"
grep -q "unknown option 'kv=bf16'" err.txt || { cat err.txt; fail "serve --kv-cache-dtype bf16 did not pass kv=bf16"; }
"$ORCH_BIN" serve --checkpoint run --kv-cache-dtype int4 --port 0 >out.txt 2>err.txt
rc=$?
[ $rc -eq 2 ] && grep -q "choices: auto, f32, bf16, int8" err.txt || { cat err.txt; fail "serve --kv-cache-dtype int4: exit $rc"; }

# serve --kv-cache-dtype bf16 answers what generate --kv-cache-dtype bf16 prints.
start_server kvbf --checkpoint run --engine cpu --threads 1 --model-name tiny --kv-cache-dtype bf16
"$PY" - "$PORT" <<'PYEOF' || fail "serve --kv-cache-dtype bf16 differs from generate"
import sys
from client import post, check
st, js, _ = post(int(sys.argv[1]), "/v1/completions",
                 {"model": "tiny", "prompt": "And God said", "max_tokens": 40, "temperature": 0})
check(st == 200, "status %d %s" % (st, js))
text = js["choices"][0]["text"]
want = open("bf16.txt", encoding="utf-8", errors="surrogateescape").read()
check(want == text or want == text + "\n", "server %r, generate %r" % (text, want))
PYEOF
stop_server "$PID" || fail "exit status after SIGTERM"

# bench infer passes kv=bf16 (the mock refuses it by name; the cpu engine runs).
"$ORCH_BIN" bench infer --engine mock --config cfg.json --prompt 16 --decode-prompt 8 --decode-steps 4 --kv-cache-dtype bf16 >out.txt 2>err.txt && fail "bench: mock accepted kv=bf16"
grep -q "kv=bf16" err.txt || { cat err.txt; fail "bench --kv-cache-dtype did not pass kv=bf16"; }
"$ORCH_BIN" bench infer --config cfg.json --threads 1 --prompt 16 --decode-prompt 8 --decode-steps 4 \
  --kv-cache-dtype bf16 --json >bench.json 2>err.txt || { cat err.txt; fail "bench infer --kv-cache-dtype bf16"; }
grep -q '"decode_tokens_per_s_16"' bench.json || { cat bench.json; fail "bench infer output"; }
"$ORCH_BIN" bench infer --config cfg.json --threads 1 --prompt 16 --decode-prompt 8 --decode-steps 4 \
  --quantize int8 --kv-cache-dtype int8 --json >bench.json 2>err.txt || { cat err.txt; fail "bench infer --kv-cache-dtype int8"; }
grep -q '"decode_tokens_per_s_16"' bench.json || { cat bench.json; fail "bench infer int8 output"; }
"$ORCH_BIN" bench infer --config cfg.json --kv-cache-dtype fp8 >out.txt 2>err.txt && fail "bench accepted fp8"
grep -q "f32|bf16|int8" err.txt || { cat err.txt; fail "bench --kv-cache-dtype fp8 message"; }
echo "kv_dtype_cli: ok"
