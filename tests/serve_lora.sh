#!/usr/bin/env bash
# serve_lora.sh - LoRA adapters served next to their base (cpu engine): a
# tiny model trained with `orch train`, an adapter made by `orch finetune`,
# `orch serve --lora NAME=DIR`: /v1/models lists the adapter with its parent,
# a request for the adapter gives the adapter's output (not the base's) and
# the same output alone and in a batch mixed with base requests, the base's
# output is unchanged by the adapter being loaded; run-time loading
# (--enable-lora-loading; refused without it), unloading (then 404), and the
# refusals: a bad --lora, a missing directory, an adapter trained on another
# base (fingerprint), a name already served.
source "$(dirname "$0")/serve/common.sh"
[ -f "${ORCH_BUILD:-$(dirname "$ORCH_BIN")}/libengine_cpu.so" ] || { echo "skip: libengine_cpu.so is not built"; exit 77; }
cd "$T" || exit 1
for i in $(seq 1 200); do echo "And God said, Let there be light: and there was light. Verse $i of the day."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; fail "orch prepare"; }
mkcfg() { # seed
  cat <<JSON
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 64, "layers": 2,
            "heads": 2, "width": 32, "mlp_width": 128},
  "train": {"micro_batch": 8, "seq_len": 32, "max_steps": 120, "lr": 3e-3, "seed": $1,
            "warmup_steps": 5, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "cpu", "threads": 1}
}
JSON
}
mkcfg 1 >cfg1.json
mkcfg 2 >cfg2.json
"$ORCH_BIN" train --config cfg1.json --out run >train.log 2>&1 || { tail -n 5 train.log; fail "orch train"; }
"$ORCH_BIN" train --config cfg2.json --out other >train2.log 2>&1 || { tail -n 5 train2.log; fail "orch train (other)"; }
for i in $(seq 1 64); do echo '{"prompt": "And God said, ", "completion": "the day of the day of the day."}'; done >ft.jsonl
"$ORCH_BIN" finetune --checkpoint run --data ft.jsonl --out ad --max-steps 60 --lr 0.02 --rank 8 \
  --targets all --batch 8 --seq-len 48 --engine cpu --threads 1 >ft.log 2>&1 || { tail -n 5 ft.log; fail "orch finetune"; }
[ -f ad/adapter_model.safetensors ] || fail "no adapter written"
# the references: orch generate with and without the adapter
PROMPT="And God said, "
"$ORCH_BIN" generate --checkpoint run --engine cpu --threads 1 --prompt "$PROMPT" --max-tokens 24 \
  --temperature 0 --no-echo >gen_base.txt 2>gen.log || { cat gen.log; fail "generate"; }
"$ORCH_BIN" generate --checkpoint run --engine cpu --threads 1 --prompt "$PROMPT" --max-tokens 24 \
  --temperature 0 --no-echo --lora ad >gen_ad.txt 2>>gen.log || { cat gen.log; fail "generate --lora"; }
cmp -s gen_base.txt gen_ad.txt && fail "the adapter changes nothing in orch generate"
"$ORCH_BIN" generate --checkpoint other --engine cpu --prompt x --lora ad >gen_bad.txt 2>&1 &&
  fail "generate --lora on another base"
grep -q "another base model" gen_bad.txt || { cat gen_bad.txt; fail "generate --lora message"; }

# refusals at start
"$ORCH_BIN" serve --checkpoint run --engine cpu --port 0 --lora nodir >bad1.log 2>&1 && fail "--lora without '='"
grep -q "expected NAME=DIR" bad1.log || { cat bad1.log; fail "--lora message"; }
"$ORCH_BIN" serve --checkpoint run --engine cpu --port 0 --lora x="$T/none" >bad2.log 2>&1 && fail "missing dir"
grep -q -- "--lora x=$T/none" bad2.log || { cat bad2.log; fail "missing dir message"; }
"$ORCH_BIN" serve --checkpoint other --engine cpu --port 0 --lora x=ad >bad3.log 2>&1 && fail "foreign base"
grep -q "another base model" bad3.log || { cat bad3.log; fail "foreign base message"; }
"$ORCH_BIN" serve --checkpoint run --engine cpu --port 0 --model-name tiny --lora tiny=ad >bad4.log 2>&1 && fail "name taken"
grep -q "a model named 'tiny' is already served" bad4.log || { cat bad4.log; fail "taken message"; }

start_server plain --checkpoint run --engine cpu --threads 1 --model-name tiny
"$PY" - "$PORT" <<'PY' >base_plain.txt || fail "base request"
import sys
from client import post
st, js, _ = post(int(sys.argv[1]), "/v1/completions",
                 {"model": "tiny", "prompt": "And God said, ", "max_tokens": 24, "temperature": 0})
assert st == 200, js
print(js["choices"][0]["text"], end="")
PY
[ "$(cat base_plain.txt)" = "$(cat gen_base.txt)" ] || fail "base: server and orch generate differ"

r=$(curl -s -w ' %{http_code}' -H 'Content-Type: application/json' -d '{"lora_name":"a","lora_path":"ad"}' \
  "http://127.0.0.1:$PORT/v1/load_lora_adapter")
[[ $r == *"no adapters"*" 404" ]] || fail "load without adapters: $r"
stop_server "$PID" || fail "exit (plain)"

start_server lora --checkpoint run --engine cpu --threads 1 --model-name tiny --lora ad=ad
"$PY" - "$PORT" "$(cat base_plain.txt)" "$T/ad" "$(cat gen_ad.txt)" <<'PY' || fail "adapter serving"
import sys, threading
from client import post, request
import json
port, base_plain, ad_dir, gen_ad = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
st, _, body = request(port, "GET", "/v1/models")
models = json.loads(body)["data"]
assert [m["id"] for m in models] == ["tiny", "ad"], models
assert models[1]["parent"] == "tiny" and models[1]["root"] == "ad", models[1]
st, _, body = request(port, "GET", "/v1/models/ad")
assert st == 200 and json.loads(body)["parent"] == "tiny", body
def comp(model, prompt="And God said, "):
    st, js, _ = post(port, "/v1/completions",
                     {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0})
    assert st == 200, js
    assert js["model"] == model, js
    return js["choices"][0]["text"]
base, ad = comp("tiny"), comp("ad")
assert base == base_plain, (base, base_plain)
assert ad == gen_ad, "server %r, orch generate --lora %r" % (ad, gen_ad)
assert ad != base, "the adapter changed nothing: %r" % ad
# mixed batches: each request its own model's output
out = {}
def worker(k, model):
    out[k] = comp(model)
ts = [threading.Thread(target=worker, args=(k, "ad" if k % 2 else "tiny")) for k in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
for k in range(8):
    assert out[k] == (ad if k % 2 else base), (k, out[k])
st, js, _ = post(port, "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
assert st == 404 and "does not exist" in js["error"]["message"], js
st, js, _ = post(port, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": ad_dir})
assert st == 403 and "--enable-lora-loading" in js["error"]["message"], js
PY
stop_server "$PID" || fail "exit (lora)"

start_server rt --checkpoint run --engine cpu --threads 1 --model-name tiny --enable-lora-loading
"$PY" - "$PORT" "$T/ad" "$T/other" "$(cat gen_ad.txt)" <<'PY' || fail "run-time loading"
import sys, json
from client import post, request
port, ad_dir, other, gen_ad = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
def comp(model):
    st, js, _ = post(port, "/v1/completions",
                     {"model": model, "prompt": "And God said, ", "max_tokens": 24, "temperature": 0})
    return st, js
st, js, _ = post(port, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": ad_dir})
assert st == 200 and js["status"] == "loaded", js
ids = [m["id"] for m in json.loads(request(port, "GET", "/v1/models")[2])["data"]]
assert ids == ["tiny", "b"], ids
st, js = comp("b")
assert st == 200 and js["choices"][0]["text"] == gen_ad, js
for body, code, want in [
        ({"lora_name": "b", "lora_path": ad_dir}, 400, "already served"),
        ({"lora_name": "c", "lora_path": other}, 400, "adapter_config.json"),
        ({"lora_name": "c"}, 400, "'lora_path' is required"),
        ({"lora_name": "c", "lora_path": ad_dir, "x": 1}, 400, "unknown field 'x'"),
        ({"lora_name": "bad name", "lora_path": ad_dir}, 400, "printable characters")]:
    st, js, _ = post(port, "/v1/load_lora_adapter", body)
    assert st == code and want in js["error"]["message"], (body, st, js)
st, js, _ = post(port, "/v1/unload_lora_adapter", {"lora_name": "b"})
assert st == 200 and js["status"] == "unloaded", js
st, js = comp("b")
assert st == 404, js
st, js, _ = post(port, "/v1/unload_lora_adapter", {"lora_name": "b"})
assert st == 404 and "no adapter named 'b'" in js["error"]["message"], js
# loaded again under the same name: a new engine adapter, same output
st, js, _ = post(port, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": ad_dir})
assert st == 200, js
st, js = comp("b")
assert st == 200 and js["choices"][0]["text"] == gen_ad, js
PY
stop_server "$PID" || fail "exit (rt)"
echo "serve_lora: ok"
