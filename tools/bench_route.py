#!/usr/bin/env python3
"""bench_route.py - the load of tools/bench_route.sh against one `orch route`
(standard library only): P shared system prompts x Q questions each, as chat
completions, shuffled with a fixed seed, sent at a fixed concurrency over
keep-alive connections. Prints one JSON line:

  {"requests", "ok", "seconds", "req_per_s", "completion_tok_per_s",
   "prompt_tokens", "cached_tokens", "hit_rate", "p50_s", "p99_s",
   "router_match_mean", "per_worker"}

cached_tokens / hit_rate come from the workers' answers
(usage.prompt_tokens_details.cached_tokens); when no answer carries that
field they are null ("unavailable"), never estimated. router_match_mean is
the router's own radix-tree estimate (orch_route_cache_match_ratio), not a
measurement of any cache.

usage: bench_route.py PORT [--prompts 16] [--questions 16] [--concurrency 32]
                           [--max-tokens 16] [--system-len 600] [--seed 1]
"""
import argparse
import http.client
import json
import queue
import random
import threading
import time

WORDS = ("alpha beta gamma delta kernel cache block token router worker prefix tree "
         "batch decode prompt system answer model layer head query value shard").split()


def workload(a):
    rng = random.Random(a.seed)
    systems = []
    for p in range(a.prompts):
        words = []
        while len(" ".join(words)) < a.system_len:
            words.append(rng.choice(WORDS))
        systems.append("System prompt %d: %s" % (p, " ".join(words))[: a.system_len])
    reqs = []
    for p in range(a.prompts):
        for q in range(a.questions):
            question = "Question %d about %s and %s?" % (q, rng.choice(WORDS), rng.choice(WORDS))
            reqs.append({"messages": [{"role": "system", "content": systems[p]},
                                      {"role": "user", "content": question}],
                         "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True})
    rng.shuffle(reqs)
    return reqs


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    return vals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--system-len", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    reqs = workload(a)
    work = queue.Queue()
    for r in reqs:
        work.put(r)
    lock = threading.Lock()
    out = {"ok": 0, "failed": 0, "prompt": 0, "completion": 0, "cached": 0, "has_cached": False, "lat": []}

    def worker():
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
        while True:
            try:
                r = work.get_nowait()
            except queue.Empty:
                break
            t0 = time.time()
            try:
                conn.request("POST", "/v1/chat/completions", body=json.dumps(r),
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                st = resp.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
                st, data = 0, b""
            dt = time.time() - t0
            with lock:
                if st != 200:
                    out["failed"] += 1
                    continue
                u = json.loads(data)["usage"]
                out["ok"] += 1
                out["prompt"] += u["prompt_tokens"]
                out["completion"] += u["completion_tokens"]
                det = u.get("prompt_tokens_details")
                if isinstance(det, dict) and "cached_tokens" in det:
                    out["has_cached"] = True
                    out["cached"] += det["cached_tokens"] or 0
                out["lat"].append(dt)
        conn.close()

    m0 = metrics(a.port)
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.time() - t0
    m1 = metrics(a.port)
    lat = sorted(out["lat"]) or [0.0]
    cnt = m1.get("orch_route_cache_match_ratio_count", 0) - m0.get("orch_route_cache_match_ratio_count", 0)
    ssum = m1.get("orch_route_cache_match_ratio_sum", 0) - m0.get("orch_route_cache_match_ratio_sum", 0)
    per_worker = {k.split('"')[1]: int(v - m0.get(k, 0)) for k, v in m1.items()
                  if k.startswith("orch_route_requests_total{")}
    res = {
        "requests": len(reqs), "ok": out["ok"], "failed": out["failed"], "seconds": round(secs, 3),
        "req_per_s": round(out["ok"] / secs, 3),
        "completion_tok_per_s": round(out["completion"] / secs, 1),
        "prompt_tokens": out["prompt"],
        "cached_tokens": out["cached"] if out["has_cached"] else None,
        "hit_rate": round(out["cached"] / out["prompt"], 4) if out["has_cached"] and out["prompt"] else None,
        "p50_s": round(lat[len(lat) // 2], 3), "p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3),
        "router_match_mean": round(ssum / cnt, 4) if cnt else None,
        "per_worker": per_worker,
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
