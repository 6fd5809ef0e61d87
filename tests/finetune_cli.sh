#!/usr/bin/env bash
# finetune_cli.sh - `orch finetune` end to end on the mock engine (its LoRA
# adapters: engines/mock/mock_engine.c), from a tiny base checkpoint with the
# byte tokenizer:
#  - --help; a run on a mix of prompt/completion, messages and text lines:
#    the loss falls (last step below a third of the first), metrics.jsonl has
#    one line per step with val_loss on evaluation steps, DIR holds the PEFT
#    files, latest and the checkpoint;
#  - the PEFT files as Python reads them: python3's json over the
#    safetensors header and adapter_config.json (PEFT itself when python3 has
#    peft, torch and transformers; this machine's Debian python has not:
#    the script says which it did); a llama base (GQA): PEFT's llama names
#    and shapes, fan_in_fan_out false, a partial q/k/v group refused;
#  - early stopping (patience 3, an evaluation every step): the run stops
#    3 evaluations after its best, with a checkpoint;
#  - --config FILE: its settings used, the flags given win, unknown keys
#    refused;
#  - exact resume: --stop-after then --resume; SIGTERM mid-run (exit 3) then
#    --resume; SIGKILL mid-run then --resume from the last periodic
#    checkpoint: metrics.jsonl (without timings) and the adapter bytes equal
#    the uninterrupted run's;
#  - a full disk (ORCH_FSIO_FAULT=enospc:K, and short:K, for every
#    write-side file-system call K of a resumed step and its save): the run
#    fails (or, at a cleanup call, succeeds) and DIR's adapter files are the
#    previous adapter or the new one, byte for byte, never a mix or a torn
#    file; `latest` names a complete checkpoint that resumes;
#  - one-line refusals (exit 2): a bad JSONL line with its line number, an
#    engine without LoRA adapters (an ABI 1.1 engine; the cpu engine until
#    it has adapters), rank above the
#    width, gpt2 attn_out without mlp_down, a fresh run into a used DIR,
#    --resume with a setting, an adapter for another base on resume;
#  - the CPU engine (when built with adapters): the loss falls, the PEFT
#    header equals the mock's, --stop-after + --resume is bit-exact.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BUILD=${ORCH_BUILD:-build}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$ORCH_BUILD}
unset ORCH_FSIO_FAULT ORCH_MOCK_FAULT ORCH_MOCK_SLEEP_MS
# /dev/shm when there is one: the disk-full loop makes hundreds of fsyncs.
work=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
cd "$work" || exit 1

for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prepare.log 2>&1 || { cat prepare.log; echo "FAIL: orch prepare"; exit 1; }
cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 64, "layers": 2,
            "heads": 2, "width": 16, "mlp_width": 64},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 2, "lr": 1e-3,
            "eval_every": 2, "eval_batches": 1, "checkpoint_every": 2},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
"$ORCH_BIN" train --config cfg.json --out base >base.log 2>&1 || { cat base.log; echo "FAIL: base"; exit 1; }
"$ORCH_BIN" train --config cfg.json --out base2 --set train.seed=99 >base2.log 2>&1 ||
  { cat base2.log; echo "FAIL: base2"; exit 1; }

"$PY" - <<'EOF'
import json
with open("train.jsonl", "w") as f:
    for i in range(48):
        k = i % 3
        if k == 0:
            f.write(json.dumps({"prompt": f"Q{i}: {i}+1?", "completion": f" {i+1}"}) + "\n")
        elif k == 1:
            f.write(json.dumps({"messages": [{"role": "user", "content": f"say {i}"},
                                             {"role": "assistant", "content": f"{i}!"}]}) + "\n")
        else:
            f.write(json.dumps({"text": f"{i} is {'even' if i % 2 == 0 else 'odd'}"}) + "\n")
with open("val.jsonl", "w") as f:
    for i in range(48, 56):
        f.write(json.dumps({"prompt": f"Q{i}: {i}+1?", "completion": f" {i+1}"}) + "\n")
EOF

run=(finetune --checkpoint base --data train.jsonl --validation val.jsonl --epochs 6
     --lr 0.05 --seq-len 48 --batch 2 --grad-accum 2 --rank 4 --alpha 8 --targets all
     --eval-every 5 --checkpoint-every 4 --seed 7)
figures() { sed -E 's/,"tokens_per_s":[^,}]*//; s/,"elapsed":[^,}]*//' "$1"; }

# ---- --help -----------------------------------------------------------------
"$ORCH_BIN" finetune --help >help.txt 2>&1 && grep -q -- "--validation" help.txt &&
  grep -q -- "--targets" help.txt && grep -q "PEFT" help.txt || fail "finetune --help"

# ---- the straight run ---------------------------------------------------------
"$ORCH_BIN" "${run[@]}" --out ref >ref.log 2>&1 || { cat ref.log; fail "reference run"; }
steps=$(wc -l <ref/metrics.jsonl)
grep -q "| [0-9]* steps |" ref.log || fail "no step count in the banner"
want=$(sed -nE 's/.*\| ([0-9]+) steps \|.*/\1/p' ref.log)
[ "$steps" = "$want" ] && [ "$steps" -ge 20 ] || fail "metrics.jsonl has $steps lines, banner says $want"
"$PY" - ref/metrics.jsonl "$steps" <<'EOF' || fail "metrics.jsonl: the loss does not fall / fields"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == list(range(1, int(sys.argv[2]) + 1))
for r in rows:
    for k in ("loss", "lr", "grad_norm", "tokens_per_s", "elapsed"):
        assert k in r, k
vals = [r for r in rows if "val_loss" in r]
assert [r["step"] for r in vals] == [s for s in range(5, len(rows) + 1, 5)] + ([len(rows)] if len(rows) % 5 else [])
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"loss {first:.4f} -> {last:.4f}; val {vals[0]['val_loss']:.4f} -> {vals[-1]['val_loss']:.4f}")
assert last < first / 3, (first, last)
assert vals[-1]["val_loss"] < vals[0]["val_loss"]
EOF
for f in adapter_model.safetensors adapter_config.json latest metrics.jsonl; do
  [ -f "ref/$f" ] || fail "ref/$f missing"
done
last=$(cat ref/latest)
[ "$last" = "$(printf 'ckpt-%08d' "$steps")" ] || fail "latest is '$last'"
for f in adapter_model.safetensors adapter_config.json optimizer.safetensors state.json; do
  [ -f "ref/$last/$f" ] || fail "ref/$last/$f missing"
done
cmp -s ref/adapter_model.safetensors "ref/$last/adapter_model.safetensors" ||
  fail "DIR's adapter is not the last checkpoint's"
[ "$(ls -d ref/ckpt-* | wc -l)" -eq 2 ] || fail "--keep 2 kept $(ls -d ref/ckpt-* | wc -l)"

# ---- the PEFT files as Python sees them ----------------------------------------
"$PY" - ref <<'EOF' || fail "PEFT layout check"
import json, struct, sys, os
d = sys.argv[1]
raw = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
meta = hdr.pop("__metadata__")
assert meta["format"] == "pt" and meta["orch_base_fingerprint"].startswith("sha256:")
names = sorted(hdr)
assert len(names) == 2 * 4 * 2, len(names)  # 2 layers x 4 matrices x (A, B)
for k, v in hdr.items():
    assert k.startswith("base_model.model.transformer.h."), k
    assert k.endswith((".lora_A.weight", ".lora_B.weight")), k
    assert v["dtype"] == "F32"
    r = v["shape"][0] if "lora_A" in k else v["shape"][1]
    assert r == 4, (k, v["shape"])
assert hdr["base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"]["shape"] == [48, 4]
assert hdr["base_model.model.transformer.h.1.mlp.c_proj.lora_A.weight"]["shape"] == [4, 64]
end = max(v["data_offsets"][1] for v in hdr.values())
assert 8 + n + end == len(raw)
cfg = json.load(open(os.path.join(d, "adapter_config.json")))
assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and cfg["fan_in_fan_out"] is True
assert sorted(cfg["target_modules"]) == ["c_attn", "c_fc", "c_proj"]
assert cfg["bias"] == "none" and cfg["lora_dropout"] == 0 and not cfg["use_rslora"]
try:
    import peft, torch, transformers  # noqa: F401
except ImportError as e:
    print(f"python has no peft/torch/transformers ({e.name}): checked the safetensors "
          "header and adapter_config.json with json instead")
    sys.exit(0)
from peft import LoraConfig
from safetensors.torch import load_file
c = LoraConfig.from_pretrained(d)
assert c.r == 4 and set(c.target_modules) == {"c_attn", "c_fc", "c_proj"}
w = load_file(os.path.join(d, "adapter_model.safetensors"))
assert len(w) == 16
print("peft read the adapter config and weights")
EOF

# ---- llama (grouped-query attention, untied head): PEFT's llama names ---------
cat >llama.json <<'EOF'
{
  "model": {"arch": "llama", "vocab_size": 256, "context": 64, "layers": 2,
            "heads": 4, "kv_heads": 2, "width": 32, "mlp_width": 48,
            "rope_theta": 10000, "tie_embeddings": false},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 2, "lr": 1e-3, "eval_every": 2,
            "eval_batches": 1, "checkpoint_every": 2},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
"$ORCH_BIN" train --config llama.json --out lbase >lbase.log 2>&1 || { cat lbase.log; fail "llama base"; }
"$ORCH_BIN" finetune --checkpoint lbase --data train.jsonl --out lft --max-steps 12 --lr 0.05 \
  --seq-len 48 --batch 2 --rank 2 --targets q_proj,k_proj,v_proj,down_proj >lft.log 2>&1 ||
  { cat lft.log; fail "llama finetune"; }
"$PY" - lft <<'EOF' || fail "llama PEFT layout"
import json, struct, sys, os
d = sys.argv[1]
raw = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n]); hdr.pop("__metadata__")
assert len(hdr) == 2 * 4 * 2, sorted(hdr)
p = "base_model.model.model.layers."
assert hdr[p + "0.self_attn.q_proj.lora_B.weight"]["shape"] == [32, 2]
assert hdr[p + "1.self_attn.k_proj.lora_B.weight"]["shape"] == [16, 2]  # 2 kv heads of 8
assert hdr[p + "1.mlp.down_proj.lora_A.weight"]["shape"] == [2, 48]
cfg = json.load(open(os.path.join(d, "adapter_config.json")))
assert cfg["fan_in_fan_out"] is False
assert sorted(cfg["target_modules"]) == ["down_proj", "k_proj", "q_proj", "v_proj"]
rows = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
assert len(rows) == 12 and rows[-1]["loss"] < rows[0]["loss"]
EOF
"$ORCH_BIN" finetune --checkpoint lbase --data train.jsonl --out lbad --targets q_proj >r.log 2>&1
[ $? -eq 2 ] && grep -q "without 'k_proj'" r.log || fail "llama: q_proj alone: $(cat r.log)"

# ---- --config: a settings file, flags win; unknown keys refused -------------------
printf '{"rank": 2, "alpha": 6, "lr": 0.01, "max_steps": 3, "seq_len": 48, "batch": 2,\n "targets": "all", "seed": "12345678901234567890"}\n' >ft.json
"$ORCH_BIN" finetune --config ft.json --checkpoint base --data train.jsonl --out cfgrun --rank 3 \
  >cfgrun.log 2>&1 || { cat cfgrun.log; fail "--config run"; }
grep -q '"r":	3' cfgrun/adapter_config.json && grep -q '"lora_alpha":	6' cfgrun/adapter_config.json &&
  [ "$(wc -l <cfgrun/metrics.jsonl)" -eq 3 ] &&
  grep -q '"seed":	"12345678901234567890"' cfgrun/ckpt-00000003/state.json ||
  fail "--config: the file's settings (flags winning) were not used"
printf '{"rank": 2, "lora_rank": 4}\n' >bad.json
"$ORCH_BIN" finetune --config bad.json --checkpoint base --data train.jsonl --out r6 >r.log 2>&1
[ $? -eq 2 ] && grep -q "bad.json: unknown key 'lora_rank'" r.log || fail "--config unknown key: $(cat r.log)"

# ---- --no-packing: one example per row, kept by --resume; the config key -------
"$ORCH_BIN" finetune --checkpoint base --data train.jsonl --out np --seq-len 48 --batch 2 --max-steps 4 \
  --no-packing --stop-after 2 >np1.log 2>&1 || { cat np1.log; fail "--no-packing run"; }
grep -q "rows of 48, one example per row" np1.log || { cat np1.log; fail "--no-packing line"; }
grep -q '"packing":	false' np/ckpt-00000002/state.json || fail "--no-packing not in state.json"
rows_np=$(sed -nE 's/.*examples -> ([0-9]+) rows.*/\1/p' np1.log)
"$ORCH_BIN" finetune --checkpoint base --data train.jsonl --out pk --seq-len 48 --batch 2 --max-steps 1 \
  >pk.log 2>&1 || { cat pk.log; fail "packed run"; }
rows_pk=$(sed -nE 's/.*examples -> ([0-9]+) rows.*/\1/p' pk.log)
ex=$(sed -nE 's/.*data ([0-9]+) examples.*/\1/p' np1.log)
[ "$rows_np" -gt "$rows_pk" ] && [ "$rows_np" -le "$ex" ] || fail "rows: $rows_np unpacked, $rows_pk packed, $ex examples"
"$ORCH_BIN" finetune --resume --out np >np2.log 2>&1 || { cat np2.log; fail "--no-packing resume"; }
grep -q "rows of 48, one example per row" np2.log || { cat np2.log; fail "--resume lost --no-packing"; }
printf '{"packing": false, "max_steps": 1, "seq_len": 48, "batch": 2}\n' >np.json
"$ORCH_BIN" finetune --config np.json --checkpoint base --data train.jsonl --out npc >npc.log 2>&1 &&
  grep -q "one example per row" npc.log || { cat npc.log; fail "--config packing false"; }
printf '{"packing": 0}\n' >np.json
"$ORCH_BIN" finetune --config np.json --checkpoint base --data train.jsonl --out npb >r.log 2>&1
[ $? -eq 2 ] && grep -q "packing: expected true or false" r.log || fail "--config packing 0: $(cat r.log)"

# ---- early stopping: eval every step, patience 3 (lr high enough to overshoot) ----
"$ORCH_BIN" finetune --checkpoint base --data train.jsonl --validation val.jsonl --out es \
  --epochs 40 --lr 0.5 --seq-len 48 --batch 2 --targets all --eval-every 1 --patience 3 \
  --schedule constant --grad-clip 0 >es.log 2>&1 || { cat es.log; fail "early-stop run"; }
n=$(wc -l <es/metrics.jsonl)
best=$(sed -nE 's/^early stop: validation loss has not improved for 3 evaluations \(best .* at step ([0-9]+)\)$/\1/p' es.log)
total=$(sed -nE 's/.*\| ([0-9]+) steps \|.*/\1/p' es.log)
grep -q "^stopped early at step $n/" es.log && [ -n "$best" ] && [ "$best" -eq $((n - 3)) ] &&
  [ "$n" -lt "$total" ] && [ "$(cat es/latest)" = "$(printf 'ckpt-%08d' "$n")" ] ||
  { tail -4 es.log; fail "early stop: $n steps of $total, best at '$best'"; }

# ---- exact resume: --stop-after ------------------------------------------------
"$ORCH_BIN" "${run[@]}" --out split --stop-after 7 >split1.log 2>&1 || { cat split1.log; fail "first half"; }
[ "$(cat split/latest)" = ckpt-00000007 ] || fail "stop-after: latest '$(cat split/latest)'"
grep -q "continue with: orch finetune --resume --out split" split1.log || fail "no continue hint"
"$ORCH_BIN" finetune --resume --out split >split2.log 2>&1 || { cat split2.log; fail "resume"; }
grep -q "resuming from split/ckpt-00000007 (step 7)" split2.log || fail "no resume line"
diff <(figures ref/metrics.jsonl) <(figures split/metrics.jsonl) >split.diff ||
  { head -5 split.diff; fail "stop-after + resume differs from the straight run"; }
cmp -s ref/adapter_model.safetensors split/adapter_model.safetensors || fail "resumed adapter differs"
cmp -s "ref/$last/optimizer.safetensors" "split/$last/optimizer.safetensors" || fail "resumed moments differ"
"$ORCH_BIN" finetune --resume --out split >split3.log 2>&1 && grep -q "nothing to do" split3.log ||
  fail "resuming a finished run"

# ---- SIGTERM, then --resume ----------------------------------------------------
ORCH_MOCK_SLEEP_MS=25 "$ORCH_BIN" "${run[@]}" --out term >term1.log 2>&1 &
pid=$!
sleep 0.6
kill -TERM "$pid"
wait "$pid"
rc=$?
if [ $rc -eq 0 ]; then
  echo "note: the run finished before SIGTERM (slow machine?)"
else
  [ $rc -eq 3 ] || { cat term1.log; fail "SIGTERM: exit $rc (want 3)"; }
  "$ORCH_BIN" finetune --resume --out term >term2.log 2>&1 || { cat term2.log; fail "resume after SIGTERM"; }
fi
diff <(figures ref/metrics.jsonl) <(figures term/metrics.jsonl) >/dev/null || fail "SIGTERM + resume differs"
cmp -s ref/adapter_model.safetensors term/adapter_model.safetensors || fail "SIGTERM: adapter differs"

# ---- SIGKILL, then --resume from the last periodic checkpoint ------------------
ORCH_MOCK_SLEEP_MS=25 "$ORCH_BIN" "${run[@]}" --out kill >kill1.log 2>&1 &
pid=$!
for _ in $(seq 1 100); do [ -f kill/latest ] && break; sleep 0.05; done
sleep 0.3
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if [ -f kill/latest ]; then
  mkdir -p kill/.tmp-ckpt-00000099-4194999 # a temp dir of a dead run (pid above pid_max)
  "$ORCH_BIN" finetune --resume --out kill >kill2.log 2>&1 || { cat kill2.log; fail "resume after SIGKILL"; }
  [ -z "$(ls -a kill | grep '^\.tmp-ckpt-')" ] || fail "SIGKILL: temp dirs left: $(ls -a kill)"
  diff <(figures ref/metrics.jsonl) <(figures kill/metrics.jsonl) >/dev/null || fail "SIGKILL + resume differs"
  cmp -s ref/adapter_model.safetensors kill/adapter_model.safetensors || fail "SIGKILL: adapter differs"
else
  fail "SIGKILL: no checkpoint was written in time"
fi

# ---- a full disk during a save ---------------------------------------------------
"$ORCH_BIN" "${run[@]}" --out full0 --stop-after 8 >full0.log 2>&1 || fail "disk-full base run"
"$ORCH_BIN" "${run[@]}" --out next --stop-after 9 >next.log 2>&1 || fail "disk-full reference"
cp -a full0 probe
ORCH_FSIO_FAULT=count "$ORCH_BIN" finetune --resume --out probe --stop-after 1 >count.log 2>&1 ||
  { cat count.log; fail "counting run"; }
sites=$(sed -nE 's/^fsio-fault: ([0-9]+) sites$/\1/p' count.log)
[ -n "$sites" ] && [ "$sites" -ge 10 ] || fail "counting: '$sites' sites"
cmp -s probe/adapter_model.safetensors next/adapter_model.safetensors || fail "resume 8->9 differs"
bad=0
for mode in enospc short; do
  for k in $(seq 1 "${sites:-0}"); do
    rm -rf d && cp -a full0 d
    ORCH_FSIO_FAULT=$mode:$k "$ORCH_BIN" finetune --resume --out d --stop-after 1 >d.log 2>&1
    rc=$?
    [ $rc -eq 0 ] || [ $rc -eq 1 ] || { fail "$mode:$k: exit $rc"; bad=1; }
    if [ $rc -eq 1 ] && ! grep -q "No space left on device\|no space left on device" d.log; then
      fail "$mode:$k: the error does not say the disk is full: $(tail -1 d.log)"; bad=1
    fi
    for f in adapter_model.safetensors adapter_config.json; do
      cmp -s "d/$f" "full0/$f" || cmp -s "d/$f" "next/$f" ||
        { fail "$mode:$k: d/$f is neither the previous nor the new adapter"; bad=1; }
    done
    l=$(cat d/latest 2>/dev/null)
    [ "$l" = ckpt-00000008 ] || [ "$l" = ckpt-00000009 ] || { fail "$mode:$k: latest '$l'"; bad=1; }
    ls d/.tmp-ckpt-* >/dev/null 2>&1 && [ $rc -eq 1 ] && { fail "$mode:$k: temp dir left"; bad=1; }
    if [ $((k % 7)) -eq 1 ]; then # (every 7th: a resume to the end is the slow part)
      "$ORCH_BIN" finetune --resume --out d >d2.log 2>&1 ||
        { fail "$mode:$k: resume after the failure: $(tail -1 d2.log)"; bad=1; }
      cmp -s d/adapter_model.safetensors ref/adapter_model.safetensors ||
        { fail "$mode:$k: resumed to the end, the adapter differs from the straight run"; bad=1; }
    fi
    [ $bad -eq 0 ] || break 2
  done
done
echo "disk full: $sites write-side calls failed in turn (ENOSPC and short writes)"

# ---- refusals ------------------------------------------------------------------
refuse() { # name, pattern, args...
  local name=$1 pat=$2
  shift 2
  "$ORCH_BIN" "$@" >r.log 2>&1
  local rc=$?
  [ $rc -eq 2 ] || { fail "$name: exit $rc (want 2): $(tail -1 r.log)"; return; }
  [ "$(wc -l <r.log)" -eq 1 ] || { cat r.log; fail "$name: not one line"; return; }
  grep -q -- "$pat" r.log || fail "$name: '$(cat r.log)' lacks '$pat'"
}
printf '{"text": "ok"}\n\n{"prompt": "a", "completion": 7}\n' >bad.jsonl
refuse "bad line" 'bad.jsonl:3: "completion" must be a string' \
  finetune --checkpoint base --data bad.jsonl --out r1
[ -e r1 ] && fail "a refused run left its --out directory"
refuse "old engine" "engine mock-abi11 (ABI 1.1) has no LoRA adapters" \
  finetune --checkpoint base --data train.jsonl --out r2 --engine "$ORCH_BUILD/tests/engines/abi11_mock.so"
refuse "rank" "rank 17: must be 1..16" \
  finetune --checkpoint base --data train.jsonl --out r3 --rank 17
refuse "c_proj" "one without the other cannot be saved" \
  finetune --checkpoint base --data train.jsonl --out r4 --targets qkv,attn_out
refuse "used dir" "ref already holds a fine-tuning run" \
  finetune --checkpoint base --data train.jsonl --out ref
refuse "resume + setting" "--lr cannot be given with it" finetune --resume --out ref --lr 1
refuse "seq-len" "--seq-len 65: longer than the model's context of 64" \
  finetune --checkpoint base --data train.jsonl --out r5 --seq-len 65
# An adapter of another base: the run's base swapped under its checkpoint.
cp -a full0 swap
sed -i "s|\"checkpoint\":[^,]*|\"checkpoint\":\t\"$work/base2\"|" swap/ckpt-00000008/state.json
refuse "foreign base" "trained on another base model" finetune --resume --out swap
# ---- the CPU engine (real numerics), when it is built --------------------------
# With adapters: the loss falls, the PEFT file matches the mock's layout, a
# --stop-after + --resume run equals the straight one bit for bit (threads 1).
if [ -f "$ORCH_BUILD/libengine_cpu.so" ]; then
  cpu_run=(finetune --checkpoint base --data train.jsonl --validation val.jsonl --engine cpu
           --threads 1 --max-steps 12 --lr 0.03 --seq-len 48 --batch 2 --grad-accum 2
           --rank 4 --alpha 8 --targets all --eval-every 4 --checkpoint-every 4 --seed 7)
  "$ORCH_BIN" "${cpu_run[@]}" --out cpu >cpu.log 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -q "engine cpu does not implement LoRA adapters" cpu.log; then
    echo "cpu engine: refused (no LoRA adapters yet), as it should be"
  elif [ $rc -eq 0 ]; then
    "$PY" - cpu/metrics.jsonl <<'EOF' || fail "cpu: the loss does not fall"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
last3 = sum(x["loss"] for x in r[-3:]) / 3
assert len(r) == 12 and last3 < r[0]["loss"] - 0.05, (r[0], r[-1])
v = [x["val_loss"] for x in r if "val_loss" in x]
assert v[-1] < v[0], v
print(f"cpu engine: loss {r[0]['loss']:.4f} -> {r[-1]['loss']:.4f}, val {v[0]:.4f} -> {v[-1]:.4f}")
EOF
    "$PY" - cpu ref <<'EOF' || fail "cpu: PEFT header differs from the mock's"
import json, struct, sys
def hdr(d):
    raw = open(d + "/adapter_model.safetensors", "rb").read()
    h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]); h.pop("__metadata__")
    return {k: (v["dtype"], v["shape"]) for k, v in h.items()}
assert hdr(sys.argv[1]) == hdr(sys.argv[2])
EOF
    "$ORCH_BIN" "${cpu_run[@]}" --out cpu2 --stop-after 6 >cpu2.log 2>&1 &&
      "$ORCH_BIN" finetune --resume --out cpu2 >cpu3.log 2>&1 || { cat cpu2.log cpu3.log; fail "cpu: split run"; }
    diff <(figures cpu/metrics.jsonl) <(figures cpu2/metrics.jsonl) >/dev/null ||
      fail "cpu: --stop-after 6 + --resume differs from the straight run"
    cmp -s cpu/adapter_model.safetensors cpu2/adapter_model.safetensors || fail "cpu: resumed adapter differs"
  else
    cat cpu.log; fail "cpu engine: exit $rc"
  fi
fi

[ $fails -eq 0 ] && echo "finetune_cli: all checks passed"
exit $((fails > 0))
