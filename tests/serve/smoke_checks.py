"""smoke_checks.py PORT - a few requests of every kind against one orch serve
(started with --api-key sekret --cors-origin http://app.example --max-body
65536), each answer checked: for running the server under a memory checker
(tests/serve_valgrind.sh), so that every main path of the server runs once:
GET routes, completions in every prompt form with n, echo, logprobs and stop
strings (the stop-string scan), streams (with usage, with a stop string, cut
off by the client), chat (plain, streamed, logprobs), structured output
(json_schema with jump-forward, regex, tool calls plain and streamed, a refused
schema), CORS preflight, and the
error paths (auth, JSON, strict JSON, media type, Host, size, context,
route, method)."""
import json
import socket
import sys

from client import chat_prompt, check, greedy, post, request, stream

port = int(sys.argv[1])
C, CH = "/v1/completions", "/v1/chat/completions"
AUTH = {"Authorization": "Bearer sekret"}


def ok_post(path, body):
    st, js, _ = post(port, path, body, headers=AUTH, timeout=120)
    check(st == 200, "%s %s: %d %s" % (path, body, st, js))
    return js


def err(path, body, status, code, headers=None):
    h = dict(AUTH)
    h.update(headers or {})
    st, hd, data = request(port, "POST", path, body, headers=h, timeout=120)
    js = json.loads(data)
    check(st == status and js["error"]["code"] == code, "%s: %d %s" % (body, st, js))


for path in ["/health", "/metrics"]:
    st, _, _ = request(port, "GET", path)
    check(st == 200, path)
st, _, data = request(port, "GET", "/v1/models", headers=AUTH)
check(st == 200 and json.loads(data)["data"][0]["id"] == "mock-gpt2", "models")

js = ok_post(C, {"prompt": "Hello", "max_tokens": 5, "temperature": 0})
check(js["choices"][0]["text"] == greedy("Hello", 5), "text")
js = ok_post(C, {"prompt": ["ab", [99, 100]], "n": 2, "max_tokens": 3, "temperature": 0.8, "seed": 3})
check(len(js["choices"]) == 4, "list x n")
js = ok_post(C, {"prompt": "ab", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2})
check(js["choices"][0]["text"] == "ab" + greedy("ab", 3), "echo")
g = greedy("stop-test", 30)
stop = g[10:13]
js = ok_post(C, {"prompt": "stop-test", "max_tokens": 30, "temperature": 0, "stop": ["QQ", stop]})
check(js["choices"][0]["text"] == g[:g.index(stop)] and js["choices"][0]["finish_reason"] == "stop", "stop")
js = ok_post(C, {"prompt": "stop-test", "max_tokens": 30, "temperature": 0, "stop": g[5], "logprobs": 1})
check(js["choices"][0]["text"] == g[:g.index(g[5])], "one-byte stop")

st, _, ev = stream(port, C, {"prompt": "stop-test", "max_tokens": 30, "temperature": 0, "stream": True,
                             "stop": stop, "stream_options": {"include_usage": True}, "n": 2}, timeout=120,
                  headers=AUTH)
check(st == 200 and ev[-1] == "[DONE]", "stream with stop")
# a stream the client leaves
s = socket.create_connection(("127.0.0.1", port), timeout=60)
body = json.dumps({"prompt": "leave", "max_tokens": 500, "stream": True}).encode()
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sekret\r\n"
          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
got = b""
while b"data: " not in got:
    d = s.recv(4096)
    check(d, "stream ended early")
    got += d
s.close()

msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
js = ok_post(CH, {"messages": msgs, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 2})
check(js["choices"][0]["message"]["content"] == greedy(chat_prompt(msgs), 4), "chat")
st, _, ev = stream(port, CH, {"messages": msgs, "max_tokens": 3, "temperature": 0, "stream": True}, timeout=120,
                  headers=AUTH)
check(st == 200 and ev[-1] == "[DONE]", "chat stream")

# structured output: a schema (jump-forward through the scheduler), a regex, a tool
# call streamed and not, a refused schema
sch = {"type": "object", "properties": {"a_long_fixed_key": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "b": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                              "maxItems": 2}},
       "required": ["a_long_fixed_key"]}
js = ok_post(C, {"prompt": "s", "max_tokens": 80, "seed": 1, "n": 2,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": sch}}})
check(all("a_long_fixed_key" in json.loads(c["text"]) for c in js["choices"]), "json_schema")
js = ok_post(C, {"prompt": "s", "max_tokens": 20, "structured_outputs": {"regex": "[a-c]{2}\\d"}})
check(len(js["choices"][0]["text"]) == 3, "regex")
tools = [{"type": "function", "function": {"name": "f", "parameters": sch}}]
js = ok_post(CH, {"messages": msgs, "tools": tools, "tool_choice": "required", "max_tokens": 80})
check(js["choices"][0]["finish_reason"] == "tool_calls", "tool call")
st, _, ev = stream(port, CH, {"messages": msgs, "tools": tools, "stream": True, "max_tokens": 80, "seed": 2,
                              "tool_choice": {"type": "function", "function": {"name": "f"}}},
                   timeout=120, headers=AUTH)
check(st == 200 and ev[-1] == "[DONE]", "tool call stream")
err(C, {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
    "name": "s", "schema": {"type": "string", "format": "uri"}}}}, 400, "invalid_value")

st, hd, _ = request(port, "OPTIONS", C, headers={"Origin": "http://app.example",
                                               "Access-Control-Request-Method": "POST"})
check(st == 204 and hd.get("access-control-allow-origin") == "http://app.example", "preflight")

st, _, _ = request(port, "POST", C, {"prompt": "x"})
check(st == 401, "no key")
err(C, b'{"prompt": "x",', 400, "invalid_json")
err(C, b'{"prompt":"x","prompt":"y"}', 400, "duplicate_key")
err(C, b'{"prompt":"x\\u0000"}', 400, "invalid_value")
err(C, b'{"prompt":"x"} []', 400, "invalid_json")
err(C, {"prompt": "x"}, 415, "unsupported_media_type", {"Content-Type": "text/plain"})
err(C, {"prompt": "x"}, 403, "host_not_allowed", {"Host": "evil.example"})
err(C, {"prompt": "z" * 70000}, 413, "request_too_large")
err(C, {"prompt": "y" * 2000}, 400, "context_length_exceeded")
err(C, {"prompt": [1] * 2000}, 400, "context_length_exceeded")
err(C, {"prompt": "x", "n": 0}, 400, "invalid_value")
err(CH, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_value")
st, _, _ = request(port, "GET", "/nope")
check(st == 404, "404")
st, _, _ = request(port, "GET", C, headers=AUTH)
check(st == 405, "405")
print("smoke checks passed")
