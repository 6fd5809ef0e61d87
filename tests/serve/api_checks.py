"""api_checks.py PORT KEY_PORT SMALL_PORT NOCACHE_PORT - every endpoint and
error case of orch serve on the mock engine, with outputs predicted exactly by
client.greedy. PORT: a default server; KEY_PORT: one started with --api-key
sekret; SMALL_PORT: one with --max-body 2048; NOCACHE_PORT: one with
--no-prefix-cache."""
import json
import socket
import sys
import threading

from client import (chat_prompt, check, greedy, metrics, post, request,
                    stream, wait_for)

port, key_port, small_port, nocache_port = (int(a) for a in sys.argv[1:5])
C = "/v1/completions"
CH = "/v1/chat/completions"


def err_of(st, js, status, code=None, param=None):
    check(st == status, "expected %d got %d: %s" % (status, st, js))
    check(js and set(js.keys()) == {"error"}, "error shape: %s" % js)
    e = js["error"]
    check(set(e.keys()) == {"message", "type", "param", "code"}, "error keys: %s" % e)
    check(isinstance(e["message"], str) and e["message"], "error message")
    if code is not None:
        check(e["code"] == code, "code %r != %r (%s)" % (e["code"], code, e))
    if param is not None:
        check(e["param"] == param, "param %r != %r (%s)" % (e["param"], param, e))
    return e


# ---- GET routes ------------------------------------------------------------
st, hd, body = request(port, "GET", "/health")
check(st == 200 and json.loads(body) == {"status": "ok"}, "health")
check(hd["content-type"].startswith("application/json"), "health content type")
st, _, body = request(port, "GET", "/v1/models")
js = json.loads(body)
check(st == 200 and js["object"] == "list" and js["data"][0]["id"] == "mock-gpt2", "models %s" % js)
check(js["data"][0]["object"] == "model" and js["data"][0]["max_model_len"] == 1024, "model object")
st, _, body = request(port, "GET", "/v1/models/mock-gpt2")
check(st == 200 and json.loads(body)["id"] == "mock-gpt2", "model by id")
st, _, body = request(port, "GET", "/v1/models/other")
err_of(st, json.loads(body), 404, "model_not_found")
st, _, body = request(port, "HEAD", "/health")
check(st == 200 and body == b"", "HEAD health")

# ---- completions -----------------------------------------------------------
st, js, _ = post(port, C, {"model": "mock-gpt2", "prompt": "Hello", "max_tokens": 7, "temperature": 0})
check(st == 200, "completion status %d %s" % (st, js))
check(js["object"] == "text_completion" and js["id"].startswith("cmpl-") and js["model"] == "mock-gpt2", "shape")
check(isinstance(js["created"], int), "created")
ch = js["choices"]
check(len(ch) == 1 and ch[0]["index"] == 0 and ch[0]["text"] == greedy("Hello", 7), "text %s" % ch)
check(ch[0]["finish_reason"] == "length" and ch[0]["logprobs"] is None, "finish/logprobs")
check(js["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                      "prompt_tokens_details": {"cached_tokens": 0}}, "usage %s" % js["usage"])
# default max_tokens is 16; model may be omitted
st, js, _ = post(port, C, {"prompt": "x", "temperature": 0})
check(st == 200 and js["choices"][0]["text"] == greedy("x", 16), "default max_tokens")
# token-array prompt, list of prompts (strings and token arrays), n
st, js, _ = post(port, C, {"prompt": [72, 105], "max_tokens": 4, "temperature": 0})
check(st == 200 and js["choices"][0]["text"] == greedy([72, 105], 4), "token prompt")
st, js, _ = post(port, C, {"prompt": ["ab", [99, 100], "xyz"], "max_tokens": 3, "temperature": 0, "n": 2})
check(st == 200 and len(js["choices"]) == 6, "list prompts n=2: %s" % js)
for i, p in enumerate(["ab", [99, 100], "xyz"]):
    for c in range(2):
        cc = js["choices"][i * 2 + c]
        check(cc["index"] == i * 2 + c and cc["text"] == greedy(p, 3), "choice %d" % (i * 2 + c))
check(js["usage"]["prompt_tokens"] == 7 and js["usage"]["completion_tokens"] == 18, "usage list")
# echo and logprobs
st, js, _ = post(port, C, {"prompt": "ab", "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2})
check(st == 200, "echo status")
c0 = js["choices"][0]
check(c0["text"] == "ab" + greedy("ab", 3), "echo text %r" % c0["text"])
lp = c0["logprobs"]
check(lp["tokens"] == ["a", "b"] + list(greedy("ab", 3)), "logprob tokens %s" % lp["tokens"])
check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, "first prompt token has no logprob")
check(lp["text_offset"] == [0, 1, 2, 3, 4], "text offsets %s" % lp["text_offset"])
check(all(x < 0 for x in lp["token_logprobs"][1:]), "logprobs negative")
check(len(lp["top_logprobs"][2]) == 2 and greedy("ab", 1) in lp["top_logprobs"][2], "top logprobs %s" % lp)
# stop strings across token boundaries
g = greedy("stop-test", 30)
stop = g[10:13]
st, js, _ = post(port, C, {"prompt": "stop-test", "max_tokens": 30, "temperature": 0, "stop": ["QQ", stop]})
want = g[:g.index(stop)]
check(st == 200 and js["choices"][0]["text"] == want and js["choices"][0]["finish_reason"] == "stop",
      "stop: %r vs %r" % (js["choices"][0]["text"], want))
st, js, _ = post(port, C, {"prompt": "stop-test", "max_tokens": 30, "temperature": 0, "stop": stop})
check(js["choices"][0]["text"] == want, "stop as a string")
# seeded sampling: same seed, same text; different seeds differ
body = {"prompt": "seed me", "max_tokens": 24, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "seed": 1234}
a = post(port, C, body)[1]["choices"][0]["text"]
b = post(port, C, body)[1]["choices"][0]["text"]
check(a == b and a != greedy("seed me", 24), "seeded sampling repeatable and not greedy")
body["seed"] = 99
check(post(port, C, body)[1]["choices"][0]["text"] != a, "another seed differs")
body["seed"] = 1234
# ... and the same inside a busy batch
busy_results = {}


def busy(i):
    busy_results[i] = post(port, C, {"prompt": "busy %d" % i, "max_tokens": 40, "temperature": 0.7, "seed": i})


ths = [threading.Thread(target=busy, args=(i,)) for i in range(16)]
for t in ths:
    t.start()
c = post(port, C, body)[1]["choices"][0]["text"]
for t in ths:
    t.join()
check(c == a, "seeded output changed inside a busy batch: %r vs %r" % (c, a))
check(all(r[0] == 200 for r in busy_results.values()), "busy requests ok")
# max_tokens 0 with echo: the prompt only
st, js, _ = post(port, C, {"prompt": "zero", "max_tokens": 0, "echo": True})
check(st == 200 and js["choices"][0]["text"] == "zero" and js["usage"]["completion_tokens"] == 0, "max_tokens 0")

# ---- streaming ---------------------------------------------------------------
st, hd, ev = stream(port, C, {"prompt": "stream", "max_tokens": 5, "temperature": 0, "stream": True})
check(st == 200 and hd["content-type"].startswith("text/event-stream"), "stream headers %s" % hd)
check(ev[-1] == "[DONE]" and len(ev) == 6, "5 token events + [DONE]: %s" % ev)
texts = [e["choices"][0]["text"] for e in ev[:-1]]
check(texts == list(greedy("stream", 5)), "stream chunks %s" % texts)
check(all(e["choices"][0]["finish_reason"] is None for e in ev[:4]), "no early finish")
check(ev[4]["choices"][0]["finish_reason"] == "length", "final finish_reason")
check(all(e["id"] == ev[0]["id"] and e["object"] == "text_completion" for e in ev[:-1]), "stream ids")
check(all("usage" not in e for e in ev[:-1]), "no usage without include_usage")
st, _, ev = stream(port, C, {"prompt": "stream", "max_tokens": 3, "temperature": 0, "stream": True,
                             "stream_options": {"include_usage": True}, "n": 2})
check(ev[-1] == "[DONE]", "done")
usage = ev[-2]
check(usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 6, "completion_tokens": 6, "total_tokens": 12,
                                                   "prompt_tokens_details": {"cached_tokens": 0}},
      "usage chunk %s" % usage)
for k in range(2):
    t = "".join(e["choices"][0]["text"] for e in ev[:-2] if e["choices"][0]["index"] == k)
    check(t == greedy("stream", 3), "choice %d streamed %r" % (k, t))
check(all(e["usage"] is None for e in ev[:-2]), "usage null in other chunks")
# stop string while streaming: the stop text never leaks
st, _, ev = stream(port, C, {"prompt": "stop-test", "max_tokens": 30, "temperature": 0, "stream": True, "stop": stop})
t = "".join(e["choices"][0]["text"] for e in ev[:-1])
check(t == want and ev[-2]["choices"][0]["finish_reason"] == "stop", "streamed stop %r" % t)
# echo + logprobs while streaming
st, _, ev = stream(port, C, {"prompt": "ab", "max_tokens": 2, "temperature": 0, "stream": True, "echo": True,
                             "logprobs": 1})
check(ev[0]["choices"][0]["text"] == "ab" and ev[0]["choices"][0]["logprobs"]["tokens"] == ["a", "b"], "echo event")
check("".join(e["choices"][0]["text"] for e in ev[:-1]) == "ab" + greedy("ab", 2), "echo stream text")
check(ev[1]["choices"][0]["logprobs"]["text_offset"] == [2], "stream text offset")

# ---- chat ------------------------------------------------------------------
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
st, js, _ = post(port, CH, {"model": "mock-gpt2", "messages": msgs, "max_tokens": 6, "temperature": 0})
check(st == 200 and js["object"] == "chat.completion" and js["id"].startswith("chatcmpl-"), "chat shape %s" % js)
m = js["choices"][0]["message"]
check(m == {"role": "assistant", "content": greedy(chat_prompt(msgs), 6)}, "chat text %s" % m)
check(js["usage"]["prompt_tokens"] == len(chat_prompt(msgs).encode()), "chat prompt tokens")
st, js, _ = post(port, CH, {"messages": msgs, "max_completion_tokens": 3, "max_tokens": 9, "temperature": 0})
check(js["choices"][0]["message"]["content"] == greedy(chat_prompt(msgs), 3), "max_completion_tokens wins")
parts = [{"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
st, js, _ = post(port, CH, {"messages": parts, "max_tokens": 4, "temperature": 0})
check(js["choices"][0]["message"]["content"] == greedy(chat_prompt([{"role": "user", "content": "Hi there"}]), 4),
      "content parts")
st, js, _ = post(port, CH, {"messages": msgs, "max_tokens": 2, "temperature": 0, "logprobs": True, "top_logprobs": 2})
lc = js["choices"][0]["logprobs"]["content"]
check(len(lc) == 2 and lc[0]["token"] == greedy(chat_prompt(msgs), 1) and len(lc[0]["top_logprobs"]) == 2, "chat lp")
check(lc[0]["bytes"] == [ord(lc[0]["token"])], "chat logprob bytes")
st, _, ev = stream(port, CH, {"messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True,
                              "stream_options": {"include_usage": True}})
check(ev[0]["object"] == "chat.completion.chunk" and ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""},
      "chat role chunk %s" % ev[0])
txt = "".join(e["choices"][0]["delta"].get("content", "") for e in ev[1:-2])
check(txt == greedy(chat_prompt(msgs), 4), "chat stream text %r" % txt)
check(ev[-3]["choices"][0]["finish_reason"] == "length" and ev[-2]["usage"]["completion_tokens"] == 4, "chat end")
# default chat max_tokens fills the context
st, js, _ = post(port, CH, {"messages": [{"role": "user", "content": "x" * 1000}], "temperature": 0})
check(st == 200 and js["usage"]["completion_tokens"] == 1024 - len(chat_prompt([{"role": "user", "content": "x" * 1000}])),
      "chat default max tokens %s" % js.get("usage"))

# ---- errors (400) --------------------------------------------------------------
st, hd, body = request(port, "POST", C, b'{"prompt": "x",')
err_of(st, json.loads(body), 400, "invalid_json")
st, hd, body = request(port, "POST", C, b"[1,2,3]")
err_of(st, json.loads(body), 400, "invalid_json")
st, hd, body = request(port, "POST", C, b"")
err_of(st, json.loads(body), 400)
bad = [
    ({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": [1, "a"]}, "prompt"),
    ({"prompt": [256]}, "prompt"), ({"prompt": [-1]}, "prompt"), ({"prompt": [1.5]}, "prompt"),
    ({"prompt": [[1], 2]}, "prompt"), ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"), ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"), ({"prompt": "x", "max_tokens": 1e300}, "max_tokens"),
    ({"prompt": "x", "temperature": 3}, "temperature"), ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"), ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"), ({"prompt": "x", "n": 0}, "n"), ({"prompt": "x", "n": 1000}, "n"),
    ({"prompt": "x", "stream": "yes"}, "stream"), ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"), ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "stop": 5}, "stop"), ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "stop": ["a"] * 17}, "stop"), ({"prompt": "x", "seed": "s"}, "seed"),
    ({"prompt": "x", "seed": 1e30}, "seed"), ({"prompt": "x", "model": 7}, "model"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"), ({"prompt": "x", "best_of": 3}, "best_of"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logit_bias": {"x": 1}}, "logit_bias"), ({"prompt": "x", "min_p": -1}, "min_p"),
    ({"prompt": "x", "stop_token_ids": [-3]}, "stop_token_ids"), ({"prompt": "x", "bogus_field": 1}, None),
    ({"prompt": "x", "stream_options": 3}, "stream_options"), ({"prompt": ["x"] * 300}, "prompt"),
    ({"prompt": ["x"] * 100, "n": 3}, "n"),
]
for body, param in bad:
    st, js, _ = post(port, C, body)
    err_of(st, js, 400, param=param)
st, js, _ = post(port, C, {"prompt": "x", "model": "gpt-4"})
err_of(st, js, 404, "model_not_found", "model")
check("gpt-4" in js["error"]["message"] and "mock-gpt2" in js["error"]["message"], "model message")
# context overflow states both numbers
st, js, _ = post(port, C, {"prompt": "y" * 1000, "max_tokens": 100})
e = err_of(st, js, 400, "context_length_exceeded")
check("1024" in e["message"] and "1000" in e["message"] and "1100" in e["message"], "overflow message %s" % e)
st, js, _ = post(port, C, {"prompt": "y" * 1030})
e = err_of(st, js, 400, "context_length_exceeded")
check("1024" in e["message"] and "1030" in e["message"], "prompt overflow message %s" % e)
st, js, _ = post(port, CH, {"messages": [{"role": "user", "content": "y" * 1030}]})
err_of(st, js, 400, "context_length_exceeded")
for body, param in [({"messages": []}, "messages"), ({"messages": "hi"}, "messages"),
                    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
                    ({"messages": [{"role": "user"}]}, "messages"), ({"messages": [{"content": "x"}]}, "messages"),
                    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
                    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
                    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
                     "max_completion_tokens"),
                    ({"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools"),
                    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
                     "response_format")]:
    st, js, _ = post(port, CH, body)
    err_of(st, js, 400, param=param)

# ---- routes and methods ------------------------------------------------------
for method, path in [("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/v1"), ("GET", "/v1/completions/x")]:
    st, _, body = request(port, method, path)
    err_of(st, json.loads(body), 404)
for method, path, allow in [("GET", C, "POST"), ("PUT", CH, "POST"), ("DELETE", "/health", "GET, HEAD"),
                            ("POST", "/v1/models", "GET, HEAD"), ("POST", "/metrics", "GET, HEAD")]:
    st, hd, body = request(port, method, path, b"{}" if method != "GET" else None)
    err_of(st, json.loads(body), 405)
    check(hd.get("allow") == allow, "Allow header for %s %s: %s" % (method, path, hd))

# ---- body limit (server with --max-body 2048) ---------------------------------
st, js, _ = post(small_port, C, {"prompt": "z" * 3000})
err_of(st, js, 413, "request_too_large")
st, js, _ = post(small_port, C, {"prompt": "z" * 100, "max_tokens": 1, "temperature": 0})
check(st == 200, "small body ok on the small server")
# chunked upload without Content-Length, over the limit
s = socket.create_connection(("127.0.0.1", small_port), timeout=10)
chunk = b'{"prompt":"' + b"q" * 3000 + b'"}'
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
          b"Transfer-Encoding: chunked\r\n\r\n" +
          (b"%x\r\n" % len(chunk)) + chunk + b"\r\n0\r\n\r\n")
resp = b""
while True:
    try:
        d = s.recv(65536)
    except OSError:
        break
    if not d:
        break
    resp += d
    if b"\r\n\r\n" in resp and b"request_too_large" in resp:
        break
s.close()
check(resp.startswith(b"HTTP/1.1 413"), "chunked 413: %r" % resp[:80])

# ---- API key (server with --api-key sekret) ---------------------------------------
ok_body = {"prompt": "k", "max_tokens": 2, "temperature": 0}
st, js, hd = post(key_port, C, ok_body)
err_of(st, js, 401, "invalid_api_key")
st, js, _ = post(key_port, C, ok_body, headers={"Authorization": "Bearer wrong"})
err_of(st, js, 401)
st, js, _ = post(key_port, C, ok_body, headers={"Authorization": "Basic c2VrcmV0"})
err_of(st, js, 401)
st, js, _ = post(key_port, C, ok_body, headers={"Authorization": "Bearer sekret"})
check(st == 200 and js["choices"][0]["text"] == greedy("k", 2), "authorized request")
st, _, _ = request(key_port, "GET", "/v1/models")
check(st == 401, "models needs the key")
st, _, _ = request(key_port, "GET", "/health")
check(st == 200, "health needs no key")

# ---- 64 concurrent requests with distinct prompts -------------------------------
results = {}


def one(i):
    prompt = "concurrent request number %d says hello" % i
    n = 8 + i % 17
    if i % 2:
        st, _, ev = stream(port, C, {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True})
        text = "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]")
        results[i] = (st, text, greedy(prompt, n), ev[-1] == "[DONE]")
    else:
        st, js, _ = post(port, C, {"prompt": prompt, "max_tokens": n, "temperature": 0})
        results[i] = (st, js["choices"][0]["text"], greedy(prompt, n), True)


ths = [threading.Thread(target=one, args=(i,)) for i in range(64)]
for t in ths:
    t.start()
for t in ths:
    t.join()
check(len(results) == 64, "all 64 answered")
for i, (st, got, want, done) in sorted(results.items()):
    check(st == 200 and got == want and done, "concurrent %d: %d %r vs %r" % (i, st, got, want))

# ---- token controls: logit_bias, stop_token_ids, min_tokens, penalties -----------
def greedy_penalised(prompt, n, presence, frequency):
    """greedy with OpenAI presence/frequency penalties over generated tokens."""
    s = sum(prompt.encode("utf-8"))
    count = [0] * 256
    out = []
    for _ in range(n):
        nxt = 97 + s % 26
        best, bv = -1, None
        for v in range(256):
            x = -abs(v - nxt) - ((presence + frequency * count[v]) if count[v] else 0)
            if bv is None or x > bv:
                best, bv = v, x
        out.append(best)
        count[best] += 1
        s += best
    return "".join(chr(c) for c in out)


st, js, _ = post(port, C, {"prompt": "abc", "max_tokens": 5, "temperature": 0, "logit_bias": {"122": 100}})
check(st == 200 and js["choices"][0]["text"] == "zzzzz", "logit_bias %s" % js)
g = greedy("abc", 40)
k = next(i for i in range(3, 40) if g[i] not in g[:i])
st, js, _ = post(port, C, {"prompt": "abc", "max_tokens": 40, "temperature": 0, "stop_token_ids": [ord(g[k])]})
ch = js["choices"][0]
check(st == 200 and ch["text"] == g[:k] and ch["finish_reason"] == "stop", "stop_token_ids %s" % js)
check(js["usage"]["completion_tokens"] == k + 1, "the stop token is counted %s" % js["usage"])
st, js, _ = post(port, C, {"prompt": "abc", "max_tokens": 3, "min_tokens": 3, "temperature": 0, "stop": [g[0]]})
ch = js["choices"][0]
check(st == 200 and ch["text"] == g[:3] and ch["finish_reason"] == "length", "min_tokens holds stops back %s" % js)
st, js, _ = post(port, CH, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0,
                            "presence_penalty": 1.5, "frequency_penalty": 0.25})
want = greedy_penalised(chat_prompt([{"role": "user", "content": "hi"}]), 20, 1.5, 0.25)
check(st == 200 and js["choices"][0]["message"]["content"] == want, "penalties %s vs %r" % (js, want))
st, hd, ev = stream(port, C, {"prompt": "abc", "max_tokens": 40, "temperature": 0, "stream": True,
                              "stop_token_ids": [ord(g[k])]})
text = "".join(e["choices"][0]["text"] for e in ev if e != "[DONE]" and e["choices"])
fins = [e["choices"][0]["finish_reason"] for e in ev if e != "[DONE]" and e["choices"]]
check(st == 200 and text == g[:k] and fins[-1] == "stop", "streamed stop_token_ids %r %r" % (text, fins))
# min_p 1 with temperature keeps only the best token: greedy, whatever the seed
st, js, _ = post(port, C, {"prompt": "abc", "max_tokens": 8, "temperature": 1.5, "min_p": 1.0, "seed": 5})
check(st == 200 and js["choices"][0]["text"] == greedy("abc", 8), "min_p 1 %s" % js)
# repetition_penalty on the mock's logits (all <= 0): seen tokens are pushed down
st, js, _ = post(port, C, {"prompt": "abc", "max_tokens": 8, "temperature": 0, "repetition_penalty": 1.0})
check(st == 200 and js["choices"][0]["text"] == greedy("abc", 8), "repetition_penalty 1 is off")

# ---- /tokenize and /detokenize (llama.cpp and vLLM forms) --------------------------
st, js, _ = post(port, "/tokenize", {"content": "h\u00e9"})
check(st == 200 and js == {"tokens": [104, 195, 169], "count": 3, "max_model_len": 1024}, "tokenize %s" % js)
st, js, _ = post(port, "/tokenize", {"model": "mock-gpt2", "prompt": "h\u00e9", "with_pieces": True,
                                     "add_special_tokens": True})
check(st == 200 and js["tokens"] == [{"id": 104, "piece": "h"}, {"id": 195, "piece": [195]},
                                     {"id": 169, "piece": [169]}], "tokenize pieces %s" % js)
st, js, _ = post(port, "/detokenize", {"tokens": [104, 105]})
check(st == 200 and js == {"content": "hi", "prompt": "hi"}, "detokenize %s" % js)
st, js, _ = post(port, "/detokenize", {"model": "mock-gpt2", "tokens": []})
check(st == 200 and js["content"] == "", "detokenize nothing %s" % js)
for path, body, status, param in [
        ("/tokenize", {"content": "a", "model": "gpt-4"}, 404, "model"),
        ("/tokenize", {"content": "a", "prompt": "b"}, 400, "prompt"),
        ("/tokenize", {}, 400, "content"), ("/tokenize", {"content": 5}, 400, "content"),
        ("/tokenize", {"content": "a", "with_pieces": 1}, 400, "with_pieces"),
        ("/tokenize", {"content": "a", "extra": 1}, 400, None),
        ("/detokenize", {"tokens": [1, 256]}, 400, "tokens"), ("/detokenize", {"tokens": "ab"}, 400, "tokens"),
        ("/detokenize", {}, 400, "tokens")]:
    st, js, _ = post(port, path, body)
    err_of(st, js, status, param=param)
st, _, _ = request(port, "GET", "/tokenize")
check(st == 405, "GET /tokenize is 405: %d" % st)
st, js, _ = post(key_port, "/tokenize", {"content": "a"})
check(st == 401, "/tokenize needs the API key: %d" % st)
st, js, _ = post(key_port, "/tokenize", {"content": "a"}, headers={"Authorization": "Bearer sekret"})
check(st == 200 and js["tokens"] == [97], "/tokenize with the key %s" % js)
# ---- prefix caching ----------------------------------------------------------------
# A repeated prompt reuses its cached full 16-token blocks (all but the last
# token, which is always computed); the outputs do not change.
LONG = "In the beginning God created the heaven and the earth. " * 3  # 165 bytes


def cached_of(js):
    return js["usage"]["prompt_tokens_details"]["cached_tokens"]


for p in (port, nocache_port):
    outs = []
    for k in range(2):
        st, js, _ = post(p, C, {"prompt": LONG, "max_tokens": 5, "temperature": 0})
        check(st == 200 and js["choices"][0]["text"] == greedy(LONG, 5), "cached prompt text %s" % js)
        outs.append(cached_of(js))
    want = [0, (len(LONG) - 1) // 16 * 16] if p == port else [0, 0]
    check(outs == want, "cached_tokens %s, want %s (port %d)" % (outs, want, p))
    st, _, ev = stream(p, C, {"prompt": LONG, "max_tokens": 3, "temperature": 0, "stream": True,
                              "stream_options": {"include_usage": True}})
    check(ev[-1] == "[DONE]" and cached_of(ev[-2]) == want[1], "streaming cached_tokens %s" % ev[-2])
    check("".join(e["choices"][0]["text"] for e in ev[:-2]) == greedy(LONG, 3), "streamed text with cache")
# n > 1: the choices share one computation of the prompt
st, js, _ = post(port, C, {"prompt": LONG + "n", "max_tokens": 4, "temperature": 0, "n": 3})
check(all(c["text"] == greedy(LONG + "n", 4) for c in js["choices"]), "n=3 texts with cache")
# repeated chat turns reuse the conversation: turn 1 computed its prompt and
# all but its last generated token
msgs1 = [{"role": "system", "content": LONG}, {"role": "user", "content": "Who?"}]
st, js, _ = post(port, CH, {"messages": msgs1, "max_tokens": 20, "temperature": 0})
reply = js["choices"][0]["message"]["content"]
check(reply == greedy(chat_prompt(msgs1), 20), "chat turn 1")
msgs2 = msgs1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
st, js, _ = post(port, CH, {"messages": msgs2, "max_tokens": 4, "temperature": 0})
check(js["choices"][0]["message"]["content"] == greedy(chat_prompt(msgs2), 4), "chat turn 2")
t1, t2 = (chat_prompt(msgs1) + reply).encode(), chat_prompt(msgs2).encode()
common = 0
while common < min(len(t1), len(t2)) and t1[common] == t2[common]:
    common += 1
want = min(common, len(t2) - 1, len(t1) - 1) // 16 * 16
check(cached_of(js) == want and want > len(LONG), "chat turn 2 cached_tokens %d, want %d" % (cached_of(js), want))
st, js, _ = post(nocache_port, CH, {"messages": msgs2, "max_tokens": 4, "temperature": 0})
check(cached_of(js) == 0 and js["choices"][0]["message"]["content"] == greedy(chat_prompt(msgs2), 4), "chat no cache")
wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0, 5, "the pool to drain")
mv = metrics(port)
check(mv["orch_prefix_cache_hits_total"] >= 4 and mv["orch_prefix_cache_hit_tokens_total"] >= 4 * 160, "hit counters")
check(mv["orch_prefix_cache_misses_total"] >= 1, "miss counter")
check(mv["orch_prefix_cache_blocks"] > 0 and mv["orch_prefix_cache_evictable_blocks"] == mv["orch_prefix_cache_blocks"],
      "cached block gauges %s %s" % (mv["orch_prefix_cache_blocks"], mv["orch_prefix_cache_evictable_blocks"]))
check("orch_prefix_cache_hits_total" not in metrics(nocache_port), "no prefix metrics with --no-prefix-cache")
# ---- structured output ---------------------------------------------------------------
import re as _re


def valid(sc, v):
    """A small validator for the schemas used here (independent of the server)."""
    if "enum" in sc and v not in sc["enum"]:
        return False
    if "anyOf" in sc and not any(valid(a, v) for a in sc["anyOf"]):
        return False
    t = sc.get("type")
    types = t if isinstance(t, list) else ([t] if t else [])
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if types and not any((isinstance(v, kinds[x]) if x in kinds else
                          (isinstance(v, int) and not isinstance(v, bool)) if x == "integer" else
                          (isinstance(v, (int, float)) and not isinstance(v, bool))) for x in types):
        return False
    if isinstance(v, dict):
        props = sc.get("properties", {})
        if any(k not in v for k in sc.get("required", [])):
            return False
        if sc.get("additionalProperties") is False and any(k not in props for k in v):
            return False
        return all(valid(props[k], x) for k, x in v.items() if k in props)
    if isinstance(v, list):
        return (len(v) >= sc.get("minItems", 0) and len(v) <= sc.get("maxItems", 10 ** 9) and
                all(valid(sc.get("items", {}), x) for x in v))
    if isinstance(v, str):
        return (sc.get("minLength", 0) <= len(v) <= sc.get("maxLength", 10 ** 9) and
                ("pattern" not in sc or _re.search(sc["pattern"], v)))
    if isinstance(v, int) and not isinstance(v, bool):
        return sc.get("minimum", -10 ** 18) <= v <= sc.get("maximum", 10 ** 18)
    return True


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 10},
    "age": {"type": "integer", "minimum": 18, "maximum": 99},
    "role": {"enum": ["admin", "user"]},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{2,5}$"}, "maxItems": 3},
    "score": {"anyOf": [{"type": "number"}, {"type": "null"}]}},
    "required": ["name", "age", "role"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
for seed in range(12):
    for path, body in [(CH, {"messages": [{"role": "user", "content": "who %d" % seed}]}),
                       (C, {"prompt": "person %d:" % seed})]:
        body.update({"max_tokens": 400, "seed": seed, "temperature": 1.0, "response_format": RF})
        st, js, _ = post(port, path, body)
        check(st == 200, "json_schema %s: %d %s" % (path, st, js))
        ch = js["choices"][0]
        out = ch["message"]["content"] if path == CH else ch["text"]
        check(ch["finish_reason"] == "stop", "json_schema finishes when complete: %s" % js)
        check(valid(SCHEMA, json.loads(out)), "json_schema output validates: %s" % out)
# json_object: any object; streamed text parses too
st, _, evs = stream(port, CH, {"messages": [{"role": "user", "content": "obj"}], "max_tokens": 300,
                               "seed": 5, "response_format": {"type": "json_object"}, "stream": True})
txt = "".join(e["choices"][0]["delta"].get("content", "") for e in evs if e != "[DONE]" and e["choices"])
check(st == 200 and isinstance(json.loads(txt), dict), "json_object stream: %r" % txt)
# regex and choice (structured_outputs, and vLLM's older guided_* fields)
for extra, ok in [({"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}, lambda t: _re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
                  ({"guided_regex": "(ab|cd)+e"}, lambda t: _re.fullmatch("(ab|cd)+e", t)),
                  ({"structured_outputs": {"choice": ["yes", "no", "maybe"]}}, lambda t: t in ("yes", "no", "maybe")),
                  ({"guided_choice": ["left", "right"]}, lambda t: t in ("left", "right"))]:
    for seed in range(6):
        body = {"prompt": "q", "max_tokens": 50, "seed": seed}
        body.update(extra)
        st, js, _ = post(port, C, body)
        check(st == 200 and ok(js["choices"][0]["text"]), "%s: %s" % (extra, js))
# tools: required / named / auto / none, streamed deltas, conversation with tool messages
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "ping"}}]
msgs = [{"role": "user", "content": "weather?"}]
for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
    for seed in range(5):
        st, js, _ = post(port, CH, {"messages": msgs, "tools": TOOLS, "tool_choice": choice, "seed": seed,
                                    "max_tokens": 200})
        check(st == 200, "tools %s: %s" % (choice, js))
        ch = js["choices"][0]
        check(ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None, "tool answer %s" % js)
        tc = ch["message"]["tool_calls"]
        check(len(tc) == 1 and tc[0]["type"] == "function" and tc[0]["id"].startswith("call_"), "tool_calls %s" % tc)
        fn = tc[0]["function"]
        args = json.loads(fn["arguments"])
        if choice != "required":
            check(fn["name"] == "get_weather", "named tool %s" % fn)
        check((fn["name"] == "ping" and args == {}) or (fn["name"] == "get_weather" and valid(TOOLS[0]["function"]["parameters"], args)),
              "tool arguments validate: %s" % fn)
st, _, evs = stream(port, CH, {"messages": msgs, "tools": TOOLS, "tool_choice": "required", "seed": 1,
                               "max_tokens": 200, "stream": True})
deltas = [e["choices"][0] for e in evs if e != "[DONE]" and e["choices"]]
calls = [d["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["delta"]]
check(st == 200 and calls and calls[0]["id"].startswith("call_") and calls[0]["function"]["name"], "stream head %s" % calls)
args = "".join(c["function"].get("arguments", "") for c in calls)
check(isinstance(json.loads(args), dict) and deltas[-1]["finish_reason"] == "tool_calls", "stream args %r" % args)
for seed in range(4):  # auto: a call or text, never broken JSON
    st, js, _ = post(port, CH, {"messages": msgs, "tools": TOOLS, "seed": seed, "max_tokens": 60})
    ch = js["choices"][0]
    check(st == 200 and (ch["finish_reason"] == "tool_calls") == ("tool_calls" in ch["message"]), "auto %s" % js)
st, js, _ = post(port, CH, {"messages": msgs, "tools": TOOLS, "tool_choice": "none", "max_tokens": 5, "temperature": 0})
tools_line = {"role": "system", "content": "Tools: " + json.dumps(TOOLS, separators=(",", ":"))}
check(st == 200 and js["choices"][0]["message"]["content"] == greedy(chat_prompt([tools_line] + msgs), 5),
      "tool_choice none (the tools listed in the prompt) %s" % js)
check(js["usage"]["prompt_tokens"] == len(chat_prompt([tools_line] + msgs).encode()), "tools prompt tokens")
conv = msgs + [{"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"unit\":\"c\"}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "-3"}]
st, js, _ = post(port, CH, {"messages": conv, "tools": TOOLS, "tool_choice": "none", "max_tokens": 4})
check(st == 200, "conversation with tool messages %s" % js)
# refusals name the offending part
for path, body, param, frag in [
        (CH, {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"d": {"type": "string", "format": "date"}}}}}},
         "response_format", "response_format.json_schema.schema.properties.d: the keyword 'format' is not supported"),
        (C, {"prompt": "x", "structured_outputs": {"regex": "(a"}}, "structured_outputs", "structured_outputs.regex"),
        (C, {"prompt": "x", "structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs", "grammar"),
        (CH, {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"oneOf": []}}}}}], "tool_choice": "required"},
         "tools", "tools[0].function.parameters.properties.a: the keyword 'oneOf' is not supported"),
        (CH, {"messages": msgs, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice", "nope"),
        (CH, {"messages": [{"role": "tool", "content": "x"}]}, "messages", "tool_call_id"),
        (C, {"prompt": "x", "guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "only one"),
        (C, {"prompt": "x", "ignore_eos": True, "guided_choice": ["a"]}, "ignore_eos", "ignore_eos")]:
    st, js, _ = post(port, path, body)
    e = err_of(st, js, 400, param=param)
    check(frag in e["message"], "refusal message %r lacks %r" % (e["message"], frag))

# ---- metrics ---------------------------------------------------------------------
# (gauges are refreshed at the end of each scheduler iteration)
wait_for(lambda: metrics(port)["orch_kv_blocks_used"] == 0 and metrics(port)["orch_requests_running"] == 0, 5,
         "the pool to drain")
mv = metrics(port)
check(mv['orch_requests_total{endpoint="/v1/completions",status="200"}'] >= 64, "requests counter")
check(mv['orch_requests_total{endpoint="/v1/completions",status="400"}'] >= len(bad), "400 counter")
check(mv['orch_requests_total{endpoint="other",status="404"}'] >= 3, "404 counter")
check(mv["orch_kv_blocks_used"] == 0 and mv["orch_kv_blocks_capacity"] > 0, "kv gauges")
check(mv["orch_requests_running"] == 0 and mv["orch_requests_waiting"] == 0, "idle gauges")
check(mv["orch_generation_tokens_total"] > 500 and mv["orch_prompt_tokens_total"] > 500, "token counters")
check(mv["orch_time_to_first_token_seconds_count"] > 64, "ttft histogram")
check(mv["orch_e2e_request_latency_seconds_count"] > 64, "e2e histogram")
check(mv["orch_time_per_output_token_seconds_count"] > 0, "tpot histogram")
check(mv["orch_batch_size_count"] > 0 and mv['orch_batch_size_bucket{le="+Inf"}'] == mv["orch_batch_size_count"],
      "batch histogram")
check(mv["orch_preemptions_total"] == 0, "no preemption on a big pool")
print("api checks passed")
