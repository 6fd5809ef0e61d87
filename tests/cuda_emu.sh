#!/usr/bin/env bash
# cuda_emu.sh - runs the CUDA engine's parity and conformance suites without a
# GPU: compiles engines/cuda/*.cu as plain C++ against the CPU emulator of
# tests/cuda_emu (fake CUDA runtime + cuBLAS: fibers for threads, real
# barriers, cuBLAS's column-major semantics and argument checks), with the C
# objects of engines/common linked in as the libengine_cuda.so rule does, into
# a temporary libengine_cuda_emu.so; then runs $ORCH_BUILD/tests/test_cuda_engine
# against it (ORCH_CUDA_ENGINE: every kernel, GEMM layout and host path of the
# CUDA engine checked against the CPU engine for GPT-2, and against the torch
# fixtures tests/fixtures/cpu_llama_tiny_kv*.safetensors for LLaMA) and
# $ORCH_BUILD/tests/test_conformance on it alone (ORCH_CONFORMANCE_ENGINES:
# the ABI's rules), and $ORCH_BUILD/tests/test_cuda_lora (its LoRA adapters,
# ABI 1.4, against the torch fixtures and the CPU engine) and
# $ORCH_BUILD/tests/test_cuda_ft_stream (its token-level fine-tuning streams,
# ABI 1.5, against adapter_forward_backward and the CPU engine's streams), so all run in
# `make test`. Then the orchestrator's LoRA paths on the emulated engine
# (they check ORCH_CAP_LORA): `orch finetune --engine <emulated>` on a tiny
# byte-level GPT-2 trained by the CPU engine (the loss falls and follows
# the CPU engine's run of the same job: 1e-3 over the first 3 steps, 5e-2
# over all 20 at lr 0.03, where rounding differences grow), and `orch generate
# --lora` with that adapter: greedy text equal to the CPU engine's with the
# same adapter, and not the base's; `orch serve --lora ad=DIR` answering
# adapter and base requests at the same time (mixed batches), each with
# its own greedy text; and `orch serve --state-dir` running a fine-tuning
# job co-served with completions (coserve_forward, ABI 1.4).
# Skips (77) under sanitizers (the emulator switches stacks), without g++, or
# when the test binaries or the CPU engine are not built.
set -u
cd "$(dirname "$0")/.."
BUILD_DIR=${ORCH_BUILD:-$PWD/build}
if [ -n "${ORCH_SAN:-}" ]; then
  echo "cuda_emu: skipped under sanitizers (the CUDA emulator switches stacks)"
  exit 77
fi
CXX=${CXX:-g++}
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "cuda_emu: skipped: no C++ compiler ($CXX) to build the emulated engine"
  exit 77
fi
for f in tests/test_cuda_engine tests/test_cuda_lora tests/test_cuda_ft_stream \
    tests/test_conformance orch \
    libengine_cpu.so; do
  if [ ! -e "$BUILD_DIR/$f" ]; then
    echo "cuda_emu: skipped: $BUILD_DIR/$f is not built"
    exit 77
  fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# engines/common is C11: compiled by the C compiler, linked in like the .so rule.
objs=()
for c in engines/common/*.c; do
  o="$tmp/$(basename "$c" .c).o"
  if ! "${CC:-cc}" -std=c11 -O2 -g -fPIC -fvisibility=hidden -Wall -Wextra -Werror \
      -D_GNU_SOURCE -I . -c "$c" -o "$o"; then
    echo "cuda_emu: FAIL: $c does not compile"
    exit 1
  fi
  objs+=("$o")
done
if ! "$CXX" -std=c++17 -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra \
    -I tests/cuda_emu -I . -x c++ engines/cuda/*.cu tests/cuda_emu/emu.cpp \
    -x none "${objs[@]}" -o "$tmp/libengine_cuda_emu.so"; then
  echo "cuda_emu: FAIL: the CUDA engine does not compile against the emulator"
  exit 1
fi
rc=0
ORCH_CUDA_ENGINE="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_cuda_engine" || rc=1
ORCH_CONFORMANCE_ENGINES="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_conformance" | tee "$tmp/conformance.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
# The conformance suite falls back to the mock when the named engine cannot
# run: make sure it tested the emulated engine.
if ! grep -q '^conformance: testing engine cuda ' "$tmp/conformance.log"; then
  echo "cuda_emu: FAIL: the conformance suite did not test the emulated CUDA engine"
  rc=1
fi
ORCH_CUDA_ENGINE="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_cuda_lora" || rc=1
ORCH_CUDA_ENGINE="$tmp/libengine_cuda_emu.so" ORCH_ENGINE_PATH="$BUILD_DIR" \
  "$BUILD_DIR/tests/test_cuda_ft_stream" || rc=1

# ---- orch finetune / orch generate --lora on the emulated engine ----
emu="$tmp/libengine_cuda_emu.so"
repo=$PWD
orch() { ORCH_ENGINE_PATH="$BUILD_DIR" "$BUILD_DIR/orch" "$@"; }
(
  cd "$tmp" || exit 1
  for i in $(seq 1 100); do echo "And God said, Let there be light: and there was light. Verse $i."; done >corpus.txt
  orch prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 >prep.log 2>&1 ||
    { cat prep.log; exit 1; }
  cat >cfg.json <<'JSON'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 64, "layers": 2,
            "heads": 2, "width": 32, "mlp_width": 128},
  "train": {"micro_batch": 8, "seq_len": 32, "max_steps": 150, "lr": 3e-3, "seed": 1,
            "warmup_steps": 5, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "cpu", "threads": 1}
}
JSON
  orch train --config cfg.json --out base >train.log 2>&1 || { tail -n 5 train.log; exit 1; }
  for i in $(seq 1 32); do
    echo '{"prompt": "And God said, ", "completion": "the day of the day of the day."}'
  done >ft.jsonl
  ft=(finetune --checkpoint base --data ft.jsonl --max-steps 20 --lr 0.03 --rank 4 --targets all
      --batch 4 --seq-len 48 --seed 3)
  orch "${ft[@]}" --engine "$emu" --out ad_emu >ft_emu.log 2>&1 || { tail -n 5 ft_emu.log; exit 1; }
  orch "${ft[@]}" --engine cpu --threads 1 --out ad_cpu >ft_cpu.log 2>&1 ||
    { tail -n 5 ft_cpu.log; exit 1; }
  python3 - ad_emu/metrics.jsonl ad_cpu/metrics.jsonl <<'EOF' || exit 1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
d = [abs(x["loss"] - y["loss"]) for x, y in zip(a, b)]
print(f"cuda_emu: orch finetune: loss {a[0]['loss']:.4f} -> {a[-1]['loss']:.4f} "
      f"(cpu engine {b[-1]['loss']:.4f}; step difference {max(d[:3]):.2g} over the "
      f"first 3 steps, {max(d):.2g} over all 20)")
assert len(a) == len(b) == 20 and a[-1]["loss"] < a[0]["loss"] - 0.5
assert max(d[:3]) < 1e-3 and max(d) < 5e-2
EOF
  gen=(generate --checkpoint base --prompt "And God said, " --max-tokens 16 --temperature 0 --no-echo)
  orch "${gen[@]}" --engine "$emu" --lora ad_emu >g_emu.txt 2>gen.log || { cat gen.log; exit 1; }
  orch "${gen[@]}" --engine cpu --threads 1 --lora ad_emu >g_cpu.txt 2>>gen.log || { cat gen.log; exit 1; }
  orch "${gen[@]}" --engine "$emu" >g_base.txt 2>>gen.log || { cat gen.log; exit 1; }
  cmp -s g_emu.txt g_cpu.txt || { echo "emulated: $(cat g_emu.txt) / cpu: $(cat g_cpu.txt)"; exit 1; }
  cmp -s g_emu.txt g_base.txt && { echo "the adapter changes nothing"; exit 1; }
  echo "cuda_emu: orch generate --lora: the cpu engine's text, not the base's"
  # orch serve --lora on the emulated engine: the adapter's completion is
  # orch generate --lora's text, the base's is the base's, also when both
  # run at once (mixed batches through the scheduler)
  # (the binary itself, not the orch function: $! must be the server's pid)
  ORCH_ENGINE_PATH="$BUILD_DIR" "$BUILD_DIR/orch" serve --checkpoint base --engine "$emu" --port 0 \
    --model-name tiny --lora ad=ad_emu 2>serve.log &
  spid=$!
  for _ in $(seq 1 300); do grep -q 'orch serve: ready' serve.log && break; sleep 0.1; done
  port=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' serve.log | head -n1 | sed -E 's/.*:([0-9]+)$/\1/')
  python3 - "${port:-0}" g_emu.txt g_base.txt <<'EOF'
import json, sys, threading, urllib.request
port, want_ad, want_base = int(sys.argv[1]), open(sys.argv[2]).read(), open(sys.argv[3]).read()
def comp(model, out, k):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps({"model": model, "prompt": "And God said, ", "max_tokens": 16,
                    "temperature": 0}).encode(), {"Content-Type": "application/json"})
    out[k] = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]
out = {}
ts = [threading.Thread(target=comp, args=("ad" if k % 2 else "tiny", out, k)) for k in range(4)]
for t in ts: t.start()
for t in ts: t.join()
for k in range(4):
    want = want_ad if k % 2 else want_base
    assert out.get(k) == want.rstrip("\n"), (k, out.get(k), want)
print("cuda_emu: orch serve --lora: adapter and base requests at once, each its own text")
EOF
  st=$?
  kill -TERM "$spid" 2>/dev/null
  wait "$spid"
  [ $st -eq 0 ] || { cat serve.log; exit 1; }
  # co-serving (--ft-granularity auto: token level, the engine's ABI 1.5
  # streams, ORCH_CAP_FT_STREAM): a fine-tuning job succeeds while 2
  # clients keep getting greedy completions of the base, which stay one
  # text, its events name token-level chunks, and its rows ride in the
  # inference passes (coserve_step)
  ORCH_ENGINE_PATH="$BUILD_DIR" "$BUILD_DIR/orch" serve --checkpoint base --engine "$emu" --port 0 \
    --model-name tiny --state-dir S --ft-seq-len 48 --ft-micro-batch 2 --ft-lr 0.02 \
    --ft-targets all --ft-rank 4 2>serve_ft.log &
  spid=$!
  for _ in $(seq 1 300); do grep -q 'orch serve: ready' serve_ft.log && break; sleep 0.1; done
  port=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' serve_ft.log | head -n1 | sed -E 's/.*:([0-9]+)$/\1/')
  PYTHONPATH="$repo/tests/serve" python3 "$repo/tests/serve/ft_job.py" "${port:-0}" ft.jsonl tiny 3 1 4 2 \
    >ft_job.json 2>&1
  st=$?
  curl -s "http://127.0.0.1:${port:-0}/metrics" >ft.prom
  kill -TERM "$spid" 2>/dev/null
  wait "$spid"
  python3 - ft_job.json ft.prom <<'EOF' || st=1
import json, re, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
prom = open(sys.argv[2]).read()
shared = re.search(r"^orch_coserve_shared_passes_total (\S+)$", prom, re.M)
assert j["completions"] > 0 and j["unchanged"], j
assert shared and float(shared.group(1)) >= 1, "no fine-tuning rows rode in an inference pass"
tl = [e for e in j["events"] if "token-level" in e]
assert tl, ("the job did not run token-level streams", j["events"])
print("cuda_emu: orch serve: a fine-tuning job succeeded beside %d completions (one text), "
      "%d co-served passes (%s)" % (j["completions"], float(shared.group(1)),
                                     re.search(r"token-level[^)]*", tl[0]).group(0)))
EOF
  [ $st -eq 0 ] || { cat ft_job.json; tail -n 20 serve_ft.log; exit 1; }
) || { echo "cuda_emu: FAIL: orch finetune / generate --lora / serve on the emulated CUDA engine"; rc=1; }
exit $rc
