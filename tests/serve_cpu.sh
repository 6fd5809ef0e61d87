#!/usr/bin/env bash
# serve_cpu.sh - the CPU engine through orch serve: a tiny model trained with
# `orch train --engine cpu` gives, greedily, exactly the text `orch generate`
# prints for the same checkpoint and prompt, for a request alone and for
# requests batched together; a seeded sampled request equals
# `orch generate --seed` too; with and without the prefix cache the greedy
# outputs are the same (repeats report cached tokens). Skips (77) when
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
            "heads": 2, "width": 32, "mlp_width": 128},
  "train": {"micro_batch": 8, "seq_len": 32, "max_steps": 300, "lr": 3e-3,
            "warmup_steps": 5, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "cpu", "threads": 1}
}
JSON
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { tail -n 5 train.log; fail "orch train --engine cpu"; }

start_server cpu --checkpoint run --engine cpu --threads 1 --model-name tiny
PROMPTS=("And God said" "Let there be" "light: and" "Verse 1" "the day.")
for p in "${PROMPTS[@]}"; do
  "$ORCH_BIN" generate --checkpoint run --engine cpu --threads 1 --prompt "$p" --max-tokens 30 \
    --temperature 0 --no-echo >"gen_$(echo "$p" | tr -cd 'a-zA-Z0-9').txt" 2>>gen.log || { cat gen.log; fail "generate"; }
done
"$ORCH_BIN" generate --checkpoint run --engine cpu --threads 1 --prompt "And" --max-tokens 20 \
  --temperature 0.9 --seed 5 --no-echo >gen_sampled.txt 2>>gen.log || { cat gen.log; fail "generate --seed"; }
"$PY" - "$PORT" "${PROMPTS[@]}" <<'PYEOF' || fail "server output differs from orch generate"
import re, sys, threading
from client import post, check
port, prompts = int(sys.argv[1]), sys.argv[2:]
def gen(p):
    t = open("gen_%s.txt" % re.sub("[^a-zA-Z0-9]", "", p), encoding="utf-8", errors="surrogateescape").read()
    return t  # generate ends its output with a newline unless the text has one
def same(server, p):
    g = gen(p)
    return g == server or g == server + "\n"
for p in prompts:  # one at a time
    st, js, _ = post(port, "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 30, "temperature": 0})
    check(st == 200, "status %d %s" % (st, js))
    check(same(js["choices"][0]["text"], p), "alone %r: server %r, generate %r" % (p, js["choices"][0]["text"], gen(p)))
res = {}
def one(i, p):
    res[i] = post(port, "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 30, "temperature": 0})
ths = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts * 2)]
for t in ths: t.start()
for t in ths: t.join()
for i, p in enumerate(prompts * 2):
    st, js, _ = res[i]
    check(st == 200 and same(js["choices"][0]["text"], p), "batched %r: %r vs %r" % (p, js["choices"][0]["text"], gen(p)))
body = {"model": "tiny", "prompt": "And", "max_tokens": 20, "temperature": 0.9, "seed": 5}
a = post(port, "/v1/completions", body)[1]["choices"][0]["text"]
check(a == post(port, "/v1/completions", body)[1]["choices"][0]["text"], "seeded sampling repeatable")
sampled = open("gen_sampled.txt", encoding="utf-8", errors="surrogateescape").read()
check(sampled == a or sampled == a + "\n", "seed 5: server %r, generate %r" % (a, sampled))
print("cpu serve ok; e.g. %r -> %r" % (prompts[0], gen(prompts[0])))
PYEOF
# Prefix caching: greedy outputs with the cache equal those without it (shared
# prefixes, repeated prompts, n > 1, concurrent), and repeats report cached tokens.
PID_CACHE=$PID P_CACHE=$PORT
start_server nocache --checkpoint run --engine cpu --threads 1 --model-name tiny --no-prefix-cache
"$PY" - "$P_CACHE" "$PORT" <<'PYEOF' || fail "prefix cache changes the CPU engine's greedy output"
import sys, threading
from client import post, check
pc, pn = int(sys.argv[1]), int(sys.argv[2])
head = "And God said, Let there be light: and "  # 38 bytes: two full blocks
prompts = [head + t for t in ("there", "God", "the day", "Verse 9", "")] + [head[:20] + "x", "Let there be light"]
def ask(port, p, n=1):
    st, js, _ = post(port, "/v1/completions", {"model": "tiny", "prompt": p, "max_tokens": 12, "temperature": 0, "n": n})
    check(st == 200, "status %d %s" % (st, js))
    return [c["text"] for c in js["choices"]], js["usage"]["prompt_tokens_details"]["cached_tokens"]
want = {p: ask(pn, p)[0][0] for p in prompts}
for rnd in range(2):
    for p in prompts:
        got, cached = ask(pc, p)
        check(got[0] == want[p], "round %d %r: cache %r, no cache %r" % (rnd, p, got[0], want[p]))
        if rnd == 1:
            check(cached == (len(p) - 1) // 16 * 16, "repeat %r cached_tokens %d" % (p, cached))
got, _ = ask(pc, head + "n=3", 3)
check(got == [ask(pn, head + "n=3")[0][0]] * 3, "n=3 with cache %r" % got)
res = {}
def one(i, p):
    res[i] = ask(pc, p + " again")[0][0]
ths = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
for t in ths: t.start()
for t in ths: t.join()
for i, p in enumerate(prompts):
    check(res[i] == ask(pn, p + " again")[0][0], "concurrent %r" % p)
print("prefix cache: same greedy outputs on the cpu engine")
PYEOF
stop_server "$PID" || fail "exit status after SIGTERM (no cache)"
stop_server "$PID_CACHE" || fail "exit status after SIGTERM"
echo "serve_cpu: ok"
