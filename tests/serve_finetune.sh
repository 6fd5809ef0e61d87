#!/usr/bin/env bash
# serve_finetune.sh - fine-tuning jobs inside orch serve (co-serving):
#  - cpu engine: a job created through /v1/files + /v1/fine_tuning/jobs
#    trains while greedy base requests keep being answered, and those answers
#    stay exactly the base model's; the adapter it produces is bit for bit
#    the one `orch finetune` makes from the same data, seed and settings; the
#    fine-tuned model is served at once (its output equals `orch generate
#    --lora` of the saved adapter) and again after a restart; a job killed
#    (SIGKILL) after a checkpoint continues from it and ends with the same
#    adapter as an uninterrupted `orch finetune`; events,
#    checkpoints, trained_tokens and the Prometheus series; a cancelled job;
#    a job whose data the trainer refuses fails with the line number;
#  - mock engine: the official OpenAI Node client drives the same API;
#  - an engine without LoRA adapters: the API says so (404).
source "$(dirname "$0")/serve/common.sh"
ROOT=$(cd "$SERVE_DIR/../.." && pwd)
MODULES="$ROOT/data/node/node_modules"
[ -f "${ORCH_BUILD:-$(dirname "$ORCH_BIN")}/libengine_cpu.so" ] || { echo "skip: libengine_cpu.so is not built"; exit 77; }
cd "$T" || exit 1
for i in $(seq 1 200); do echo "And God said, Let there be light: and there was light. Verse $i of the day."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 >prep.log 2>&1 ||
  { cat prep.log; fail "orch prepare"; }
cat >cfg.json <<'JSON'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 64, "layers": 2,
            "heads": 2, "width": 32, "mlp_width": 128},
  "train": {"micro_batch": 8, "seq_len": 32, "max_steps": 120, "lr": 3e-3, "seed": 1,
            "warmup_steps": 5, "eval_every": 0, "eval_batches": 1, "checkpoint_every": 0},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "cpu", "threads": 1}
}
JSON
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { tail -n 5 train.log; fail "orch train"; }
for i in $(seq 1 32); do
  echo '{"prompt": "And God said, ", "completion": "the day of the day of the day."}'
  echo '{"text": "Verse 7 of the light. Verse 8 of the light."}'
done >ft.jsonl
printf '%s\n' '{"text": "fine"}' \
  '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 2}]}' >odd.jsonl
PROMPT="And God said, "
"$ORCH_BIN" generate --checkpoint run --engine cpu --threads 1 --prompt "$PROMPT" --max-tokens 24 \
  --temperature 0 --no-echo >gen_base.txt 2>gen.log || { cat gen.log; fail "generate"; }
FT=(--state-dir "$T/S" --ft-granularity sequence --ft-seq-len 48 --ft-micro-batch 2 --ft-lr 0.02 --ft-targets all --ft-rank 8 --ft-alpha 16
    --ft-checkpoint-every 8)

start_server cpu --checkpoint run --engine cpu --threads 1 --model-name tiny "${FT[@]}"
"$PY" - "$PORT" "$T/ft.jsonl" "$T/odd.jsonl" "$(cat gen_base.txt)" >job.out <<'PY' || { cat job.out; fail "jobs on the cpu engine"; }
import json, sys, threading, time
from client import post, request
import ft_job
port, train, odd, gen_base = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

def upload(path):
    return ft_job.upload(port, path)

def job(jid):
    st, _, out = request(port, "GET", "/v1/fine_tuning/jobs/" + jid)
    assert st == 200, out
    return json.loads(out)

def wait(jid, want, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        j = job(jid)
        if j["status"] in ("succeeded", "failed", "cancelled"):
            assert j["status"] == want, j
            return j
        time.sleep(0.05)
    raise AssertionError("job %s still %s" % (jid, job(jid)["status"]))

def base_text(model="tiny"):
    st, js, _ = post(port, "/v1/completions",
                     {"model": model, "prompt": "And God said, ", "max_tokens": 24, "temperature": 0})
    assert st == 200, js
    return js["choices"][0]["text"]

fid = upload(train)
st, js, _ = post(port, "/v1/fine_tuning/jobs",
                 {"model": "tiny", "training_file": fid, "validation_file": fid, "seed": 3,
                  "hyperparameters": {"n_epochs": 2, "batch_size": 4}})
assert st == 200 and js["status"] == "validating_files", js
jid = js["id"]
# inference keeps going, unchanged, while the job trains
seen, stop = [], threading.Event()
def infer():
    while not stop.is_set():
        seen.append(base_text())
t = threading.Thread(target=infer)
t.start()
done = wait(jid, "succeeded")
stop.set()
t.join()
assert seen and all(x == gen_base for x in seen), "base output changed during the job: %r" % seen[:3]
name = done["fine_tuned_model"]
assert name.startswith("ft:tiny:orch:") and done["trained_tokens"] > 0, done
assert done["hyperparameters"] == {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 1,
                                   "lora_rank": 8, "lora_alpha": 16}, done["hyperparameters"]
ev = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/%s/events?limit=100" % jid)[2])["data"]
msgs = [e["message"] for e in ev]
assert any(m.startswith("Step 32/32: training loss=") and "validation loss=" in m for m in msgs), msgs[:5]
last = [e for e in ev if e["message"].startswith("Step 32/32")][0]
assert last["data"]["valid_loss"] > 0 and last["data"]["valid_loss"] < 10, last
assert msgs[0].startswith("The job has successfully completed"), msgs[0]
ck = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/%s/checkpoints" % jid)[2])["data"]
assert [c["step_number"] for c in ck] == [32, 24, 16, 8], ck
assert ck[0]["fine_tuned_model_checkpoint"] == name, ck[0]
assert all("valid_loss" in c["metrics"] for c in ck), ck
assert ck[1]["fine_tuned_model_checkpoint"] == name + ":ckpt-step-24", ck[1]
models = [m["id"] for m in json.loads(request(port, "GET", "/v1/models")[2])["data"]]
assert models == ["tiny", name], models
print("NAME", name)
print("JOB", jid)
print("FID", fid)
print("FT", base_text(name))
# cancel a long job once it runs; nothing is served for it
st, js, _ = post(port, "/v1/fine_tuning/jobs",
                 {"model": "tiny", "training_file": fid, "hyperparameters": {"n_epochs": 50}})
long_id = js["id"]
end = time.time() + 60
while job(long_id)["status"] != "running" and time.time() < end:
    time.sleep(0.02)
st, js, _ = post(port, "/v1/fine_tuning/jobs/%s/cancel" % long_id, {})
assert st == 200 and js["status"] == "cancelled", js
st, js, _ = post(port, "/v1/fine_tuning/jobs/%s/cancel" % long_id, {})
assert st == 400 and "already ended (cancelled)" in js["error"]["message"], js
time.sleep(0.3)
assert job(long_id)["status"] == "cancelled" and job(long_id)["fine_tuned_model"] is None
# data the trainer refuses: the job fails naming the line
oid = upload(odd)
st, js, _ = post(port, "/v1/fine_tuning/jobs", {"model": "tiny", "training_file": oid})
bad = wait(js["id"], "failed")
assert bad["error"]["code"] == "invalid_file" and "line 2: " in bad["error"]["message"] and \
    '"weight" must be 0 or 1' in bad["error"]["message"], bad["error"]
st, _, m = request(port, "GET", "/metrics")
m = m.decode()
assert 'orch_finetune_jobs{status="succeeded"} 1' in m, m[-2000:]
tok = [l for l in m.splitlines() if l.startswith("orch_finetune_tokens_total ")]
assert tok and float(tok[0].split()[1]) > 0, tok
PY
NAME=$(sed -n 's/^NAME //p' job.out); JOB=$(sed -n 's/^JOB //p' job.out); FT_TEXT=$(sed -n 's/^FT //p' job.out)
FID=$(sed -n 's/^FID //p' job.out)
stop_server "$PID" || fail "exit (cpu)"

# the same adapter as orch finetune (same data, seed, micro-batches, schedule)
"$ORCH_BIN" finetune --checkpoint run --data ft.jsonl --out off --batch 2 --grad-accum 2 --seq-len 48 \
  --lr 0.02 --epochs 2 --seed 3 --rank 8 --alpha 16 --targets all --engine cpu --threads 1 >off.log 2>&1 ||
  { tail -n 5 off.log; fail "orch finetune"; }
"$PY" "$SERVE_DIR/safetensors_equal.py" "$T/S/adapters/$JOB/adapter_model.safetensors" off/adapter_model.safetensors ||
  fail "the server's adapter differs from orch finetune's"
"$ORCH_BIN" generate --checkpoint run --engine cpu --threads 1 --prompt "$PROMPT" --max-tokens 24 \
  --temperature 0 --no-echo --lora "$T/S/adapters/$JOB" >gen_ft.txt 2>>gen.log || { cat gen.log; fail "generate --lora"; }
[ "$(cat gen_ft.txt)" = "$FT_TEXT" ] || fail "served fine-tuned model '$FT_TEXT' != generate --lora '$(cat gen_ft.txt)'"
[ "$FT_TEXT" != "$(cat gen_base.txt)" ] || fail "the fine-tuned model answers as the base"

# token level on the cpu engine (ABI 1.5 streams; chunks of 7 or 14 rows (the
# 16-token iteration budget) riding in
# the iterations of 2 clients): the same adapter as orch finetune up to float
# rounding (the sums are split differently), base answers unchanged
start_server cpu-token --checkpoint run --engine cpu --threads 1 --model-name tiny --state-dir "$T/K" \
  --ft-granularity token --ft-chunk-tokens 7 --max-batch-tokens 16 --max-seqs 4 "${FT[@]:4}"
"$PY" "$SERVE_DIR/ft_job.py" "$PORT" "$T/ft.jsonl" tiny 3 2 4 2 >k.json || { cat k.json; fail "token-level job (cpu)"; }
curl -s "http://127.0.0.1:$PORT/metrics" >k.prom
stop_server "$PID" || fail "exit (cpu token)"
grep -q 'token-level, chunks of 7 rows' k.json && grep -q '"unchanged": true' k.json ||
  { cat k.json; fail "token-level job (cpu): events or base answers"; }
grep -qE '^orch_coserve_shared_passes_total [1-9]' k.prom || fail "no chunk rode in an inference pass"
KJOB=$(sed -E 's/.*"id": "([^"]+)".*/\1/' k.json)
"$PY" "$SERVE_DIR/safetensors_equal.py" "$T/K/adapters/$KJOB/adapter_model.safetensors" off/adapter_model.safetensors \
  --atol 1e-4 >k.diff || { cat k.diff; fail "the token-level adapter is not orch finetune's"; }
echo "token level vs orch finetune: $(cat k.diff)"

# a restart serves the fine-tuned model again
start_server again --checkpoint run --engine cpu --threads 1 --model-name tiny "${FT[@]}"
"$PY" - "$PORT" "$NAME" "$FT_TEXT" "$JOB" <<'PY' || fail "after a restart"
import json, sys
from client import post, request
port, name, ft_text, jid = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
j = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/" + jid)[2])
assert j["status"] == "succeeded" and j["fine_tuned_model"] == name, j
st, js, _ = post(port, "/v1/completions",
                 {"model": name, "prompt": "And God said, ", "max_tokens": 24, "temperature": 0})
assert st == 200 and js["choices"][0]["text"] == ft_text, js
PY
# a long job killed (SIGKILL) after a checkpoint continues from it
"$PY" - "$PORT" "$FID" <<'PY' >long.out || { cat long.out; fail "long job"; }
import json, sys, time
from client import post, request
port, fid = int(sys.argv[1]), sys.argv[2]
st, js, _ = post(port, "/v1/fine_tuning/jobs",
                 {"model": "tiny", "training_file": fid, "seed": 5,
                  "hyperparameters": {"n_epochs": 20, "batch_size": 4}})
assert st == 200, js
jid = js["id"]
end = time.time() + 60
while time.time() < end:
    ck = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/%s/checkpoints" % jid)[2])["data"]
    if ck:
        break
    time.sleep(0.01)
assert ck, "no checkpoint within 60 s: %s" % request(port, "GET", "/v1/fine_tuning/jobs/" + jid)[2]
j = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/" + jid)[2])
assert j["status"] == "running", j
print(jid)
PY
LONG=$(cat long.out)
kill -9 "$PID"; wait "$PID" 2>/dev/null
start_server resumed --checkpoint run --engine cpu --threads 1 --model-name tiny "${FT[@]}"
"$PY" - "$PORT" "$LONG" <<'PY' || fail "resumed job"
import json, sys, time
from client import request
import ft_job
port, jid = int(sys.argv[1]), sys.argv[2]
end = time.time() + 120
while time.time() < end:
    j = json.loads(request(port, "GET", "/v1/fine_tuning/jobs/" + jid)[2])
    if j["status"] in ("succeeded", "failed", "cancelled"):
        break
    time.sleep(0.05)
assert j["status"] == "succeeded", j
ev = ft_job.events(port, jid)
assert any(m.startswith("Resumed from the checkpoint of step ") for m in ev), ev[-8:]
assert sum(m.startswith("Step 320/320") for m in ev) == 1, "steps twice?"

PY
stop_server "$PID" || fail "exit (resumed)"
"$ORCH_BIN" finetune --checkpoint run --data ft.jsonl --out off20 --batch 2 --grad-accum 2 --seq-len 48 \
  --lr 0.02 --epochs 20 --seed 5 --rank 8 --alpha 16 --targets all --engine cpu --threads 1 >off20.log 2>&1 ||
  { tail -n 5 off20.log; fail "orch finetune (20 epochs)"; }
"$PY" "$SERVE_DIR/safetensors_equal.py" "$T/S/adapters/$LONG/adapter_model.safetensors" off20/adapter_model.safetensors ||
  fail "the resumed job's adapter differs from orch finetune's"

# token-level fine-tuning (ABI 1.5 streams) on the mock engine, whose streams
# give adapter_forward_backward's bits: chunks of 5 rows riding in the
# inference iterations of 2 clients make the same adapter, bit for bit, as
# whole micro-batches; time sharing never puts both in one engine call
for g in token sequence temporal; do
  case $g in
    temporal) GOPT=(--coserve-mode temporal) ;;
    sequence) GOPT=(--ft-granularity sequence) ;;
    *) GOPT=(--ft-granularity "$g" --ft-chunk-tokens 5) ;;
  esac
  start_server "mock-$g" --state-dir "$T/G$g" --ft-seq-len 32 --ft-micro-batch 2 "${GOPT[@]}"
  "$PY" "$SERVE_DIR/ft_job.py" "$PORT" "$T/ft.jsonl" mock-gpt2 4 2 4 2 >"g_$g.json" ||
    { cat "g_$g.json"; fail "mock job ($g)"; }
  curl -s "http://127.0.0.1:$PORT/metrics" >"g_$g.prom"
  stop_server "$PID" || fail "exit (mock $g)"
done
"$PY" - "$T" <<'PY' || fail "token-level jobs on the mock engine"
import json, re, sys
t = sys.argv[1]
def load(g):
    j = json.load(open("%s/g_%s.json" % (t, g)))
    prom = open("%s/g_%s.prom" % (t, g)).read()
    shared = re.search(r"^orch_coserve_shared_passes_total (\S+)$", prom, re.M)
    j["shared"] = float(shared.group(1)) if shared else -1
    return j
tok, seq, tmp = load("token"), load("sequence"), load("temporal")
started = [m for m in tok["events"] if m.startswith("Fine-tuning job started")]
assert started and "token-level, chunks of 5 rows" in started[0], started
assert any("time sharing" in m for m in tmp["events"]), tmp["events"][-3:]
for j in (tok, seq, tmp):
    assert j["completions"] > 0 and j["unchanged"], j
assert tok["shared"] > 0, tok["shared"]   # rows rode in inference iterations
assert tmp["shared"] == 0, tmp["shared"]  # never in the same call
PY
for g in token temporal; do
  "$PY" "$SERVE_DIR/safetensors_equal.py" "$T/Gsequence/adapters/$(sed -E 's/.*"id": "([^"]+)".*/\1/' g_sequence.json)/adapter_model.safetensors" \
    "$T/G$g/adapters/$(sed -E 's/.*"id": "([^"]+)".*/\1/' "g_$g.json")/adapter_model.safetensors" ||
    fail "the $g job's adapter differs from whole micro-batches'"
done
# a failing coserve_step fails the job with the engine's message; inference
# requests of that iteration are run again alone and succeed (and
# --ft-no-packing gives each example a row of its own)
start_server mock-fault --state-dir "$T/GF" --ft-seq-len 32 --ft-micro-batch 2 --ft-granularity token \
  --engine-options fault=coserve_step:4 --ft-no-packing
"$PY" "$SERVE_DIR/ft_job.py" "$PORT" "$T/ft.jsonl" mock-gpt2 4 2 4 2 failed >g_fault.json ||
  { cat g_fault.json; fail "mock job with a failing coserve_step"; }
grep -q 'rows of 32 tokens (one example per row)' g_fault.json || { cat g_fault.json; fail "--ft-no-packing"; }
grep -q 'injected fault in coserve_step' g_fault.json || { cat g_fault.json; fail "fault message"; }
grep -q '"unchanged": true' g_fault.json || { cat g_fault.json; fail "inference during the fault"; }
stop_server "$PID" || fail "exit (mock fault)"
"$ORCH_BIN" serve --engine mock --port 0 --state-dir "$T/B" --coserve-mode temporal --ft-granularity token >bad.log 2>&1 &&
  fail "--ft-granularity token with temporal accepted"
grep -q "time sharing runs whole micro-batches" bad.log || { cat bad.log; fail "temporal+token message"; }
"$ORCH_BIN" serve --engine mock --port 0 --state-dir "$T/B" --ft-granularity sequence --ft-chunk-tokens 4 \
  >bad.log 2>&1 && fail "--ft-chunk-tokens with whole micro-batches accepted"
grep -q "applies to token-level fine-tuning only" bad.log || { cat bad.log; fail "--ft-chunk-tokens message"; }
"$ORCH_BIN" serve --engine mock --port 0 --ft-rank 4 >bad.log 2>&1 &&
  fail "--ft-rank without fine-tuning jobs (no --state-dir) accepted"
grep -q -- "--ft-rank: no fine-tuning jobs on this server" bad.log || { cat bad.log; fail "--ft-rank message"; }
"$ORCH_BIN" serve --engine mock --port 0 --state-dir "$T/B" --ft-granularity bits >bad.log 2>&1 &&
  fail "--ft-granularity bits accepted"
grep -q "expected auto, token or sequence" bad.log || { cat bad.log; fail "--ft-granularity message"; }
"$ORCH_BIN" serve --checkpoint run --port 0 --state-dir "$T/B" --engine "$ORCH_BUILD/tests/engines/abi11_mock.so" \
  --ft-granularity token >bad.log 2>&1 && fail "--ft-granularity token on an engine without streams accepted"
grep -q "no fine-tuning jobs on this server" bad.log || { cat bad.log; fail "--ft-granularity token without adapters message"; }

# the official Node client, on the mock engine
if command -v node >/dev/null && [ -f "$MODULES/openai/package.json" ]; then
  printf '%s\n' '{"prompt":"Hi ","completion":"there"}' '{"text":"abcabc"}' '{"prompt":"x","completion":"yz"}' >mock.jsonl
  start_server node --state-dir "$T/M" --api-key sekret --ft-seq-len 32
  node "$ROOT/tests/openai_client/finetune_test.mjs" "http://127.0.0.1:$PORT/v1" "$MODULES" "$T/mock.jsonl" \
    >node.out 2>&1 || { cat node.out; fail "openai node client"; }
  stop_server "$PID" || fail "exit (node)"
else
  echo "note: node or npm openai absent: the Node client part is skipped"
fi

# an engine without LoRA adapters
start_server old --checkpoint run --engine "$ORCH_BUILD/tests/engines/abi11_mock.so" --state-dir "$T/O"
r=$(curl -s -w ' %{http_code}' "http://127.0.0.1:$PORT/v1/fine_tuning/jobs")
[[ $r == *"has no LoRA adapters"*" 404" ]] || fail "jobs on an engine without adapters: $r"
stop_server "$PID" || fail "exit (old)"
# bad co-serving settings are refused at start
"$ORCH_BIN" serve --checkpoint run --engine cpu --port 0 --state-dir "$T/B" --coserve-mode bogus >bad.log 2>&1 &&
  fail "--coserve-mode bogus accepted"
grep -q "expected shared" bad.log || { cat bad.log; fail "--coserve-mode message"; }
"$ORCH_BIN" serve --checkpoint run --engine cpu --port 0 --state-dir "$T/B" --ft-seq-len 999 >bad.log 2>&1 &&
  fail "--ft-seq-len over the context accepted"
grep -q "over the model's context (64)" bad.log || { cat bad.log; fail "--ft-seq-len message"; }
"$ORCH_BIN" serve --checkpoint run --engine cpu --port 0 --state-dir "$T/B" --ft-targets q_proj >bad.log 2>&1 &&
  fail "--ft-targets q_proj accepted on gpt2"
grep -q -- "--ft-targets" bad.log || { cat bad.log; fail "--ft-targets message"; }
echo "serve_finetune: ok"
