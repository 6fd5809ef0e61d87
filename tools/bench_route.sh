#!/usr/bin/env bash
# bench_route.sh - orch route's cache-aware policy against round robin, in one
# run: for each policy, fresh mock `orch serve` replicas (a cost model per
# computed prompt token and per decoded token, so replicas on a small machine
# behave like real ones; engines/mock/README.md) behind a fresh router, the
# same workload from tools/bench_route.py (P shared system prompts x Q
# questions), then the ratios. The cache hit rate comes from the workers'
# usage.prompt_tokens_details.cached_tokens; without that field it is
# reported as unavailable.
#
# usage: tools/bench_route.sh [--build DIR] [--workers 4] [--prompts 16]
#        [--questions 32] [--concurrency 32] [--max-tokens 16]
#        [--cost-token US] [--cost-decode US] [--kv-blocks N] [--system-len N]
#        [--worker-orch PATH]   (the workers' orch binary, e.g. another build's;
#                                the engines still come from DIR)
set -u
cd "$(dirname "$0")/.."
BUILD=build WORKERS=4 PROMPTS=16 QUESTIONS=32 CONC=32 MAXTOK=16
COST_TOKEN=200 COST_DECODE=2000 KV_BLOCKS=320 SYSLEN=600 WORKER_ORCH=
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --prompts) PROMPTS=$2; shift 2 ;;
    --questions) QUESTIONS=$2; shift 2 ;;
    --concurrency) CONC=$2; shift 2 ;;
    --max-tokens) MAXTOK=$2; shift 2 ;;
    --cost-token) COST_TOKEN=$2; shift 2 ;;
    --cost-decode) COST_DECODE=$2; shift 2 ;;
    --kv-blocks) KV_BLOCKS=$2; shift 2 ;;
    --system-len) SYSLEN=$2; shift 2 ;;
    --worker-orch) WORKER_ORCH=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench_route: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
ORCH=$BUILD/orch
[ -x "$ORCH" ] || { echo "bench_route: $ORCH not built (make)" >&2; exit 2; }
WORKER_ORCH=${WORKER_ORCH:-$ORCH}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$PWD/$BUILD}
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT

# wait_port LOG WORD: the port of "listening on http://H:P" once WORD is logged.
wait_port() {
  for _ in $(seq 1 600); do
    if grep -q "$2" "$1" 2>/dev/null; then
      grep -oE 'listening on http://[0-9.]+:[0-9]+' "$1" | head -n1 | sed -E 's/.*:([0-9]+)$/\1/'
      return 0
    fi
    sleep 0.05
  done
  cat "$1" >&2
  echo "bench_route: $1 did not start" >&2
  exit 1
}

run_policy() { # policy -> JSON line on stdout
  local policy=$1 args=() pids=() i port
  for i in $(seq 1 "$WORKERS"); do
    "$WORKER_ORCH" serve --engine=mock --port 0 --kv-blocks "$KV_BLOCKS" \
      --engine-options "cost_us_per_token=$COST_TOKEN,cost_us_per_decode=$COST_DECODE" \
      2>"$T/$policy-w$i.log" &
    pids+=($!); PIDS+=($!)
  done
  for i in $(seq 1 "$WORKERS"); do
    port=$(wait_port "$T/$policy-w$i.log" 'orch serve: ready')
    args+=(--worker "http://127.0.0.1:$port")
  done
  "$ORCH" route --port 0 --policy "$policy" "${args[@]}" 2>"$T/$policy-r.log" &
  pids+=($!); PIDS+=($!)
  port=$(wait_port "$T/$policy-r.log" 'orch route: ready')
  python3 tools/bench_route.py "$port" --prompts "$PROMPTS" --questions "$QUESTIONS" \
    --concurrency "$CONC" --max-tokens "$MAXTOK" --system-len "$SYSLEN"
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}

echo "bench_route: $WORKERS mock replicas (cost_us_per_token=$COST_TOKEN, cost_us_per_decode=$COST_DECODE, kv-blocks $KV_BLOCKS), $PROMPTS system prompts x $QUESTIONS questions, concurrency $CONC, $MAXTOK tokens out"
"$WORKER_ORCH" --version | sed 's/^/workers: /'
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), $(nproc) CPUs"
CA=$(run_policy cache_aware) || exit 1
RR=$(run_policy round_robin) || exit 1
echo "cache_aware: $CA"
echo "round_robin: $RR"
python3 - "$CA" "$RR" <<'PY'
import json, sys
ca, rr = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name, r in (("cache_aware", ca), ("round_robin", rr)):
    hr = "unavailable (workers send no usage.prompt_tokens_details.cached_tokens)" if r["hit_rate"] is None else "%.1f%%" % (100 * r["hit_rate"])
    print("%-12s %7.2f req/s  %8.1f tok/s  p50 %.3f s  hit rate %s  (%d/%d ok)" % (
        name, r["req_per_s"], r["completion_tok_per_s"], r["p50_s"], hr, r["ok"], r["requests"]))
print("throughput cache_aware / round_robin: %.2fx (goal >= 1.5x)" % (ca["req_per_s"] / rr["req_per_s"]))
if ca["hit_rate"] is None or rr["hit_rate"] is None:
    print("hit rate cache_aware / round_robin: unavailable")
elif rr["hit_rate"] == 0:
    print("hit rate cache_aware / round_robin: %.1f%% vs 0%% (goal >= 2x)" % (100 * ca["hit_rate"]))
else:
    print("hit rate cache_aware / round_robin: %.2fx (goal >= 2x)" % (ca["hit_rate"] / rr["hit_rate"]))
PY
