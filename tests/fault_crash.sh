#!/usr/bin/env bash
# fault_crash.sh - a fault at every file-system call of a training run, on the
# real binary (fsio.h's test-only ORCH_FSIO_FAULT). `orch train` on the mock
# engine (6 steps, a checkpoint every 2, keep 1, evaluation every 2) is run
# as "the first 4 steps" (--stop-after 4: checkpoints at 2 and 4, config.json,
# metrics.jsonl, retention) once with ORCH_FSIO_FAULT=count to learn its N
# write-side calls, then:
#  - crash: N times with ORCH_FSIO_FAULT=crash:K (_exit 86 instead of call
#    K), each followed by the same command without the fault (with --resume
#    once a checkpoint exists) that trains to step 6;
#  - ENOSPC: N times with ORCH_FSIO_FAULT=enospc:K; the run must exit 1 (2
#    when it is the --out directory that cannot be made) with
#    a one-line error naming the file of call K (only cleanup calls, i.e.
#    removing a dead process's temp files or an old checkpoint, may fail
#    without failing the run), then the same resume.
# After every resume: exit 0, no warning but "no 'latest' file" (a crash
# between installing a checkpoint and writing `latest`), metrics.jsonl equal
# to an uninterrupted 6-step run's (timings aside), `latest` naming a
# checkpoint whose files match checksums.sha256, and no temp file left.
# Also: the variable's syntax. FAULT_STRIDE=S tries every S-th call only
# (default 1; 3 under sanitizers, ORCH_SAN).
set -u
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BUILD=${ORCH_BUILD:-build}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$ORCH_BUILD}
stride=${FAULT_STRIDE:-1}
[ -n "${ORCH_SAN:-}" ] && stride=${FAULT_STRIDE:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
unset ORCH_FSIO_FAULT
start=$(date +%s)

cd "$work" || exit 1
for i in $(seq 1 200); do
  echo "In the beginning $i God created the heaven and the earth, line $i."
done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data \
  --val-fraction 0.1 >prepare.log 2>&1 || { cat prepare.log; fail "orch prepare"; }
cat >cfg.json <<'EOF'
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 16, "layers": 1,
            "heads": 2, "width": 16, "mlp_width": 32},
  "train": {"micro_batch": 2, "seq_len": 8, "max_steps": 6, "lr": 1e-3,
            "warmup_steps": 0, "schedule": "constant", "eval_every": 2,
            "eval_batches": 1, "checkpoint_every": 2, "keep_checkpoints": 1},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "mock", "threads": 1}
}
EOF
first=(train --config cfg.json --out run --stop-after 4)

# The comparable part of metrics.jsonl: everything but the timings.
figures() { sed -E 's/,"tokens_per_s":[^,}]*//; s/,"elapsed":[^,}]*//' "$1"; }

# Reference: 6 straight steps (train_resume.sh shows that 4 steps and a resume
# give the same figures).
"$ORCH_BIN" train --config cfg.json --out ref >ref.log 2>&1 || { cat ref.log; fail "reference run"; }
figures ref/metrics.jsonl >ref.figures
[ "$(wc -l <ref.figures)" -eq 6 ] || fail "reference run logged $(wc -l <ref.figures) steps"

ORCH_FSIO_FAULT=count "$ORCH_BIN" "${first[@]}" >count.log 2>&1 || { cat count.log; fail "counting run"; }
n=$(sed -nE 's/^fsio-fault: ([0-9]+) sites$/\1/p' count.log)
[ -n "$n" ] && [ "$n" -gt 50 ] || { cat count.log; fail "no site count (got '$n')"; }
rm -rf run

# The environment variable's syntax: a bad value is ignored with a line.
ORCH_FSIO_FAULT=crash:zero "$ORCH_BIN" --version >bad.log 2>&1 || fail "orch --version with a bad ORCH_FSIO_FAULT"
grep -q "fsio-fault: ignoring ORCH_FSIO_FAULT" bad.log || { cat bad.log; fail "a bad ORCH_FSIO_FAULT is not reported"; }

# `latest` names a directory whose files match their checksums.
verify_latest() { # context
  [ -f run/latest ] || fail "$1: no latest"
  local d
  d=run/$(cat run/latest)
  [[ $(cat run/latest) =~ ^ckpt-[0-9]{8}$ ]] || fail "$1: latest is '$(cat run/latest)'"
  (cd "$d" && sha256sum --quiet -c checksums.sha256) || fail "$1: $d does not match its checksums"
}

# Resume after the faulted run and check the result.
resume_and_check() { # context faulted-site-path
  local args=(train --config cfg.json --out run)
  ls -d run/ckpt-* >/dev/null 2>&1 && args+=(--resume)
  "$ORCH_BIN" "${args[@]}" >resume.log 2>&1 || { cat fault.log resume.log; fail "$1: the resume failed"; }
  if grep -i warning resume.log | grep -qv "no 'latest' file"; then
    cat resume.log; fail "$1: the resume warned"
  fi
  verify_latest "$1"
  [ "$(cat run/latest)" = ckpt-00000006 ] || fail "$1: latest is $(cat run/latest) after the resume"
  if ! diff ref.figures <(figures run/metrics.jsonl) >metrics.diff; then
    head -n 6 metrics.diff
    fail "$1: metrics.jsonl after the fault and resume differs from the uninterrupted run"
  fi
  local left
  left=$(cd run && find . -name '.*' ! -name . -o -name '*.tmp.*' | head -n 3)
  [ -z "$left" ] || fail "$1: left behind after the resume: $left"
}

crashes=0
for ((k = 1; k <= n; k += stride)); do
  rm -rf run
  ORCH_FSIO_FAULT=crash:$k "$ORCH_BIN" "${first[@]}" >fault.log 2>&1
  rc=$?
  [ $rc -eq 86 ] || { cat fault.log; fail "crash:$k: exit $rc, not 86"; }
  grep -q "^fsio-fault: crash at site $k (" fault.log || { cat fault.log; fail "crash:$k: no crash line"; }
  [ -f run/latest ] && verify_latest "crash:$k (before the resume)"
  resume_and_check "crash:$k"
  crashes=$((crashes + 1))
done

failures=0 cleanup_ok=0
for ((k = 1; k <= n; k += stride)); do
  rm -rf run
  ORCH_FSIO_FAULT=enospc:$k "$ORCH_BIN" "${first[@]}" >fault.log 2>&1
  rc=$?
  line=$(grep -m1 "^fsio-fault: failure at site $k (" fault.log) ||
    { cat fault.log; fail "enospc:$k: the fault did not fire"; }
  op=$(sed -E 's/^[^(]*\(([a-z]+) .*$/\1/' <<<"$line")
  path=$(sed -E 's/^[^(]*\([a-z]+ (.*)\)$/\1/' <<<"$line")
  if [ $rc -eq 0 ]; then
    base=${path##*/}
    if [ "$op" = remove ] || [ "$op" = opendir ] || { [ "$op" = rename ] && [[ $base == ckpt-* ]]; }; then
      cleanup_ok=$((cleanup_ok + 1))
    else
      cat fault.log; fail "enospc:$k ($op $path): the run exited 0"
    fi
  else
    # 1 (runtime); 2 when creating --out itself fails (train.c calls it input)
    [ $rc -eq 1 ] || [ $rc -eq 2 ] || { cat fault.log; fail "enospc:$k ($op $path): exit $rc"; }
    target=${path%%.tmp.*}
    msg=$(grep '^orch: error' fault.log)
    [ "$(grep -c '^orch: error' fault.log)" -eq 1 ] || { cat fault.log; fail "enospc:$k: not one error line"; }
    [[ $msg == *"$target"* && $msg == *"no space left on device"* ]] ||
      { cat fault.log; fail "enospc:$k ($op $path): the error does not name the file"; }
    failures=$((failures + 1))
  fi
  [ -f run/latest ] && verify_latest "enospc:$k (before the resume)"
  resume_and_check "enospc:$k"
done

tried="every call tried"
[ "$stride" -gt 1 ] && tried="1 call in $stride tried"
echo "ok: $n fault sites in a 4-step run with 2 checkpoint saves ($tried):" \
  "$crashes crashes resumed; ENOSPC: $failures failed the run naming the file," \
  "$cleanup_ok in cleanup steps let the run finish; $(( $(date +%s) - start ))s"
