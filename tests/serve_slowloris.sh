#!/usr/bin/env bash
# serve_slowloris.sh - slow and many clients cannot take orch serve down
# (loopback only, bounded: about 30 s). 2,000 connections from 40 loopback
# addresses each send one byte a second (half trickle a request head, half a
# body after a complete head; build/tools/slowloris): /health keeps answering
# with p99 under 100 ms while they are held, and every one of them is closed
# by the head or body deadline although it never stops sending. Then
# (tests/serve/limit_checks.py): past --max-connections and past
# --max-connections-per-ip a connection is answered 503 at once with
# Retry-After; a kept-alive connection is closed after --idle-timeout-s, and
# one that trickles its next request head too.
source "$(dirname "$0")/serve/common.sh"
SLOW="${ORCH_BUILD:-$(dirname "$ORCH_BIN")}/tools/slowloris"
[ -x "$SLOW" ] || { echo "skip: $SLOW is not built"; exit 77; }
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null
[ "$(ulimit -n)" -ge 4500 ] || { echo "skip: the open-file limit $(ulimit -n) is below 4500"; exit 77; }
CONNS=2000 P99=100
# the sanitizer builds are several times slower: fewer connections, a wider bound
case "${ORCH_SAN:-0}" in 1 | thread) CONNS=1000 P99=250 ;; esac

start_server slow --header-timeout-s 3 --body-timeout-s 4 --idle-timeout-s 3
# head deadline 3 s after the connection, body 4 s after the head: all closed
# by about 7 s (the sweep runs every 100 ms)
"$SLOW" --port "$PORT" --conns "$CONNS" --sources 40 --interval-ms 1000 --hold-s 20 \
  --probes 50 --probe-gap-ms 60 --max-p99-ms "$P99" --expect-closed-s 10 >"$T/slow.out" 2>&1
rc=$?
cat "$T/slow.out"
[ "$rc" -eq 0 ] || fail "slow connections: /health too slow or connections not closed"
"$PY" - "$PORT" "$CONNS" <<'PYEOF' || fail "time-out counters"
import sys
from client import check, metrics
port, conns = int(sys.argv[1]), int(sys.argv[2])
m = metrics(port)
head = m['orch_http_connections_timed_out_total{phase="head"}']
body = m['orch_http_connections_timed_out_total{phase="body"}']
check(head >= conns // 2 and body >= conns // 2, "timed out: head %d body %d" % (head, body))
check(m['orch_requests_total{endpoint="/health",status="200"}'] >= 50, "probes counted")
PYEOF
stop_server "$PID" || fail "exit status after SIGTERM"

start_server limits --max-connections 40 --max-connections-per-ip 10 --idle-timeout-s 2
"$PY" "$SERVE_DIR/limit_checks.py" connection_limits "$PORT" || fail "connection limits"
stop_server "$PID" || fail "exit status after SIGTERM"
echo "serve_slowloris: ok"
