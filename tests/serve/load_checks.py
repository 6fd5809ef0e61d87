"""load_checks.py SCENARIO PORT - scheduler behaviour seen over HTTP on the
mock engine (started by tests/serve_load.sh with matching options)."""
import json
import socket
import sys
import threading
import time

from client import check, greedy, metrics, post, raw_post, request, stream, wait_for

scenario, port = sys.argv[1], int(sys.argv[2])
C = "/v1/completions"


def preemption():
    # --kv-blocks 64 --max-seqs 16: 16 sequences of 40 + 300 tokens need
    # 16 x 22 blocks; the pool holds 64, so the newest get preempted.
    res = {}

    def one(i):
        prompt = "preempt %02d " % i + "p" * 28
        if i % 2:
            st, _, ev = stream(port, C, {"prompt": prompt, "max_tokens": 300, "temperature": 0, "stream": True})
            res[i] = (st, "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]"), greedy(prompt, 300))
        else:
            st, js, _ = post(port, C, {"prompt": prompt, "max_tokens": 300, "temperature": 0})
            res[i] = (st, js["choices"][0]["text"] if st == 200 else js, greedy(prompt, 300))

    ths = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    for i in range(16):
        st, got, want = res[i]
        check(st == 200 and got == want, "request %d after preemption: %s" % (i, str(got)[:80]))
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0, 5, "the pool to drain")
    m = metrics(port)
    check(m["orch_preemptions_total"] > 0, "no preemption counted")
    check(m["orch_kv_blocks_used"] == 0 and m["orch_kv_blocks_capacity"] == 64, "pool not empty afterwards")
    print("preemptions:", m["orch_preemptions_total"])


def cancellation():
    # sleep_ms=20 per iteration: requests run for seconds unless cancelled.
    base = metrics(port).get("orch_client_disconnects_total", 0)
    # streaming client reads two events and disconnects
    s = raw_post(port, C, json.dumps({"prompt": "cancel me", "max_tokens": 900, "stream": True,
                                      "temperature": 0}).encode())
    buf = b""
    while buf.count(b"data: ") < 2:
        d = s.recv(4096)
        check(d, "stream ended early")
        buf += d
    check(metrics(port)["orch_kv_blocks_used"] > 0, "blocks held while streaming")
    s.close()
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0, 5, "blocks freed after a stream disconnect")
    m = metrics(port)
    check(m["orch_requests_running"] == 0, "nothing running")
    check(m["orch_client_disconnects_total"] >= base + 1, "disconnect counted")
    # a non-streaming client (its connection is suspended) disconnects
    s = raw_post(port, C, json.dumps({"prompt": "cancel me too", "max_tokens": 900, "temperature": 0}).encode())
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] > 0, 5, "the request to start")
    s.close()
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0, 5, "blocks freed after a disconnect")
    check(metrics(port)["orch_client_disconnects_total"] >= base + 2, "second disconnect counted")
    # a waiting (not yet running) request that disconnects leaves the queue
    st, js, _ = post(port, C, {"prompt": "still fine", "max_tokens": 3, "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == greedy("still fine", 3), "server still serves")
    print("cancellation ok")


def queue_full():
    # --max-seqs 1 --max-waiting 1, sleep_ms=20
    a = raw_post(port, C, json.dumps({"prompt": "first", "max_tokens": 400, "temperature": 0}).encode())
    wait_for(lambda: metrics(port)["orch_requests_running"] == 1, 5, "first running")
    b = raw_post(port, C, json.dumps({"prompt": "second", "max_tokens": 400, "temperature": 0}).encode())
    wait_for(lambda: metrics(port)["orch_requests_waiting"] == 1, 5, "second waiting")
    st, js, hd = post(port, C, {"prompt": "third", "max_tokens": 5})
    check(st == 429, "third request: %d %s" % (st, js))
    check(hd.get("retry-after") == "1", "429 without Retry-After: %s" % hd)
    check(js["error"]["code"] == "queue_full" and js["error"]["type"] == "rate_limit_error", "429 body %s" % js)
    m = metrics(port)
    check(m['orch_requests_total{endpoint="/v1/completions",status="429"}'] == 1, "429 counted")
    a.close()
    b.close()
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0 and metrics(port)["orch_requests_waiting"] == 0, 5,
             "queue drained after disconnects")
    st, js, _ = post(port, C, {"prompt": "fourth", "max_tokens": 2, "temperature": 0})
    check(st == 200, "accepted again")
    print("queue full ok")


def engine_fault():
    # ORCH_MOCK_FAULT=infer_forward:4 (call 1 is the warm-up)
    st, js, _ = post(port, C, {"prompt": "boom", "max_tokens": 10, "temperature": 0})
    check(st == 500 and js["error"]["type"] == "server_error" and "injected fault" in js["error"]["message"],
          "engine error -> 500: %d %s" % (st, js))
    st, js, _ = post(port, C, {"prompt": "after", "max_tokens": 4, "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == greedy("after", 4), "server survives an engine error")
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0, 5, "the pool to drain")
    m = metrics(port)
    check(m["orch_engine_errors_total"] == 1 and m["orch_kv_blocks_used"] == 0, "error counted, blocks freed")
    print("engine fault ok")


def stream_fault():
    # ORCH_MOCK_FAULT=infer_forward:4: a stream gets an error event, then [DONE]
    st, _, ev = stream(port, C, {"prompt": "boom", "max_tokens": 10, "temperature": 0, "stream": True})
    check(st == 200 and ev[-1] == "[DONE]" and "error" in ev[-2], "stream error event: %s" % ev)
    check(ev[-2]["error"]["code"] is None and "injected fault" in ev[-2]["error"]["message"], "error event body")
    print("stream fault ok")


def loading():
    # sleep_ms=1500: the warm-up forward keeps the server loading
    st, _, body = request(port, "GET", "/health")
    check(st == 503 and json.loads(body) == {"status": "loading"}, "health while loading: %d %s" % (st, body))
    st, js, hd = post(port, C, {"prompt": "early", "max_tokens": 1})
    check(st == 503 and js["error"]["code"] == "model_loading", "request while loading: %d %s" % (st, js))
    check(hd.get("retry-after") == "1", "503 without Retry-After: %s" % hd)
    print("loading ok")


globals()[scenario]()
