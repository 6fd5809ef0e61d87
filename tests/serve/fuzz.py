"""fuzz.py PORT ITERATIONS SEED - malformed input must never crash or wedge
orch serve: random bytes, garbage HTTP, mutated JSON (wrong types, huge and
non-finite numbers, invalid UTF-8, deep nesting, huge strings), early
disconnects. Every answer must be a well-formed HTTP response with a status
from the documented set (never 5xx), and the server must stay healthy."""
import json
import random
import socket
import sys

from client import check, request

port, iters, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
OK = {200, 400, 401, 403, 404, 405, 413, 415, 429}
PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/v1/x", "/",
         "/v1/completions?x=1", "/%00", "/v1/models/" + "a" * 300]
FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "n", "echo",
          "logprobs", "stream_options", "messages", "max_completion_tokens", "top_logprobs", "best_of",
          "presence_penalty", "logit_bias", "response_format", "ignore_eos", "suffix", "user"]


def rvalue(depth=0):
    k = rnd.randrange(16)
    if k == 0:
        return rnd.choice([0, 1, -1, 2**31, 2**63, -2**63, 2**64 + 5, 10**30, 7])
    if k == 1:
        return rnd.choice([0.5, -0.0, 1e308, -1e308, 1e-320, 2.5, 3.0000001])
    if k == 2:
        return "".join(chr(rnd.randrange(1, 0x2FF)) for _ in range(rnd.randrange(0, 20)))
    if k == 3:
        return rnd.choice([True, False, None])
    if k == 4 and depth < 4:
        return [rvalue(depth + 1) for _ in range(rnd.randrange(0, 5))]
    if k == 5 and depth < 4:
        return {rnd.choice(FIELDS + ["x", ""]): rvalue(depth + 1) for _ in range(rnd.randrange(0, 4))}
    if k == 6:
        return [rnd.randrange(-5, 300) for _ in range(rnd.randrange(0, 30))]
    if k == 7:
        return [{"role": rnd.choice(["user", "system", "assistant", "x", 5]), "content": rvalue(depth + 1)}]
    if k == 8:
        return "x" * rnd.choice([0, 1, 1000, 5000])
    if k == 9:
        return {"include_usage": rvalue(depth + 1)}
    return rnd.choice(["hello", "ab", [97, 98], ["a", [98]], 3, 0, 1])


def send_raw(data, read=True, close_early=False, half_close=False):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        check(False, "cannot connect: %s" % e)
    try:
        s.sendall(data)
        if close_early:
            s.close()
            return None
        if half_close:  # incomplete HTTP: let the server see the end
            s.shutdown(socket.SHUT_WR)
        resp = b""
        while read:
            try:
                d = s.recv(65536)
            except socket.timeout:
                check(False, "no answer to %r" % data[:200])
            except OSError:
                break
            if not d:
                break
            resp += d
            if b"\r\n\r\n" in resp:
                head, _, body = resp.partition(b"\r\n\r\n")
                if b"chunked" in head.lower():
                    if body.endswith(b"0\r\n\r\n"):
                        break
                else:
                    cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                    if cl and len(body) >= int(cl[0].split(b":")[1]):
                        break
        return resp
    finally:
        s.close()


def post_body(body, path="/v1/completions", extra=b""):
    # mostly a well-formed JSON POST; now and then a foreign Host or another
    # media type (403 / 415 before the body is read)
    r = rnd.random()
    host = b"evil.example" if r < 0.03 else b"localhost"
    ctype = b"text/plain" if 0.03 <= r < 0.06 else b"application/json"
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: " + ctype +
            b"\r\nConnection: close\r\n" + extra + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def status_of(resp):
    if not resp:
        return None
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return -1


def expect(resp, what):
    st = status_of(resp)
    if st is None:
        return  # the server may close malformed HTTP without answering
    check(st in OK, "%s: status %s: %r" % (what, st, resp[:300]))
    if st != 200 and b"application/json" in resp.split(b"\r\n\r\n")[0]:
        body = resp.split(b"\r\n\r\n", 1)[1]
        js = json.loads(body)
        check(set(js["error"]) == {"message", "type", "param", "code"}, "error shape %r" % body[:200])


for i in range(iters):
    k = i % 10
    path = rnd.choice(PATHS[:2])
    if k == 0:  # random bytes as the body
        body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 300)))
        expect(send_raw(post_body(body, path)), "random body")
    elif k == 1:  # garbage request line / headers
        junk = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200)))
        if rnd.random() < 0.3:
            # an unterminated line: libmicrohttpd may not notice a half-close
            # that arrives with the data (edge-triggered epoll) and keeps such
            # a connection until its timeout, so do not wait for an answer
            send_raw(junk, read=False, close_early=True)
        else:
            data = rnd.choice([b"GET " + junk + b" HTTP/1.1\r\n\r\n", junk + b"\r\n\r\n"])
            expect(send_raw(data, half_close=True), "garbage")
    elif k in (2, 3, 4, 5):  # structured JSON with random fields and values
        obj = {f: rvalue() for f in rnd.sample(FIELDS, rnd.randrange(1, 7))}
        if rnd.random() < 0.5:
            obj["max_tokens"] = rnd.randrange(0, 4)
        if obj.get("n") not in range(1, 4):
            obj.pop("n", None)
        body = json.dumps(obj).encode()
        expect(send_raw(post_body(body, path)), "json %r" % body[:300])
    elif k == 6:  # deep nesting and huge numbers / strings as text
        d = rnd.randrange(1, 20000)
        body = rnd.choice([b"[" * d + b"]" * d, b'{"prompt":' * d, b'{"prompt":"a","max_tokens":1' + b"0" * 400 + b"}",
                           b'{"prompt":"a","temperature":1e999}', b'{"prompt":"\\ud800\\udfff\\ud800","max_tokens":1}',
                           b'{"prompt":"\xff\xfe\xc3","max_tokens":2}', b'{"prompt":"a","max_tokens":-0}',
                           b'{"prompt":' + b'"' + b"\\" * rnd.randrange(1, 50) + b'"}'])
        expect(send_raw(post_body(body, path)), "deep/huge %r" % body[:100])
    elif k == 7:  # truncated JSON of a valid request
        body = json.dumps({"prompt": "truncate me", "max_tokens": 3, "stream": rnd.random() < 0.5}).encode()
        body = body[:rnd.randrange(0, len(body))]
        expect(send_raw(post_body(body, path)), "truncated")
    elif k == 8:  # disconnect early: mid-body, or right after a streaming request
        body = json.dumps({"prompt": "bye", "max_tokens": rnd.randrange(1, 50), "stream": rnd.random() < 0.5}).encode()
        data = post_body(body, path)
        send_raw(data[:rnd.randrange(1, len(data) + 1)], read=False, close_early=True)
    else:  # lying Content-Length, odd headers, wrong methods
        body = json.dumps({"prompt": "cl", "max_tokens": 1}).encode()
        variants = [
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 5\r\n\r\n" + body,
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: -5\r\n\r\n" + body,
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 99999999999999999999\r\n\r\n",
            post_body(body, extra=b"Authorization: Bearer " + b"k" * 5000 + b"\r\n"),
            post_body(body, extra=b"X-A: b\r\n" * 200),
            b"PATCH /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
            b"GET /v1/chat/completions HTTP/1.0\r\n\r\n",
        ]
        expect(send_raw(rnd.choice(variants)), "headers")

st, _, body = request(port, "GET", "/health")
check(st == 200, "server unhealthy after fuzzing: %d %s" % (st, body))
st, _, body = request(port, "POST", "/v1/completions", json.dumps({"prompt": "ab", "max_tokens": 3, "temperature": 0}))
check(st == 200 and json.loads(body)["choices"][0]["text"] == "ntf", "server still generates correctly")
print("fuzz: %d inputs, server healthy" % iters)
