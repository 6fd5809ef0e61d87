#!/usr/bin/env bash
# ckpt_crash.sh - crash safety of checkpoints: `orch train` on the mock engine
# writes a checkpoint after every step (checkpoint_every 1) and is killed with
# SIGKILL at a random moment, 20 times, resuming each time. After every kill:
#  - `latest` is either absent (no checkpoint completed yet) or exactly
#    "ckpt-NNNNNNNN\n" naming a directory whose files all match
#    checksums.sha256 (checked with coreutils' sha256sum -c);
#  - its step is >= every step `latest` was seen to name before the kill
#    (no completed checkpoint is lost);
#  - resuming prints no warning (the fallback to an older checkpoint is never
#    needed) and continues from that step.
# Finally an unkilled resume finishes cleanly and removes the dead processes'
# temp directories. Set CRASH_SEED to replay a sequence of kill times.
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

seed=${CRASH_SEED:-$(( $(date +%s) % 100000 ))}
RANDOM=$seed
echo "kill-time seed: $seed (CRASH_SEED=$seed to replay)"

cd "$work" || exit 1
# A small corpus -> byte-level shards.
for i in $(seq 1 200); do
  echo "In the beginning $i God created the heaven and the earth, line $i."
done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data \
  --val-fraction 0.1 >prepare.log 2>&1 || { cat prepare.log; fail "orch prepare"; }

cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 32, "layers": 2,
            "heads": 2, "width": 32, "mlp_width": 128},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 1000000, "lr": 1e-3,
            "warmup_steps": 0, "schedule": "constant", "eval_every": 0,
            "eval_batches": 1, "checkpoint_every": 1, "keep_checkpoints": 3},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF

run=run
# Step named by `latest`, or -1 when there is none; fails on a corrupt one.
latest_step() {
  [ -e "$run/latest" ] || { echo -1; return 0; }
  local text
  text=$(cat "$run/latest"; echo x) # keep the trailing newline visible
  text=${text%x}
  if ! [[ $text =~ ^ckpt-([0-9]{8})$'\n'$ ]]; then
    echo "corrupt latest: '$text'" >&2
    return 1
  fi
  echo $((10#${BASH_REMATCH[1]}))
}

verify_latest() { # $1 = minimum step
  local s
  s=$(latest_step) || fail "kill $k: corrupt latest"
  [ "$s" -ge "$1" ] || fail "kill $k: latest names step $s but step $1 had completed"
  [ "$s" -lt 0 ] && return 0
  local d
  d=$run/$(cat "$run/latest")
  [ -d "$d" ] || fail "kill $k: latest names missing $d"
  for f in model.safetensors optimizer.safetensors state.json checksums.sha256; do
    [ -f "$d/$f" ] || fail "kill $k: $d lacks $f"
  done
  (cd "$d" && sha256sum --quiet -c checksums.sha256) ||
    fail "kill $k: $d does not match its checksums"
}

seen=-1   # highest step `latest` was seen to name
kills=0
torn=0    # kills that left a half-written checkpoint or pointer behind
start_time=$(date +%s)
for k in $(seq 1 20); do
  args=(train --config cfg.json --out "$run")
  [ -e "$run/latest" ] && args+=(--resume)
  "$ORCH_BIN" "${args[@]}" >"train.$k.log" 2>&1 &
  pid=$!
  # Run for a random 0.15 .. 0.75 s, watching `latest` meanwhile.
  delay_ms=$((150 + RANDOM % 600))
  end=$(( $(date +%s%N) / 1000000 + delay_ms ))
  while [ $(( $(date +%s%N) / 1000000 )) -lt "$end" ]; do
    s=$(latest_step) || fail "kill $k: corrupt latest while running"
    [ "$s" -lt "$seen" ] && fail "kill $k: latest went back from step $seen to $s"
    seen=$s
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid"; rc=$?
    cat "train.$k.log"
    fail "kill $k: orch train exited by itself with status $rc"
  fi
  s=$(latest_step) || fail "kill $k: corrupt latest"
  [ "$s" -gt "$seen" ] && seen=$s
  kill -9 "$pid"
  wait "$pid" 2>/dev/null
  kills=$((kills + 1))
  ls -A "$run" | grep -qE "^\.(tmp-ckpt-[0-9]+-$pid|latest\.tmp-$pid)\$" && torn=$((torn + 1))
  pid=
  verify_latest "$seen"
  seen=$(latest_step)
  if grep -qi 'warning' "train.$k.log"; then
    cat "train.$k.log"
    fail "kill $k: the resume warned (a checkpoint was unusable)"
  fi
done
[ "$seen" -gt 0 ] || fail "no checkpoint was ever completed"

# An unkilled resume: continues from `latest`, finishes, cleans dead temp dirs.
"$ORCH_BIN" train --config cfg.json --out "$run" --resume --stop-after 2 \
  >final.log 2>&1 || { cat final.log; fail "final resume failed"; }
grep -qi warning final.log && { cat final.log; fail "final resume warned"; }
final=$(latest_step) || fail "corrupt latest at the end"
[ "$final" -eq $((seen + 2)) ] || fail "final resume reached step $final, expected $((seen + 2))"
verify_latest "$final"
leftover=$(ls -A "$run" | grep -E '^\.((tmp|trash)-ckpt-|latest\.tmp-)' || true)
[ -z "$leftover" ] || fail "temp dirs of killed runs were not cleaned: $leftover"
n=$(ls -d "$run"/ckpt-* | wc -l)
[ "$n" -le 4 ] || fail "retention kept $n checkpoints (keep_checkpoints 3 + best)"
echo "ok: $kills kills ($torn mid-write), latest always complete, final step $final, $(( $(date +%s) - start_time ))s"
