"""route_checks.py - orch route over real HTTP (driven by tests/route_api.sh).

argv: router ports main pass own fake, then worker ports w1 w2 w3 (model
lora-a) wk (API key wk) wnew (not in any set at start) fake.
"""
import http.client
import json
import re
import sys
import urllib.parse

import client
import fake_worker
from client import check, post, request, wait_for

R_MAIN, R_PASS, R_OWN, R_FAKE, W1, W2, W3, WK, WNEW, FAKE = map(int, sys.argv[1:11])


def raw(port, method, path, body=None, headers=None):
    """(status, headers, body bytes) with the body sent as given."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    hd = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    return r.status, hd, data


def norm(b):
    """Bytes with the per-request id, created time and cached-token count
    blanked (the second of two equal requests may find the first one's KV
    blocks in the worker's prefix cache)."""
    b = re.sub(rb'"id":"(cmpl|chatcmpl)-[0-9a-f]+"', b'"id":"X"', b)
    b = re.sub(rb'"cached_tokens":[0-9]+', b'"cached_tokens":0', b)
    return re.sub(rb'"created":[0-9]+', b'"created":0', b)


def worker_metric(port, name):
    return client.metrics(port).get(name, 0.0)


def workers(port):
    st, hd, data = request(port, "GET", "/workers")
    check(st == 200, "GET /workers: %d" % st)
    return {w["url"]: w for w in json.loads(data)["workers"]}


# ---- health and models ---------------------------------------------------
st, hd, data = request(R_MAIN, "GET", "/health")
js = json.loads(data)
check(st == 200 and js["status"] == "ok" and js["workers_up"] == 3, "health: %d %s" % (st, data))
st, hd, data = request(R_MAIN, "GET", "/v1/models")
ids = sorted(m["id"] for m in json.loads(data)["data"])
check(st == 200 and ids == ["lora-a", "mock-gpt2"], "models union: %s" % ids)
st, hd, data = request(R_MAIN, "GET", "/v1/models/lora-a")
check(st == 200 and json.loads(data)["id"] == "lora-a", "GET /v1/models/lora-a")
st, hd, data = request(R_MAIN, "GET", "/v1/models/nope")
check(st == 404 and json.loads(data)["error"]["code"] == "model_not_found", "unknown model id")

# ---- answers equal to direct ones ----------------------------------------
req = {"prompt": "hello router", "max_tokens": 8, "model": "mock-gpt2", "temperature": 0}
st, hd, via = raw(R_MAIN, "POST", "/v1/completions", req)
st2, hd2, direct = raw(W1, "POST", "/v1/completions", req)
check(st == 200 and st2 == 200, "completions: %d %d" % (st, st2))
check(norm(via) == norm(direct), "completion differs from a direct one:\n%s\n%s" % (via, direct))
check(json.loads(via)["choices"][0]["text"] == client.greedy("hello router", 8), "greedy text")
check(hd["content-type"] == hd2["content-type"], "content type passed on")
chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 5, "temperature": 0, "model": "mock-gpt2"}
st, _, via = raw(R_MAIN, "POST", "/v1/chat/completions", chat)
_, _, direct = raw(W2, "POST", "/v1/chat/completions", chat)
check(st == 200 and norm(via) == norm(direct), "chat differs: %s / %s" % (via, direct))
sreq = {"prompt": "stream me", "max_tokens": 6, "stream": True, "temperature": 0, "model": "mock-gpt2",
        "stream_options": {"include_usage": True}}
st, hd, via = raw(R_MAIN, "POST", "/v1/completions", sreq)
_, hd2, direct = raw(W1, "POST", "/v1/completions", sreq)
check(st == 200 and hd["content-type"] == "text/event-stream", "stream head: %d %s" % (st, hd))
check(norm(via) == norm(direct), "stream differs from a direct one:\n%s\n%s" % (via, direct))
check(via.endswith(b"data: [DONE]\n\n"), "stream ends with [DONE]")
st, _, via = raw(R_MAIN, "POST", "/tokenize", {"prompt": "abc"})
_, _, direct = raw(W1, "POST", "/tokenize", {"prompt": "abc"})
check(st == 200 and via == direct, "tokenize: %s / %s" % (via, direct))

# ---- byte-identical passthrough from the fake worker ---------------------
st, hd, via = raw(R_FAKE, "POST", "/v1/completions", {"prompt": "x", "stream": True})
check(st == 200 and via == fake_worker.STREAM, "fake stream not byte-identical:\n%r\n%r" % (via, fake_worker.STREAM))
check(hd.get("cache-control") == "no-cache", "Cache-Control passed on")
st, hd, via = raw(R_FAKE, "POST", "/v1/completions", {"prompt": "x"})
check(st == 418 and via == fake_worker.BODY and hd.get("retry-after") == "7",
      "worker status/body/headers untouched: %d %s %s" % (st, hd, via))
# a client that does not read: the worker's transfer is paused, nothing lost
import time
body = json.dumps({"prompt": "big", "stream": True}).encode()
s = client.raw_post(R_FAKE, "/v1/completions", body)
time.sleep(1.5)
got = b""
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    got += chunk
    if got.endswith(b"0\r\n\r\n"):
        break
s.close()
head, _, rest = got.partition(b"\r\n\r\n")
check(head.startswith(b"HTTP/1.1 200"), "big stream status: %r" % head[:40])
payload, pos = b"", 0
while True:  # de-chunk
    nl = rest.index(b"\r\n", pos)
    size = int(rest[pos:nl], 16)
    if size == 0:
        break
    payload += rest[nl + 2:nl + 2 + size]
    pos = nl + 2 + size + 2
check(payload == fake_worker.BIG, "big stream not byte-identical (%d of %d bytes)" % (len(payload), len(fake_worker.BIG)))
check(client.metrics(R_FAKE).get("orch_route_backpressure_pauses_total", 0) >= 1, "no back-pressure pause")
# cut mid-stream: the complete events, then one clean error event and [DONE]
st, hd, via = raw(R_FAKE, "POST", "/v1/completions", {"prompt": "cut", "stream": True})
head = fake_worker.EVENTS[0] + fake_worker.EVENTS[1]
check(st == 200 and via.startswith(head), "cut stream head: %r" % via)
rest = via[len(head):].split(b"\n\n")
check(len(rest) == 3 and rest[1] == b"data: [DONE]" and rest[2] == b"", "cut stream tail: %r" % via)
err = json.loads(rest[0][len(b"data: "):])["error"]
check(err["code"] == "worker_failed" and err["type"] == "server_error", "error event: %s" % err)
m = client.metrics(R_FAKE)
check(m.get("orch_route_stream_errors_total") == 1, "stream error counted")

# ---- errors passed on untouched ------------------------------------------
for body in ({"prompt": "x", "max_tokens": -1},
             '{"prompt": ', {"prompt": "x", "frobnicate": 1}):
    st, _, via = raw(R_MAIN, "POST", "/v1/completions", body)
    st2, _, direct = raw(W1, "POST", "/v1/completions", body)
    check(st == st2 and st >= 400 and via == direct, "error differs for %r: %d %s / %d %s" % (body, st, via, st2, direct))

# ---- the router's own checks ---------------------------------------------
def err_code(port, method, path, body=None, headers=None):
    st, hd, data = raw(port, method, path, body, headers)
    try:
        return st, json.loads(data)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return st, None

check(err_code(R_MAIN, "GET", "/nope") == (404, "not_found"), "404 route")
check(err_code(R_MAIN, "POST", "/v1/completions", {"prompt": "x", "model": "nope"}) ==
      (404, "model_not_found"), "a model no worker serves")
check(err_code(R_MAIN, "GET", "/v1/completions") == (405, "method_not_allowed"), "405")
check(err_code(R_MAIN, "POST", "/v1/completions", "{}", {"Content-Type": "text/plain"}) ==
      (415, "unsupported_media_type"), "415")
check(err_code(R_MAIN, "POST", "/v1/completions", {"prompt": "x" * 5000}) ==
      (413, "request_too_large"), "413")
check(err_code(R_MAIN, "GET", "/health", None, {"Host": "evil.example"}) ==
      (403, "host_not_allowed"), "403 host")
check(err_code(R_MAIN, "DELETE", "/workers", None) == (405, "method_not_allowed"), "405 /workers")
# own key: checked by the router, the worker gets its own key
check(err_code(R_OWN, "POST", "/v1/completions", {"prompt": "x"}) == (401, "invalid_api_key"), "own key 401")
check(err_code(R_OWN, "GET", "/workers") == (401, "invalid_api_key"), "own key on /workers")
st, _, _ = raw(R_OWN, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2},
               {"Authorization": "Bearer rk"})
check(st == 200, "own key 200: %d" % st)
# passthrough: the worker decides, its 401 is passed on
st, _, via = raw(R_PASS, "POST", "/v1/completions", {"prompt": "x"})
st2, _, direct = raw(WK, "POST", "/v1/completions", {"prompt": "x"})
check(st == 401 and via == direct, "passthrough 401: %d %s" % (st, via))
st, _, _ = raw(R_PASS, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2},
               {"Authorization": "Bearer wk"})
check(st == 200, "passthrough with the key: %d" % st)

# ---- routing by model ----------------------------------------------------
for i in range(6):
    st, js, _ = post(R_MAIN, "/v1/completions", {"prompt": "q%d" % i, "max_tokens": 2, "model": "lora-a"})
    check(st == 200 and js["model"] == "lora-a", "lora-a request: %d %s" % (st, js))
    st, js, _ = post(R_MAIN, "/v1/completions", {"prompt": "q%d" % i, "max_tokens": 2, "model": "mock-gpt2"})
    check(st == 200 and js["model"] == "mock-gpt2", "base request: %d %s" % (st, js))

# ---- cache-aware: one system prompt sticks to one worker -----------------
before = {u: w["requests"] for u, w in workers(R_MAIN).items()}
system = "You are a router test. " * 20
for i in range(6):
    st, js, _ = post(R_MAIN, "/v1/chat/completions", {"messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "question %d" % i}],
        "max_tokens": 2})
    check(st == 200, "chat %d" % i)
after = {u: w["requests"] for u, w in workers(R_MAIN).items()}
deltas = sorted(after[u] - before.get(u, 0) for u in after)
check(deltas[-1] == 6 and sum(deltas) == 6, "a shared prefix went to several workers: %s" % deltas)

# ---- workers added and removed at run time -------------------------------
new_url = "http://127.0.0.1:%d" % WNEW
st, hd, data = raw(R_MAIN, "POST", "/workers", {"url": new_url})
check(st == 201 and json.loads(data) == {"url": new_url, "added": True}, "add: %d %s" % (st, data))
st, _, data = raw(R_MAIN, "POST", "/workers", {"url": new_url + "/"})
check(st == 200 and json.loads(data)["added"] is False, "add again: %d %s" % (st, data))
check(err_code(R_MAIN, "POST", "/workers", {"url": "localhost:1"}) == (400, "invalid_worker"), "bad url")
check(err_code(R_MAIN, "POST", "/workers", {"url": new_url, "weight": 2}) == (400, "unknown_field"), "unknown field")
wait_for(lambda: workers(R_MAIN)[new_url]["up"], 10, "the new worker to be up")
served = lambda: worker_metric(WNEW, 'orch_requests_total{endpoint="/v1/completions",status="200"}')
check(served() == 0, "new worker served before it was added")
for i in range(8):  # new prompts go to the smallest tree: the new worker's
    st, _, _ = raw(R_MAIN, "POST", "/v1/completions", {"prompt": "fresh prompt %d " % i * 3, "max_tokens": 2})
    check(st == 200, "request %d after add" % i)
check(served() >= 1, "the added worker got no traffic")
m = client.metrics(R_MAIN)
check(m.get('orch_route_requests_total{worker="%s"}' % new_url, 0) == served(), "per-worker count")
st, _, data = raw(R_MAIN, "DELETE", "/workers/" + urllib.parse.quote(new_url, safe=""))
check(st == 200 and json.loads(data)["removed"] is True, "delete: %d %s" % (st, data))
st, _, _ = raw(R_MAIN, "DELETE", "/workers/" + new_url)
check(st == 404, "delete again: %d" % st)
n = served()
for i in range(8):
    st, _, _ = raw(R_MAIN, "POST", "/v1/completions", {"prompt": "later prompt %d " % i * 3, "max_tokens": 2})
    check(st == 200, "request %d after delete" % i)
check(served() == n, "a removed worker still got traffic")
check(new_url not in workers(R_MAIN), "removed worker listed")

# ---- metrics -------------------------------------------------------------
m = client.metrics(R_MAIN)
check(m.get('orch_route_worker_up{worker="http://127.0.0.1:%d"}' % W1) == 1, "worker up gauge")
check(m.get("orch_route_cache_match_ratio_count", 0) > 20, "match ratio histogram")
check(m.get('orch_route_http_requests_total{endpoint="/v1/completions",status="200"}', 0) > 10, "http counts")
check(m.get("orch_route_retries_total") == 0, "no retries without failures")
print("route checks: ok")
