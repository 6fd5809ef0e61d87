#!/usr/bin/env bash
# route_failover.sh - a worker killed (SIGKILL) while orch route has
# streaming and non-streaming requests in flight on it: no request that had
# not started streaming is lost (they are retried on the other worker and
# answer in full, the exact greedy text), the streams it was serving end
# with one clean error event and [DONE], the others finish; the dead worker
# is taken out (worker_up 0) and later requests all succeed; a client that
# leaves cancels its request on the worker; SIGTERM lets a stream finish.
# (tests/route/failover_checks.py)
source "$(dirname "$0")/route/common.sh"

COST=cost_us_per_token=100,cost_us_per_decode=5000
start_server a --engine-options "$COST"; P_A=$PORT
start_server b --engine-options "$COST"; P_B=$PORT; PID_B=$PID
start_router r --worker "http://127.0.0.1:$P_A" --worker "http://127.0.0.1:$P_B" \
  --policy round_robin --health-interval-s 0.2
R=$PORT; R_PID=$PID
"$PY" "$ROUTE_DIR/failover_checks.py" "$R" "$P_A" "$P_B" "$PID_B" || fail "failover checks"
# SIGTERM drains: a stream in progress finishes in full, then exit 0
"$PY" - "$R" >"$T/drain.out" 2>&1 <<'PY' &
import sys, client
st, hd, ev = client.stream(int(sys.argv[1]), "/v1/completions",
                           {"prompt": "drain me", "max_tokens": 80, "temperature": 0, "stream": True})
text = "".join(e["choices"][0]["text"] for e in ev[:-1] if e.get("choices"))
assert st == 200 and ev[-1] == "[DONE]" and text == client.greedy("drain me", 80), (st, ev[-3:])
print("drained stream ok")
PY
DRAIN_PID=$!
sleep 0.3
stop_server "$R_PID" || fail "router exit status $? after SIGTERM"
wait "$DRAIN_PID" || { cat "$T/drain.out"; fail "stream cut by the drain"; }
grep -q 'orch route: draining' "$T/r.log" || fail "no drain line"
echo "route_failover: ok"
