"""limit_checks.py SCENARIO PORT - orch serve's defences against hostile or
careless clients, over real sockets (started by tests/serve_slowloris.sh and
tests/serve_hardening.sh with matching options):

connection_limits  (--max-connections 40 --max-connections-per-ip 10
                   --idle-timeout-s 2) 503 at once past either limit, the
                   place freed by a close, keep-alive idle deadline
body_memory        (--max-body-memory-mib 1 --max-body 600000) bodies in
                   flight share 1 MiB: 503 + Retry-After past it, before the
                   body is read (and after a chunked one), free again later
big_prompts        (defaults) /health stays fast while 4 MB prompts are
                   parsed and refused
headers            (--cors-origin http://app.example --allowed-host
                   api.example --max-seqs 1 --max-waiting 4, mock sleep_ms)
                   Host, Content-Type, CORS, strict JSON, Content-Length
                   framing, n against --max-waiting, Retry-After on 429
"""
import http.client
import json
import socket
import sys
import threading
import time

from client import check, greedy, metrics, post, raw_post, request, wait_for

scenario, port = sys.argv[1], int(sys.argv[2])
C = "/v1/completions"


def conn_from(src, timeout=5):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind(("127.0.0.%d" % src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_until_close(s, limit=10.0):
    s.settimeout(limit)
    data = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    except (socket.timeout, ConnectionResetError):
        pass
    return data


def one_response(s):
    """Read one HTTP response with Content-Length from s; returns (status,
    headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        d = s.recv(65536)
        check(d, "closed before the answer: %r" % data)
        data += d
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hd = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        hd[k.strip().lower()] = v.strip()
    n = int(hd.get("content-length", "0"))
    while len(body) < n:
        d = s.recv(65536)
        check(d, "closed inside the body")
        body += d
    return int(lines[0].split()[1]), hd, body[:n]


def wait_closed_by_server(s, limit=5.0):
    """After the EOF of s: wait until the server has closed its socket, not
    only shut down its sending side. A byte sent then is answered with a
    reset; the server forgets the connection before it closes it."""
    end = time.time() + limit
    s.settimeout(0.05)
    while time.time() < end:
        try:
            s.send(b"\0")
            s.recv(1)  # b"" (the EOF) until the reset
            time.sleep(0.01)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return
    raise AssertionError("the server did not close the connection")


def raw(data, src=1, timeout=10):
    s = conn_from(src, timeout)
    s.sendall(data)
    out = read_until_close(s, timeout)
    s.close()
    return out


def status_of(resp):
    return int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/1.") else None


def refused(s, code):
    t0 = time.time()
    resp = read_until_close(s, 3)
    dt = time.time() - t0
    check(resp.startswith(b"HTTP/1.1 503 "), "expected 503, got %r" % resp[:100])
    check(b"\r\nRetry-After: 1\r\n" in resp and (b'"code":"%s"' % code.encode()) in resp,
          "503 body/headers: %r" % resp)
    check(dt < 1.0, "the 503 took %.2f s" % dt)


# ---------------------------------------------------------------------------
def connection_limits():
    held = [conn_from(2) for _ in range(10)]
    s = conn_from(2)  # the 11th from 127.0.0.2
    refused(s, "too_many_connections_per_ip")
    s.close()
    s = conn_from(1)  # 127.0.0.1 still has room
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    resp = read_until_close(s, 5)
    check(status_of(resp) == 200, "health from another address: %r" % resp[:100])
    # it counts until the server has closed it (after the EOF seen above);
    # the held ones below must not race it for the 40th place
    wait_closed_by_server(s)
    s.close()
    for src in (3, 4, 5):
        held += [conn_from(src) for _ in range(10)]
    time.sleep(0.2)  # let every one be accepted
    s = conn_from(6)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    refused(s, "too_many_connections")  # fast, not a hang in the backlog
    s.close()
    for h in held:
        h.close()
    wait_for(lambda: request(port, "GET", "/health")[0] == 200, 3, "places to be freed")
    m = metrics(port)
    check(m['orch_http_connections_refused_total{reason="max_per_ip"}'] == 1, "per-ip counter")
    # >= 1: a /health probe of wait_for may itself be refused while the held
    # sockets are still being closed.
    check(m['orch_http_connections_refused_total{reason="max_connections"}'] >= 1, "total counter")

    # keep-alive: closed --idle-timeout-s (2) after the answer, without a word
    s = conn_from(1)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    st, hd, body = one_response(s)
    check(st == 200, "keep-alive request")
    t0 = time.time()
    rest = read_until_close(s, 6)
    dt = time.time() - t0
    check(rest == b"" and 1.5 < dt < 3.5, "idle close after %.2f s (%r)" % (dt, rest))
    s.close()
    # ... also when the next head trickles in: the deadline is not extended
    s = conn_from(1)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    one_response(s)
    t0 = time.time()
    closed_at = None
    for ch in b"GET /health HTTP/1.1\r\n":
        try:
            s.send(bytes([ch]))
        except OSError:
            closed_at = time.time() - t0
            break
        s.settimeout(0.4)
        try:
            if s.recv(4096) == b"":
                closed_at = time.time() - t0
                break
        except socket.timeout:
            pass
    check(closed_at is not None and closed_at < 3.5, "trickled keep-alive head not cut: %s" % closed_at)
    s.close()
    print("connection limits ok")


# ---------------------------------------------------------------------------
def post_head(s, length, chunked=False):
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
              (b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % length) + b"\r\n")


def body_memory():
    a, b = conn_from(1), conn_from(1)
    post_head(a, 500000)
    a.sendall(b'{"prompt":"' + b"a" * 1000)
    post_head(b, 500000)
    b.sendall(b'{"prompt":"' + b"b" * 1000)
    time.sleep(0.2)
    c = conn_from(1)
    t0 = time.time()
    post_head(c, 500000)  # 3 x 500001 bytes > 1 MiB: refused before its body
    st, hd, body = one_response(c)
    dt = time.time() - t0
    js = json.loads(body)
    check(st == 503 and js["error"]["code"] == "server_busy" and hd.get("retry-after") == "1",
          "third body: %d %s %s" % (st, hd, js))
    check(dt < 1.0, "503 took %.2f s" % dt)
    c.close()
    # a chunked body grows into the cap: 503 once it is complete
    d = conn_from(1)
    post_head(d, 0, chunked=True)
    chunk = b'{"prompt":"' + b"c" * 550000 + b'"}'
    d.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n")
    st, hd, body = one_response(d)
    check(st == 503 and json.loads(body)["error"]["code"] == "server_busy" and hd.get("retry-after") == "1",
          "chunked body over the cap: %d %s" % (st, body))
    d.close()
    # bodies that end give their memory back
    a.close()
    big = json.dumps({"prompt": "z" * 499000, "max_tokens": 1}).encode()

    def fits():
        st, js, _ = post(port, C, big)
        return st == 400 and js["error"]["code"] == "context_length_exceeded"
    wait_for(fits, 3, "the closed body's memory to be released")
    b.close()
    st, js, _ = post(port, C, {"prompt": "ab", "max_tokens": 3, "temperature": 0})
    check(st == 200 and js["choices"][0]["text"] == greedy("ab", 3), "normal request after")
    print("body memory ok")


# ---------------------------------------------------------------------------
def big_prompts():
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 100.0
    n = (4 << 20) - 200
    bodies = [
        (C, json.dumps({"prompt": "a" * (n - 40), "max_tokens": 1}).encode()),
        (C, json.dumps({"prompt": [97] * (n // 3 - 30), "max_tokens": 1}, separators=(",", ":")).encode()),
        ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "b" * 1000}] * 3900,
                                             "max_tokens": 1}).encode()),
    ]
    for path, body in bodies:
        check(len(body) <= 4 << 20, "body of %d bytes" % len(body))
    stop = []
    answers = []

    def load(i):
        path, body = bodies[i % len(bodies)]
        while not stop:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            js = json.loads(r.read())
            c.close()
            answers.append((r.status, js["error"]["code"] if r.status != 200 else None))

    ths = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in ths:
        t.start()
    wait_for(lambda: len(answers) >= 1, 30, "the first big answer")
    lat = []
    for _ in range(50):
        t0 = time.time()
        st, _, _ = request(port, "GET", "/health", timeout=10)
        lat.append((time.time() - t0) * 1000)
        check(st == 200, "health %d" % st)
        time.sleep(0.03)
    stop.append(1)
    for t in ths:
        t.join()
    lat.sort()
    print("health with 4 MB prompts in flight: p50 %.1f ms, p99 %.1f ms (%d big requests)" %
          (lat[24], lat[49], len(answers)))
    check(all(a == (400, "context_length_exceeded") for a in answers), "answers %s" % set(answers))
    check(lat[49] < limit, "/health p99 %.1f ms" % lat[49])


# ---------------------------------------------------------------------------
def err_of(st, js, status, code, param=None):
    check(st == status and js["error"]["code"] == code and js["error"]["param"] == param,
          "expected %d %s %s, got %d %s" % (status, code, param, st, js))


def headers():
    ok = {"prompt": "ab", "max_tokens": 2, "temperature": 0}
    # Host (bound to 127.0.0.1)
    for h in ["localhost", "localhost:%d" % port, "127.0.0.1:1", "[::1]:8080", "LocalHost", "api.example:443"]:
        st, js, _ = post(port, C, ok, headers={"Host": h})
        check(st == 200, "Host %s: %d %s" % (h, st, js))
    for h in ["evil.example", "evil.example:%d" % port, "localhost.evil.example", "127.0.0.2"]:
        st, js, _ = post(port, C, ok, headers={"Host": h})
        err_of(st, js, 403, "host_not_allowed")
        st, _, body = request(port, "GET", "/health", headers={"Host": h})
        check(st == 403, "health with Host %s: %d" % (h, st))
    resp = raw(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    check(status_of(resp) == 400 and b'"invalid_host"' in resp, "no Host in HTTP/1.1: %r" % resp[:200])
    resp = raw(b"GET /health HTTP/1.0\r\n\r\n")
    check(status_of(resp) == 200, "no Host in HTTP/1.0: %r" % resp[:200])
    # Content-Type of JSON routes
    body = json.dumps(ok)
    for ct, want in [("text/plain", 415), ("application/x-www-form-urlencoded", 415),
                     ("application/jsonx", 415), ("application/json; charset=utf-8", 200),
                     ("Application/JSON", 200)]:
        st, hd, data = request(port, "POST", C, body, headers={"Content-Type": ct})
        check(st == want, "Content-Type %s: %d %s" % (ct, st, data))
        if want == 415:
            err_of(st, json.loads(data), 415, "unsupported_media_type")
    resp = raw(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body.encode())
    check(status_of(resp) == 415, "no Content-Type: %r" % resp[:100])
    # CORS
    st, js, hd = post(port, C, ok, headers={"Origin": "http://app.example"})
    check(st == 200 and hd.get("access-control-allow-origin") == "http://app.example" and hd.get("vary") == "Origin",
          "CORS for the allowed origin: %s" % hd)
    st, js, hd = post(port, C, ok, headers={"Origin": "http://evil.example"})
    check(st == 200 and "access-control-allow-origin" not in hd, "no CORS for another origin: %s" % hd)
    pre = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type, authorization"}
    st, hd, data = request(port, "OPTIONS", C, headers=pre)
    check(st == 204 and hd.get("access-control-allow-origin") == "http://app.example" and
          "POST" in hd.get("access-control-allow-methods", "") and
          "Content-Type" in hd.get("access-control-allow-headers", ""), "preflight: %d %s" % (st, hd))
    pre["Origin"] = "http://evil.example"
    st, hd, data = request(port, "OPTIONS", C, headers=pre)
    check(st == 405 and "access-control-allow-origin" not in hd, "preflight of another origin: %d %s" % (st, hd))
    # strict JSON over HTTP
    st, _, data = request(port, "POST", C, b'{"prompt":"a","model":"mock-gpt2","model":"x"}')
    err_of(st, json.loads(data), 400, "duplicate_key", "model")
    st, _, data = request(port, "POST", C, b'{"prompt":"a","max_tokens":1} trailing')
    err_of(st, json.loads(data), 400, "invalid_json")
    st, _, data = request(port, "POST", C, b'{"prompt":"a\\u0000b","max_tokens":1}')
    js = json.loads(data)
    err_of(st, js, 400, "invalid_value", "prompt")
    check("NUL" in js["error"]["message"], "NUL message %s" % js)
    st, _, data = request(port, "POST", "/v1/chat/completions",
                          b'{"messages":[{"role":"user","content":"x","content":"y"}]}')
    err_of(st, json.loads(data), 400, "duplicate_key", "messages")
    # Content-Length framing
    b = json.dumps(ok).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    resp = raw(head + b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n" % len(b) + b + b"GET /health HTTP/1.1\r\n\r\n")
    check(status_of(resp) == 400 and b'"invalid_header"' in resp and resp.count(b"HTTP/1.1 ") == 1 and
          b"Connection: close" in resp, "two Content-Length: %r" % resp)
    resp = raw(head + b"Content-Length: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (len(b), len(b)) + b)
    check(status_of(resp) == 200, "the same Content-Length twice: %r" % resp[:100])
    resp = raw(head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(b) +
               b"%x\r\n" % len(b) + b + b"\r\n0\r\n\r\n")
    check(status_of(resp) == 400 and b'"invalid_header"' in resp, "Content-Length with chunked: %r" % resp[:200])
    # n against --max-waiting 4: one request of 8 sequences never fits
    st, js, _ = post(port, C, {"prompt": "a", "n": 8, "max_tokens": 1})
    err_of(st, js, 400, "invalid_value", "n")
    check("--max-waiting" in js["error"]["message"], "n message %s" % js)
    # 429 with Retry-After (--max-seqs 1 --max-waiting 4, sleep_ms=20)
    a = raw_post(port, C, json.dumps({"prompt": "first", "max_tokens": 300}).encode())
    wait_for(lambda: metrics(port)["orch_requests_running"] == 1, 5, "first running")
    bsock = raw_post(port, C, json.dumps({"prompt": "wait", "n": 4, "max_tokens": 300}).encode())
    wait_for(lambda: metrics(port)["orch_requests_waiting"] == 4, 5, "four waiting")
    st, js, hd = post(port, C, {"prompt": "third", "max_tokens": 1})
    check(st == 429 and js["error"]["code"] == "queue_full" and hd.get("retry-after") == "1",
          "429: %d %s %s" % (st, js, hd))
    a.close()
    bsock.close()
    wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0 and metrics(port)["orch_requests_waiting"] == 0, 5,
             "the queue to drain")
    print("headers ok")


globals()[scenario]()
