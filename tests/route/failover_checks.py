"""failover_checks.py - a worker killed mid-run behind orch route (driven by
tests/route_failover.sh). argv: router port, worker ports a b, pid of b."""
import json
import os
import signal
import sys
import threading
import time

import client
from client import check

R, A, B, PID_B = map(int, sys.argv[1:5])
N_TOK = 30
results = {}


def plain(i):
    p = "plain request %d" % i
    st, js, _ = client.post(R, "/v1/completions", {"prompt": p, "max_tokens": N_TOK, "temperature": 0}, timeout=60)
    results[("plain", i)] = (st, js, p)


def streamed(i):
    p = "streamed request %d" % i
    st, hd, events = client.stream(R, "/v1/completions", {"prompt": p, "max_tokens": N_TOK, "temperature": 0,
                                                          "stream": True}, timeout=60)
    results[("stream", i)] = (st, events, p)


threads = []
for i in range(6):  # round robin: s p p s s p ... puts both kinds on a and b
    pair = [threading.Thread(target=streamed, args=(i,)), threading.Thread(target=plain, args=(i,))]
    threads += pair if i % 2 == 0 else pair[::-1]
for t in threads:
    t.start()
    time.sleep(0.02)
time.sleep(0.35)
check(client.metrics(R).get('orch_route_worker_load{worker="http://127.0.0.1:%d"}' % B, 0) > 0,
      "nothing was in flight on b when it was killed")
os.kill(PID_B, signal.SIGKILL)
for t in threads:
    t.join()

for i in range(6):
    st, js, p = results[("plain", i)]
    check(st == 200, "plain request %d lost: %d %s" % (i, st, js))
    check(js["choices"][0]["text"] == client.greedy(p, N_TOK), "plain %d text" % i)
complete = cut = 0
for i in range(6):
    st, events, p = results[("stream", i)]
    check(st == 200 and events and events[-1] == "[DONE]", "stream %d end: %s" % (i, events[-2:]))
    body = events[:-1]
    errs = [e for e in body if "error" in e]
    text = "".join(e["choices"][0]["text"] for e in body if "choices" in e and e["choices"])
    if errs:
        check(len(errs) == 1 and body[-1] is errs[0], "stream %d: one error event, last" % i)
        check(errs[0]["error"]["code"] == "worker_failed", "stream %d error: %s" % (i, errs[0]))
        check(client.greedy(p, N_TOK).startswith(text), "stream %d partial text" % i)
        cut += 1
    else:
        check(text == client.greedy(p, N_TOK), "stream %d text %r" % (i, text))
        complete += 1
check(cut >= 1 and complete >= 1, "streams: %d complete, %d cut" % (complete, cut))
m = client.metrics(R)
check(m.get("orch_route_retries_total", 0) >= 1, "no retry counted")
check(m.get("orch_route_stream_errors_total", 0) == cut, "stream errors counted")
check(m.get('orch_route_worker_up{worker="http://127.0.0.1:%d"}' % B) == 0, "b still up")
for i in range(6):
    st, js, _ = client.post(R, "/v1/completions", {"prompt": "after %d" % i, "max_tokens": 2})
    check(st == 200, "request after the kill: %d %s" % (st, js))
st, _, data = client.request(R, "GET", "/health")
check(st == 200 and json.loads(data)["workers_up"] == 1, "health after the kill: %s" % data)
# a client that goes away: the router cancels its transfer, the worker frees it
gone = 'orch_client_disconnects_total'
before = client.metrics(A).get(gone, 0)
for path, extra in (("/v1/completions", {}), ("/v1/completions", {"stream": True})):
    body = json.dumps(dict({"prompt": "abandoned", "max_tokens": 400, "ignore_eos": True}, **extra)).encode()
    s = client.raw_post(R, path, body)
    time.sleep(0.3)
    s.close()
    before += 1
    client.wait_for(lambda: client.metrics(A).get(gone, 0) >= before, 10, "the worker to see the disconnect")
check(client.metrics(A).get('orch_requests_running', 0) == 0, "abandoned request still running")
print("failover checks: ok (%d streams complete, %d cut, %d retries)" % (complete, cut, m["orch_route_retries_total"]))
