#!/usr/bin/env bash
# trust_cli.sh - a checkpoint or a config cannot choose the engine library
# (issue 12, defect 1). The test engine marker_ctor.so creates
# $ORCH_TEST_MARKER from its library constructor, i.e. as soon as anything
# dlopens it. With its path (or file name) as engine.name in a checkpoint's
# state.json, `generate`, `eval`, `serve`, `train --resume` and `train --init`
# - and with it in a --config file, `train --config` and `bench` - must exit 2
# with one line saying that paths are only accepted from the command line,
# and the marker must not exist. A name that is neither built in nor a path is
# refused the same way. With --trust-config-engine (or the path given as
# --engine) the library is loaded: the marker appears. Built-in names in
# checkpoints keep working.
# Needs ORCH_BIN and ORCH_BUILD (set by tests/run_tests.sh).
set -u
: "${ORCH_BIN:?ORCH_BIN must name the orch binary}"
: "${ORCH_BUILD:?ORCH_BUILD must name the build directory}"
export ORCH_ENGINE_PATH="$ORCH_BUILD/tests/engines:$ORCH_BUILD"
unset ORCH_MOCK_FAULT ORCH_MOCK_SLEEP_MS
M="$ORCH_BUILD/tests/engines/marker_ctor.so"
[ -f "$M" ] || { echo "FAIL: $M was not built"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ORCH_TEST_MARKER="$work/marker"
failures=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failures=$((failures + 1)); }
cd "$work" || exit 1

for i in $(seq 1 60); do echo "In the beginning was the word, line $i."; done >corpus.txt
"$ORCH_BIN" prepare --tokenizer byte --input corpus.txt --out data --val-fraction 0.1 \
  >prep.log 2>&1 || { cat prep.log; echo "FAIL: prepare"; exit 1; }
config() { # ENGINE_NAME
  cat <<EOF
{
  "model": {"arch": "gpt2", "vocab_size": 256, "context": 24, "layers": 1,
            "heads": 2, "width": 16},
  "train": {"micro_batch": 2, "seq_len": 16, "max_steps": 2, "lr": 1e-3,
            "eval_every": 0, "eval_batches": 2, "checkpoint_every": 1},
  "data": {"tokenizer": "byte", "train": "data/train_*.bin", "val": "data/val_*.bin"},
  "engine": {"name": "$1", "threads": 1}
}
EOF
}
config mock >cfg.json
"$ORCH_BIN" train --config cfg.json --out run >train.log 2>&1 || { cat train.log; echo "FAIL: train"; exit 1; }

# set_engine NAME: every checkpoint of run names NAME, checksums rewritten.
set_engine() {
  local ck
  for ck in run/ckpt-*; do
    sed -i "s|\"name\":\\([[:space:]]*\\)\"[^\"]*\"|\"name\":\\1\"$1\"|" "$ck/state.json"
    (cd "$ck" && awk '{print $2}' checksums.sha256 | xargs sha256sum >sums.tmp &&
      mv sums.tmp checksums.sha256)
  done
  grep -q "\"name\":[[:space:]]*\"$1\"" run/ckpt-00000002/state.json || fail "set_engine $1"
}

# refused DESC WANT CMD...: exit 2, one line on stderr holding WANT (besides
# serve's "listening" line), no marker.
refused() {
  local desc=$1 want=$2
  shift 2
  rm -f "$ORCH_TEST_MARKER"
  timeout -k 2 30 "$@" >out.txt 2>err.txt
  local rc=$?
  if [ "$rc" -ne 2 ]; then
    fail "$desc: exit $rc, expected 2"
  elif [ -e "$ORCH_TEST_MARKER" ]; then
    fail "$desc: the library was loaded (its constructor ran)"
  elif [ "$(grep -vc '^orch serve: listening' err.txt)" -ne 1 ]; then
    fail "$desc: $(wc -l <err.txt) lines on stderr, expected 1"
  elif ! grep -qF -- "$want" err.txt; then
    fail "$desc: stderr lacks '$want'"
  else
    pass "$desc -> $(cat err.txt)"
    return
  fi
  sed 's/^/      /' err.txt
}

# loaded DESC CMD...: the library was opened (the marker exists); the command
# then fails for the engine's own reasons, not for trust.
loaded() {
  local desc=$1
  shift
  rm -f "$ORCH_TEST_MARKER"
  timeout -k 2 30 "$@" >out.txt 2>err.txt
  local rc=$?
  if [ ! -e "$ORCH_TEST_MARKER" ]; then
    fail "$desc: the library was not loaded (exit $rc)"
    sed 's/^/      /' err.txt
  elif grep -q "only accepted from the command line" err.txt; then
    fail "$desc: refused although trusted: $(cat err.txt)"
  else
    pass "$desc (loaded; exit $rc)"
  fi
}

ck=run/ckpt-00000002
path_msg() { # NAME FILE
  echo "$2: config engine.name '$1' is a library path; paths are only accepted from the command line: pass --engine=$1, or --trust-config-engine"
}

# ---- a checkpoint naming a library by path --------------------------------------
set_engine "$M"
want=$(path_msg "$M" "$ck/state.json")
refused "generate" "$want" "$ORCH_BIN" generate --checkpoint run --prompt ab --max-tokens 2
refused "eval" "$want" "$ORCH_BIN" eval --checkpoint run
refused "serve" "$want" "$ORCH_BIN" serve --checkpoint run --port 0
refused "train --resume" "$want" "$ORCH_BIN" train --resume=run --steps 4
refused "train --init" "$want" "$ORCH_BIN" train --init run --out init_run --steps 4
[ -e init_run ] && fail "train --init refused but created its --out directory"
refused "train --resume=CKPT" "$want" "$ORCH_BIN" train --resume="$ck" --steps 4

loaded "generate --trust-config-engine" \
  "$ORCH_BIN" generate --checkpoint run --prompt ab --max-tokens 2 --trust-config-engine
loaded "eval --trust-config-engine" "$ORCH_BIN" eval --checkpoint run --trust-config-engine
loaded "serve --trust-config-engine" \
  "$ORCH_BIN" serve --checkpoint run --port 0 --trust-config-engine
loaded "train --resume --trust-config-engine" \
  "$ORCH_BIN" train --resume=run --steps 4 --trust-config-engine
loaded "train --init --trust-config-engine" \
  "$ORCH_BIN" train --init run --out init_run --steps 4 --trust-config-engine
loaded "generate --engine=PATH" \
  "$ORCH_BIN" generate --checkpoint run --prompt ab --max-tokens 2 --engine="$M"

# ---- a file name (found through $ORCH_ENGINE_PATH) and an unknown name -----------
set_engine marker_ctor.so
refused "generate (file name)" "$(path_msg marker_ctor.so "$ck/state.json")" \
  "$ORCH_BIN" generate --checkpoint run --prompt ab --max-tokens 2
loaded "generate --trust-config-engine (file name)" \
  "$ORCH_BIN" generate --checkpoint run --prompt ab --max-tokens 2 --trust-config-engine
set_engine marker_ctor
refused "eval (not a built-in name)" \
  "$ck/state.json: config engine.name 'marker_ctor' is not a built-in engine (mock, cpu, cuda); other engines are only accepted from the command line: pass --engine=marker_ctor, or --trust-config-engine" \
  "$ORCH_BIN" eval --checkpoint run

# ---- a config file naming a library ------------------------------------------------
config "$M" >evil.json
want=$(path_msg "$M" evil.json)
refused "train --config" "$want" "$ORCH_BIN" train --config evil.json --out evil_run
[ -e evil_run ] && fail "train --config refused but created its --out directory"
refused "train --resume --config" "$want" \
  "$ORCH_BIN" train --resume=run --config evil.json --steps 4
refused "bench train --config" "$want" "$ORCH_BIN" bench train --config evil.json --steps 1
refused "bench infer --config" "$want" "$ORCH_BIN" bench infer --config evil.json
loaded "train --config --trust-config-engine" \
  "$ORCH_BIN" train --config evil.json --out evil_run --trust-config-engine
loaded "bench train --config --trust-config-engine" \
  "$ORCH_BIN" bench train --config evil.json --steps 1 --trust-config-engine
# The command line names the engine: the config's name is not used at all.
rm -f "$ORCH_TEST_MARKER"
"$ORCH_BIN" train --config evil.json --engine mock --out cmdline_run >t.log 2>&1 ||
  fail "train --config evil.json --engine mock: $(cat t.log)"
[ -e "$ORCH_TEST_MARKER" ] && fail "--engine mock still loaded the config's library"
rm -f "$ORCH_TEST_MARKER"
"$ORCH_BIN" train --config evil.json --set engine.name=mock --out cmdline_run2 >t.log 2>&1 ||
  fail "train --set engine.name=mock: $(cat t.log)"

# ---- built-in names keep working ------------------------------------------------------
set_engine mock
out=$("$ORCH_BIN" generate --checkpoint run --prompt ab --max-tokens 2 --temperature 0 2>err.txt) ||
  fail "generate with engine.name mock: $(cat err.txt)"
[ "$out" = abnt ] && pass "generate with a built-in engine.name" || fail "generate: '$out'"
"$ORCH_BIN" train --resume=run --steps 3 >t.log 2>&1 && pass "train --resume with mock" ||
  fail "train --resume with mock: $(cat t.log)"

if [ "$failures" -gt 0 ]; then
  echo "trust_cli: $failures failed"
  exit 1
fi
echo "trust_cli: all passed"
