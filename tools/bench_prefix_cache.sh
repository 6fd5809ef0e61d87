#!/usr/bin/env bash
# bench_prefix_cache.sh - the prefix-caching benchmark: starts `orch serve`
# twice on the same checkpoint (prefix cache on, and --no-prefix-cache), runs
# two loadgen workloads against each, one server at a time, and prints request
# throughput, TTFT p50 and the with/without ratios:
#   (a) shared system prompt: a common SHARED_LEN-character prefix followed
#       by REQUESTS different short questions (completions);
#   (b) multi-turn chat: CONVS conversations of TURNS turns, each turn
#       resending the whole conversation (chat completions).
# Usage: tools/bench_prefix_cache.sh [CHECKPOINT] (default runs/default; the
# model's context must hold SHARED_LEN + QUESTION_LEN + MAX_TOKENS tokens).
# Environment: BUILD (build), ENGINE (cpu), SERVE_ARGS (extra serve flags),
# SHARED_LEN (1000), QUESTION_LEN (32), REQUESTS (64), CONCURRENCY (8),
# MAX_TOKENS (16), CONVS (8), TURNS (8), TURN_LEN (100), TURN_TOKENS (16),
# TURN_CONCURRENCY (4).
set -euo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:-runs/default}
BUILD=${BUILD:-build}
ENGINE=${ENGINE:-cpu}
SHARED_LEN=${SHARED_LEN:-1000}
QUESTION_LEN=${QUESTION_LEN:-32}
REQUESTS=${REQUESTS:-64}
CONCURRENCY=${CONCURRENCY:-8}
MAX_TOKENS=${MAX_TOKENS:-16}
CONVS=${CONVS:-8}
TURNS=${TURNS:-8}
TURN_LEN=${TURN_LEN:-100}
TURN_TOKENS=${TURN_TOKENS:-16}
TURN_CONCURRENCY=${TURN_CONCURRENCY:-4}
ORCH=$BUILD/orch
LOADGEN=$BUILD/tools/loadgen
[ -x "$ORCH" ] && [ -x "$LOADGEN" ] || { echo "build first: make (missing $ORCH or $LOADGEN)" >&2; exit 2; }
[ -e "$CKPT" ] || { echo "no checkpoint at $CKPT (make run trains runs/default)" >&2; exit 2; }

T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

# start NAME FLAGS...: start a server, set PORT once it is ready
start() {
  local name=$1; shift
  # shellcheck disable=SC2086
  "$ORCH" serve --checkpoint "$CKPT" --engine "$ENGINE" --port 0 ${SERVE_ARGS:-} "$@" \
    >"$T/$name.out" 2>"$T/$name.log" &
  local pid=$!
  PIDS+=("$pid")
  PORT=""
  for _ in $(seq 1 1200); do
    PORT=$(grep -oE 'listening on http://[0-9.]+:[0-9]+' "$T/$name.log" | head -n1 | sed -E 's/.*:([0-9]+)$/\1/' || true)
    if [ -n "$PORT" ] && grep -q 'orch serve: ready' "$T/$name.log"; then return 0; fi
    kill -0 "$pid" 2>/dev/null || { cat "$T/$name.log" >&2; echo "server $name failed" >&2; exit 1; }
    sleep 0.1
  done
  cat "$T/$name.log" >&2
  echo "server $name did not become ready" >&2
  exit 1
}

start on
P_ON=$PORT
start off --no-prefix-cache
P_OFF=$PORT
MODEL=$(python3 -c "import json,urllib.request as u; print(json.load(u.urlopen('http://127.0.0.1:$P_ON/v1/models'))['data'][0]['id'])")
MODEL_ARG=(--model "$MODEL")

# run PORT OUT ARGS...: one loadgen run, JSON line into OUT
run() {
  local port=$1 out=$2; shift 2
  "$LOADGEN" --port "$port" "${MODEL_ARG[@]}" --json "$@" >"$out"
}
A=(--requests "$REQUESTS" --concurrency "$CONCURRENCY" --shared-prefix-len "$SHARED_LEN"
   --prompt-len "$QUESTION_LEN" --max-tokens "$MAX_TOKENS")
B=(--endpoint /v1/chat/completions --requests $((CONVS * TURNS)) --turns "$TURNS"
   --concurrency "$TURN_CONCURRENCY" --prompt-len "$TURN_LEN" --max-tokens "$TURN_TOKENS")
# one warm-up request each (lazy engine set-up), then the measured runs
"$LOADGEN" --port "$P_ON" "${MODEL_ARG[@]}" --requests 1 --concurrency 1 --max-tokens 2 >/dev/null
"$LOADGEN" --port "$P_OFF" "${MODEL_ARG[@]}" --requests 1 --concurrency 1 --max-tokens 2 >/dev/null
run "$P_ON" "$T/a_on.json" "${A[@]}" --seed 11
run "$P_OFF" "$T/a_off.json" "${A[@]}" --seed 11
run "$P_ON" "$T/b_on.json" "${B[@]}" --seed 12
run "$P_OFF" "$T/b_off.json" "${B[@]}" --seed 12

python3 - "$T" <<'EOF'
import json, sys
t = sys.argv[1]
def load(n):
    return json.load(open("%s/%s.json" % (t, n)))
print("%-34s %10s %10s %12s %10s %8s" % ("workload", "req/s", "TTFT p50", "input tok", "cached", "failed"))
for w, title in (("a", "(a) shared 1k-token system prompt"), ("b", "(b) multi-turn chat")):
    on, off = load(w + "_on"), load(w + "_off")
    for name, r in (("cache", on), ("no cache", off)):
        print("%-34s %10.2f %8.0f ms %12d %10d %8d" % (title + ", " + name, r["request_throughput"],
              r["median_ttft_ms"], r["input_tokens"], r["cached_tokens"], r["failed"]))
    print("%-34s throughput %.2fx, TTFT p50 %.2fx lower" % (
        title + ": ratio", on["request_throughput"] / off["request_throughput"],
        off["median_ttft_ms"] / max(on["median_ttft_ms"], 1e-9)))
EOF
