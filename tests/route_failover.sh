#!/usr/bin/env bash
# route_failover.sh - a worker killed (SIGKILL) while orch route has
# streaming and non-streaming requests in flight on it: no request that had
# not started streaming is lost (they are retried on the other worker and
# answer in full, the exact greedy text), the streams it was serving end
# with one clean error event and [DONE], the others finish; the dead worker
# is taken out (worker_up 0) and later requests all succeed.
# (tests/route/failover_checks.py)
source "$(dirname "$0")/route/common.sh"

COST=cost_us_per_token=100,cost_us_per_decode=5000
start_server a --engine-options "$COST"; P_A=$PORT
start_server b --engine-options "$COST"; P_B=$PORT; PID_B=$PID
start_router r --worker "http://127.0.0.1:$P_A" --worker "http://127.0.0.1:$P_B" \
  --policy round_robin --health-interval-s 0.2
R=$PORT
"$PY" "$ROUTE_DIR/failover_checks.py" "$R" "$P_A" "$P_B" "$PID_B" || fail "failover checks"
echo "route_failover: ok"
