#!/usr/bin/env bash
# quantize_cli.sh - `--quantize int8` end to end on the CPU engine: a tiny
# model trained with `orch train --engine cpu`; `orch generate --quantize
# int8` runs (greedy text compared with fp32: printed, and the first 8
# characters must agree), `orch eval --quantize int8` is within 1% of the
# fp32 perplexity, `orch serve --quantize int8` answers greedily exactly what
# `orch generate --quantize int8` prints; a format that does not exist is a
# one-line usage error listing the choices; an engine without the option
# (the mock) gives its own error; --help of the three commands lists the
# flag. Skips (77) when build/libengine_cpu.so is missing.
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
  "train": {"micro_batch": 8, "seq_len": 32, "max_steps": 200, "lr": 3e-3,
            "warmup_steps": 5, "eval_every": 0, "eval_batches": 4, "checkpoint_every": 0},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "cpu", "threads": 1}
}
JSON
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { tail -n 5 train.log; fail "orch train --engine cpu"; }

# --help of each command names the flag.
for c in generate serve eval; do
  "$ORCH_BIN" $c --help 2>&1 | grep -q -- '--quantize FMT' || fail "orch $c --help lacks --quantize"
done

gen() { "$ORCH_BIN" generate --checkpoint run --threads 1 --max-tokens 40 --temperature 0 --no-echo "$@"; }
gen --prompt "And God said" >fp32.txt 2>gen.log || { cat gen.log; fail "generate"; }
gen --prompt "And God said" --quantize int8 >int8.txt 2>gen.log || { cat gen.log; fail "generate --quantize int8"; }
[ -s int8.txt ] || fail "generate --quantize int8 printed nothing"
[ -s gen.log ] && { cat gen.log; fail "generate --quantize int8 wrote to stderr"; }
same=$("$PY" -c 'import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
n = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
print(n if a != b else -1)' fp32.txt int8.txt)
if [ "$same" = -1 ]; then
  echo "quantize_cli: greedy 40 tokens: int8 equals fp32"
else
  echo "quantize_cli: greedy 40 tokens: int8 differs from fp32 from byte $same"
  [ "$same" -ge 8 ] || fail "int8 greedy text differs from fp32 at byte $same: $(cat int8.txt) vs $(cat fp32.txt)"
fi

# A format that does not exist: one line, the choices, exit 2.
gen --prompt x --quantize int4 >out.txt 2>err.txt
rc=$?
[ $rc -eq 2 ] || fail "--quantize int4: exit $rc, want 2"
[ "$(wc -l <err.txt)" -eq 1 ] && grep -q "unknown format 'int4' (choices: int8, fp32)" err.txt ||
  { cat err.txt; fail "--quantize int4 message"; }
# The mock engine has no weights= option: its own error.
gen --prompt x --quantize int8 --engine mock >out.txt 2>err.txt && fail "mock accepted weights=int8"
grep -q "weights=int8" err.txt || { cat err.txt; fail "mock's error does not name the option"; }
# serve passes it too (the mock's refusal shows it arrived).
"$ORCH_BIN" serve --checkpoint run --engine mock --quantize int8 --port 0 >out.txt 2>err.txt && fail "serve: mock accepted weights=int8"
grep -q "unknown option 'weights=int8'" err.txt || { cat err.txt; fail "serve --quantize int8 did not pass weights=int8"; }

# eval: perplexity of the int8-rounded weights within 1% of fp32.
"$ORCH_BIN" eval --checkpoint run --threads 1 >eval32.txt 2>&1 || { cat eval32.txt; fail "eval"; }
"$ORCH_BIN" eval --checkpoint run --threads 1 --quantize int8 >eval8.txt 2>&1 ||
  { cat eval8.txt; fail "eval --quantize int8"; }
"$PY" - eval32.txt eval8.txt <<'PYEOF' || fail "eval perplexity"
import re, sys
def ppl(f):
    return float(re.search(r"perplexity\s*[:=]?\s*([0-9.eE+-]+)", open(f).read()).group(1))
a, b = ppl(sys.argv[1]), ppl(sys.argv[2])
print("quantize_cli: eval perplexity fp32 %.5f, int8 %.5f (%+.3f%%)" % (a, b, 100 * (b / a - 1)))
sys.exit(0 if abs(b / a - 1) < 0.01 else 1)
PYEOF

# serve --quantize int8 answers what generate --quantize int8 prints.
start_server q8 --checkpoint run --engine cpu --threads 1 --model-name tiny --quantize int8
"$PY" - "$PORT" <<'PYEOF' || fail "serve --quantize int8 differs from generate --quantize int8"
import sys
from client import post, check
st, js, _ = post(int(sys.argv[1]), "/v1/completions",
                 {"model": "tiny", "prompt": "And God said", "max_tokens": 40, "temperature": 0})
check(st == 200, "status %d %s" % (st, js))
text = js["choices"][0]["text"]
want = open("int8.txt", encoding="utf-8", errors="surrogateescape").read()
check(want == text or want == text + "\n", "server %r, generate %r" % (text, want))
PYEOF
stop_server "$PID" || fail "exit status after SIGTERM"
# serve refuses an unknown format before starting.
"$ORCH_BIN" serve --checkpoint run --quantize fp8 --port 0 >out.txt 2>err.txt
rc=$?
[ $rc -eq 2 ] && grep -q "choices: int8, fp32" err.txt || { cat err.txt; fail "serve --quantize fp8: exit $rc"; }
echo "quantize_cli: ok"
