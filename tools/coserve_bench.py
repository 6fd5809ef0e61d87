#!/usr/bin/env python3
"""coserve_bench.py - co-serving benchmark of `orch serve` (cpu engine): one
LoRA fine-tuning job trained inside the server while streaming completion
clients keep it busy, against the two ways of not co-serving. Everything is
measured in one run on one machine; it prints a Markdown table.

For each concurrency c (default 1, 4, 16):
  inference  the clients alone: time per output token (TPOT, the gaps
             between streamed tokens after the first) p50 / p99
  co-served  the clients and a running job, with --slo-tpot-ms set to 1.1x
             the inference-alone p99 at that concurrency: fine-tuning
             tokens/s (orch_finetune_tokens_total) and TPOT p50 / p99,
             token-level (--ft-granularity token: chunks of a micro-batch's
             forward and backward ride in the iterations; where the engine
             has ABI 1.5 streams) and with whole micro-batches
             (--ft-granularity sequence)
  temporal   the same job under --coserve-mode temporal: time sharing, one
             micro-batch alone after each inference pass (the baseline
             co-serving is compared with)
TPOT is measured by the clients (gaps between streamed tokens); "server p99"
is the server's own p99 iteration time over its last 256 decode iterations
(orch_coserve_tpot_p99_seconds), what its controller keeps under the target.
plus fine-tuning alone (no clients): the reference tokens/s.

usage: tools/coserve_bench.py [--orch build/orch] [--checkpoint DIR]
       [--seconds 8] [--concurrency 1,4,16] [--threads N] [--slo-ms MS]
       [--granularity auto|token|sequence]
Without --checkpoint it trains configs/default.json for a few steps (the
numbers do not depend on the weights) into a temporary directory.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid


def request(port, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


FT_SEQ_LEN = 64  # tokens per fine-tuning micro-batch (one row)


class Server:
    def __init__(self, orch, ckpt, threads, state, extra):
        self.log = open(os.path.join(state, "serve-%s.log" % uuid.uuid4().hex[:6]), "w+")
        cmd = [orch, "serve", "--checkpoint", ckpt, "--engine", "cpu", "--threads",
               str(threads), "--port", "0", "--model-name", "base", "--state-dir", state,
               "--ft-seq-len", str(FT_SEQ_LEN), "--ft-micro-batch", "1"] + extra
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        end = time.time() + 120
        while time.time() < end:
            self.log.seek(0)
            text = self.log.read()
            m = re.search(r"listening on http://[0-9.]+:(\d+)", text)
            if m and "orch serve: ready" in text:
                self.port = int(m.group(1))
                return
            if self.p.poll() is not None:
                raise SystemExit("orch serve exited:\n" + text)
            time.sleep(0.05)
        raise SystemExit("orch serve did not become ready")

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()


def upload(port, path):
    b = uuid.uuid4().hex
    data = open(path, "rb").read()
    body = (("--%s\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n"
             "--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ft.jsonl\"\r\n"
             "\r\n") % (b, b)).encode() + data + ("\r\n--%s--\r\n" % b).encode()
    st, out = request(port, "POST", "/v1/files", body,
                      {"Content-Type": "multipart/form-data; boundary=" + b})
    assert st == 200, out
    return json.loads(out)["id"]


def start_job(port, fid):
    st, out = request(port, "POST", "/v1/fine_tuning/jobs",
                      {"model": "base", "training_file": fid, "seed": 1,
                       "hyperparameters": {"n_epochs": 50, "batch_size": 4}})
    assert st == 200, out
    jid = json.loads(out)["id"]
    end = time.time() + 60
    while time.time() < end:
        j = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/" + jid)[1])
        if j["status"] == "running":
            return jid
        assert j["status"] in ("validating_files", "queued"), j
        time.sleep(0.05)
    raise SystemExit("the job did not start")


def metric(port, name):
    text = request(port, "GET", "/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def ft_tokens(port):
    return metric(port, "orch_finetune_tokens_total")


def client(port, stop, gaps, lock):
    body = {"model": "base", "prompt": "And God said, Let there be light", "max_tokens": 64,
            "temperature": 0, "stream": True, "ignore_eos": True}
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        last, mine = None, []
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                now = time.perf_counter()
                if ev.strip() == b"data: [DONE]":
                    continue
                if last is not None:
                    mine.append(now - last)
                last = now
        conn.close()
        with lock:
            gaps.extend(mine)


def load(port, c, seconds):
    stop, lock, gaps = threading.Event(), threading.Lock(), []
    ts = [threading.Thread(target=client, args=(port, stop, gaps, lock)) for _ in range(c)]
    for t in ts:
        t.start()
    time.sleep(min(2.0, seconds / 4))  # warm up
    with lock:
        del gaps[:]
    f0, t0 = ft_tokens(port), time.time()
    time.sleep(seconds)
    f1, t1 = ft_tokens(port), time.time()
    server_p99 = metric(port, "orch_coserve_tpot_p99_seconds") * 1e3
    factor = metric(port, "orch_coserve_budget_factor")
    ft_cost = metric(port, "orch_coserve_finetune_token_seconds") * 1e3
    with lock:
        g = sorted(gaps)
    stop.set()
    for t in ts:
        t.join()
    pct = lambda q: g[min(len(g) - 1, int(q * len(g)))] * 1e3 if g else float("nan")
    return {"p50": pct(0.50), "p99": pct(0.99), "ft": (f1 - f0) / (t1 - t0), "n": len(g),
            "server_p99": server_p99, "factor": factor, "ft_ms": ft_cost}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orch", default="build/orch")
    ap.add_argument("--checkpoint")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more orch serve argument for every phase (repeatable)")
    ap.add_argument("--only", default="",
                    help="comma list of columns to run: co,seq,temporal (default all)")
    ap.add_argument("--granularity", default="auto",
                    help="--ft-granularity of the first co-served column (default auto)")
    ap.add_argument("--slo-ms", type=float, default=0,
                    help="TPOT target of the co-served runs (default: 1.1x the "
                         "inference-alone p99 at each concurrency)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="coserve-bench-")
    try:
        ckpt = a.checkpoint
        if not ckpt:
            ckpt = os.path.join(tmp, "run")
            subprocess.run([a.orch, "train", "--config", "configs/default.json", "--out", ckpt,
                            "--steps", "5"], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        ft = os.path.join(tmp, "ft.jsonl")
        with open(ft, "w") as f:
            for i in range(64):
                f.write(json.dumps({"prompt": "Verse %d: " % i,
                                    "completion": "And God saw the light, that it was good. " * 2})
                        + "\n")
        rows = []

        def phase(extra, c, job):
            state = tempfile.mkdtemp(dir=tmp)
            s = Server(a.orch, ckpt, a.threads, state, extra + a.serve_arg)
            try:
                if job:
                    start_job(s.port, upload(s.port, ft))
                return load(s.port, c, a.seconds) if c else load_ft_only(s.port, a.seconds)
            finally:
                s.stop()

        def load_ft_only(port, seconds):
            f0, t0 = ft_tokens(port), time.time()
            time.sleep(seconds)
            return {"ft": (ft_tokens(port) - f0) / (time.time() - t0)}

        alone = phase([], 0, True)["ft"]
        for c in [int(x) for x in a.concurrency.split(",")]:
            inf = phase([], c, False)
            slo = a.slo_ms if a.slo_ms > 0 else 1.1 * inf["p99"]
            target = ["--slo-tpot-ms", "%.3f" % slo, "--slo-ttft-ms", "50"]
            only = a.only.split(",") if a.only else ["co", "seq", "temporal"]
            skip = {"ft": float("nan"), "p50": float("nan"), "p99": float("nan")}
            co = phase(target + ["--ft-granularity", a.granularity], c, True) \
                if "co" in only else skip
            cs = phase(target + ["--ft-granularity", "sequence"], c, True) \
                if "seq" in only else skip
            tmpo = phase(["--coserve-mode", "temporal"], c, True) if "temporal" in only else skip
            rows.append((c, inf, slo, co, cs, tmpo))
        cpu = "unknown CPU"
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        print("co-serving, cpu engine, model %s, %d cores (%s), %s" %
              ("configs/default.json" if not a.checkpoint else a.checkpoint, os.cpu_count(),
               cpu, time.strftime("%Y-%m-%d")))
        print("fine-tuning alone: %.0f tokens/s\n" % alone)
        pc = lambda x: 100 * x / alone if alone else 0
        print("| clients | inference TPOT p50 / p99 (ms) | SLO (ms) | co-served %s FT tok/s "
              "(%% of alone) | TPOT p50 / p99 (server p99) (ms) | co-served whole micro-batches "
              "FT tok/s (%% of alone) | TPOT p50 / p99 (server p99) (ms) | temporal FT tok/s "
              "(%% of alone) | "
              "TPOT p50 / p99 (ms) |" % a.granularity)
        print("|---|---|---|---|---|---|---|---|---|")
        for c, inf, slo, co, cs, tm in rows:
            sp = lambda r: r.get("server_p99", float("nan"))
            print("| %d | %.1f / %.1f | %.1f | %.0f (%.0f%%) | %.1f / %.1f (%.1f) | %.0f (%.0f%%) | "
                  "%.1f / %.1f (%.1f) | %.0f (%.0f%%) | %.1f / %.1f |" %
                  (c, inf["p50"], inf["p99"], slo, co["ft"], pc(co["ft"]), co["p50"], co["p99"],
                   sp(co), cs["ft"], pc(cs["ft"]), cs["p50"], cs["p99"], sp(cs), tm["ft"],
                   pc(tm["ft"]), tm["p50"], tm["p99"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
