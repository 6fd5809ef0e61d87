#!/usr/bin/env python3
"""bench_structured.py [ORCH_BIN [SERVE_ARGS...]] - structured-output overhead on
the mock engine.

Starts `orch serve --engine=mock` (its built-in byte-vocabulary model; with
SERVE_ARGS instead `orch serve --engine=mock SERVE_ARGS`, e.g. `--checkpoint
RUN` for a checkpoint with the GPT-2 vocabulary), then runs sequential /v1/completions
requests: unconstrained (sampled, temperature 1) and constrained by a JSON
Schema with long fixed keys (response_format json_schema). Prints, from the
server's own metrics (so HTTP time is left out):
  - mean time per output token (orch_time_per_output_token_seconds) of each,
    and the constrained/unconstrained ratio (mask + jump-forward overhead);
  - the structured time per sampling step (forced tokens excluded), i.e.
    the mask cost alone, against the unconstrained time per token;
  - tokens appended by jump-forward (orch_jump_forward_tokens_total) as a
    share of all generated tokens: the sampling steps saved.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

ORCH = sys.argv[1] if len(sys.argv) > 1 else "build/orch"
EXTRA = sys.argv[2:]
N = 60

SCHEMA = {"type": "object", "properties": {
    "customer_account_identifier": {"type": "integer", "minimum": 0, "maximum": 99999},
    "shipping_address_postal_code": {"type": "string", "maxLength": 8},
    "preferred_delivery_time_window": {"enum": ["morning", "afternoon", "evening"]},
    "is_priority_subscription_member": {"type": "boolean"},
    "order_line_items": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "stock_keeping_unit_code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "requested_quantity": {"type": "integer", "minimum": 1, "maximum": 20}},
        "required": ["stock_keeping_unit_code", "requested_quantity"], "additionalProperties": False}}},
    "required": ["customer_account_identifier", "shipping_address_postal_code",
                 "preferred_delivery_time_window", "is_priority_subscription_member", "order_line_items"],
    "additionalProperties": False}


def post(port, body):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def metrics(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def phase(port, body_of):
    m0 = metrics(port)
    toks = 0
    for i in range(N):
        js = post(port, body_of(i))
        toks += js["usage"]["completion_tokens"]
    m1 = metrics(port)
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    tpot = d("orch_time_per_output_token_seconds_sum") / max(d("orch_time_per_output_token_seconds_count"), 1)
    return tpot, toks, d("orch_jump_forward_tokens_total"), d("orch_generation_tokens_total")


def main():
    log = tempfile.NamedTemporaryFile(delete=False, suffix=".log")
    srv = subprocess.Popen([ORCH, "serve", "--engine=mock", "--port", "0"] + EXTRA, stderr=log)
    try:
        port = None
        for _ in range(400):
            m = re.search(r"listening on http://[0-9.]+:([0-9]+)", open(log.name).read())
            if m and "ready" in open(log.name).read():
                port = int(m.group(1))
                break
            time.sleep(0.05)
        if not port:
            sys.exit("server did not start")
        rf = {"type": "json_schema", "json_schema": {"name": "order", "schema": SCHEMA}}
        post(port, {"prompt": "warm", "max_tokens": 400, "response_format": rf})  # compile once
        con = phase(port, lambda i: {"prompt": "order %d:" % i, "max_tokens": 400, "seed": i,
                                     "response_format": rf})
        per_req = max(1, con[1] // N)
        unc = phase(port, lambda i: {"prompt": "order %d:" % i, "max_tokens": per_req, "seed": i})
        cpu = ""
        try:
            cpu = re.search(r"Model name:\s*(.*)", subprocess.run(["lscpu"], capture_output=True,
                                                                   text=True).stdout).group(1).strip()
        except Exception:  # noqa: BLE001 - informational only
            pass
        vocab = re.search(r"vocab ([0-9]+)", open(log.name).read())
        print("cpu: %s; vocabulary: %s tokens" % (cpu, vocab.group(1) if vocab else "?"))
        print("requests: %d per mode, %d output tokens per request (mean)" % (N, per_req))
        print("unconstrained: %.2f us per output token" % (unc[0] * 1e6))
        print("structured:    %.2f us per output token (mask + jump-forward)" % (con[0] * 1e6))
        print("ratio structured/unconstrained: %.3f" % (con[0] / unc[0] if unc[0] else float("nan")))
        sampled = max(con[3] - con[2], 1)
        step = con[0] * con[3] / sampled
        print("structured per sampling step (forced tokens excluded): %.2f us (%.3f x unconstrained)" %
              (step * 1e6, step / unc[0] if unc[0] else float("nan")))
        print("jump-forward: %d of %d generated tokens (%.1f%%) appended without a sampling step" %
              (con[2], con[3], 100.0 * con[2] / max(con[3], 1)))
    finally:
        srv.terminate()
        srv.wait()
        os.unlink(log.name)


if __name__ == "__main__":
    main()
