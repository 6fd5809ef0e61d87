"""client.py - HTTP helpers for the orch serve test suites (standard library
only): plain requests, SSE streams, raw sockets, the mock engine's greedy rule
and the chat template, so tests can predict exact outputs.

Mock rule (engines/mock/README.md): with vocab >= 123 the greedy next token is
97 + (S mod 26), S = the sum of the token ids at positions 0..p; with the byte
tokenizer the token ids are the UTF-8 bytes.
"""
import http.client
import json
import socket
import sys
import time


def request(port, method, path, body=None, headers=None, timeout=30):
    """Returns (status, headers dict (lower-case keys), body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    hd = {k.lower(): v for k, v in r.getheaders()}
    conn.close()
    return r.status, hd, data


def post(port, path, obj, headers=None, timeout=30):
    st, hd, data = request(port, "POST", path, obj, headers, timeout)
    try:
        js = json.loads(data)
    except ValueError:
        js = None
    return st, js, hd


def stream(port, path, obj, timeout=30, headers=None):
    """POST with stream; returns (status, headers, list of event payloads
    (parsed JSON or the string "[DONE]"))."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request("POST", path, body=json.dumps(obj), headers=h)
    r = conn.getresponse()
    hd = {k.lower(): v for k, v in r.getheaders()}
    raw = r.read().decode("utf-8")
    conn.close()
    events = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), "bad SSE block %r" % block
        payload = block[6:]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return r.status, hd, events


def greedy(prompt, n):
    """The mock's greedy continuation of prompt (str or list of ids)."""
    ids = list(prompt.encode("utf-8")) if isinstance(prompt, str) else list(prompt)
    s = sum(ids)
    out = []
    for _ in range(n):
        nxt = 97 + s % 26
        out.append(chr(nxt))
        s += nxt
    return "".join(out)


def chat_prompt(messages):
    """The orch-plain-v1 chat template (orchestrator/serve/chat_template.h)."""
    label = {"system": "System: ", "developer": "System: ", "user": "User: ", "assistant": "Assistant: "}
    out = ""
    for m in messages:
        out += label[m["role"]] + (m.get("content") or "") + "\n"
    return out + "Assistant:"


def metrics(port):
    st, _, data = request(port, "GET", "/metrics")
    assert st == 200
    vals = {}
    for line in data.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, val = line.rsplit(" ", 1)
        vals[name] = float(val)
    return vals


def wait_for(pred, timeout=10.0, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


def raw_post(port, path, body_bytes, extra_headers=b""):
    """Open a socket, send a POST, return the connected socket (not read)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" +
              extra_headers + b"Content-Length: " + str(len(body_bytes)).encode() + b"\r\n\r\n" + body_bytes)
    return s


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)
