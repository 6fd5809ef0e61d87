#!/usr/bin/env bash
# engine_cli.sh - command-line checks of engine loading and the help texts:
#   - `orch info --engine=mock` prints the ABI version and capabilities (exit 0);
#   - every broken test engine ($ORCH_BUILD/tests/engines/*.so), a missing
#     file, a text file, a FIFO (at once, without waiting for a writer), a
#     directory and an unknown name exit 2 with exactly one line on stderr
#     naming the file (and the reason, for the known cases); the valid test
#     engines (newer_minor, minor_zero, abi11_mock, marker_ctor: its constructor
#     runs) load;
#   - `orch --help` and `orch CMD --help` exit 0 with output for every command
#     that `orch --help` lists;
#   - every $ORCH_BUILD/libengine_*.so exports exactly one dynamic symbol,
#     orch_engine_get_api.
# Needs ORCH_BIN and ORCH_BUILD (set by tests/run_tests.sh).
set -u
: "${ORCH_BIN:?ORCH_BIN must name the orch binary}"
: "${ORCH_BUILD:?ORCH_BUILD must name the build directory}"
export ORCH_ENGINE_PATH="${ORCH_ENGINE_PATH:-$ORCH_BUILD}"
unset ORCH_MOCK_FAULT ORCH_MOCK_SLEEP_MS

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
pass() { echo "ok    $*"; }
fail() { echo "FAIL  $*"; failures=$((failures + 1)); }

# ---- orch info --engine=mock -------------------------------------------------
"$ORCH_BIN" info --engine=mock >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 0 ] && [ ! -s "$tmp/err" ] &&
  grep -Eq '^abi: +1\.[0-9]+ ' "$tmp/out" &&
  grep -Eq '^engine: +mock$' "$tmp/out" &&
  grep -Eq '^capabilities: +train,infer,kv-copy,eval,deterministic,fault-injection,lora,ft-stream$' "$tmp/out" &&
  grep -Eq '^probe: +ok: mock engine, no numerics$' "$tmp/out"; then
  pass "info --engine=mock"
else
  fail "info --engine=mock (exit $rc)"
  sed 's/^/      /' "$tmp/out" "$tmp/err"
fi

# ---- rejected engines ------------------------------------------------------------
# expect_reject FILE_OR_NAME SHOWN_NAME [REASON_FRAGMENT]
expect_reject() {
  local value=$1 shown=$2 reason=${3:-}
  # (a timeout: a FIFO that made orch wait would otherwise hang the suite)
  timeout -k 1 10 "$ORCH_BIN" info --engine="$value" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ]; then
    fail "info --engine=$value: exit $rc, expected 2"
  elif [ "$lines" -ne 1 ]; then
    fail "info --engine=$value: $lines lines on stderr, expected 1"
  elif ! grep -qF -- "$shown" "$tmp/err"; then
    fail "info --engine=$value: stderr does not name $shown"
  elif [ -n "$reason" ] && ! grep -qF -- "$reason" "$tmp/err"; then
    fail "info --engine=$value: stderr lacks '$reason'"
  elif [ -s "$tmp/out" ]; then
    fail "info --engine=$value: printed to stdout"
  else
    pass "info --engine=$value -> $(cat "$tmp/err")"
    return
  fi
  sed 's/^/      /' "$tmp/err"
}

reason_for() {
  case $1 in
  no_entry) echo "missing entry symbol orch_engine_get_api" ;;
  wrong_major) echo "engine has 2.3, orch needs 1.x" ;;
  short_table) echo "function table too short" ;;
  null_member) echo "required member 'tensor_read' is NULL" ;;
  null_cap_member) echo "required member 'grads_zero' is NULL" ;;
  probe_fails) echo "cannot run here: no test accelerator on this machine" ;;
  null_api) echo "returned NULL" ;;
  *) echo "" ;;
  esac
}

n_broken=0
for so in "$ORCH_BUILD"/tests/engines/*.so; do
  [ -f "$so" ] || continue
  name=$(basename "$so" .so)
  if [ "$name" = marker_ctor ]; then
    # A valid engine whose constructor leaves a marker: a library named on
    # the command line is loaded (tests/trust_cli.sh covers configs and
    # checkpoints, which must not load it).
    rm -f "$tmp/marker"
    if ORCH_TEST_MARKER="$tmp/marker" "$ORCH_BIN" info --engine="$so" >"$tmp/out" 2>"$tmp/err" &&
      grep -Eq '^engine: +marker-ctor$' "$tmp/out" && [ -f "$tmp/marker" ]; then
      pass "info --engine=$so (loaded from the command line, constructor ran)"
    else
      fail "info --engine=$so: not loaded"
      sed 's/^/      /' "$tmp/err"
    fi
    continue
  fi
  if [ "$name" = abi11_mock ]; then
    # A valid engine of an older minor (ABI 1.1, before the ZeRO-1 members)
    # loads; tests/dist_zero.sh trains with it.
    if "$ORCH_BIN" info --engine="$so" >"$tmp/out" 2>"$tmp/err" &&
      grep -Eq '^abi: +1\.1 ' "$tmp/out"; then
      pass "info --engine=$so (older minor accepted)"
    else
      fail "info --engine=$so: older minor rejected"
      sed 's/^/      /' "$tmp/err"
    fi
    continue
  fi
  if [ "$name" = notify_gap_mock ]; then
    # A valid table whose forward_backward_notify drops a range: it loads;
    # tests/dist_overlap.sh checks that training notices.
    if "$ORCH_BIN" info --engine="$so" >"$tmp/out" 2>"$tmp/err"; then
      pass "info --engine=$so (loads; misreports gradient ranges)"
    else
      fail "info --engine=$so: rejected"
      sed 's/^/      /' "$tmp/err"
    fi
    continue
  fi
  if [ "$name" = newer_minor ]; then
    # A valid engine from a later minor version loads.
    if "$ORCH_BIN" info --engine="$so" >"$tmp/out" 2>"$tmp/err" &&
      grep -Eq '^abi: +1\.9 ' "$tmp/out"; then
      pass "info --engine=$so (newer minor accepted)"
    else
      fail "info --engine=$so: newer minor rejected"
      sed 's/^/      /' "$tmp/err"
    fi
    continue
  fi
  if [ "$name" = minor_zero ]; then
    # A valid ABI 1.0 engine loads (it only never gets a llama model:
    # test_loader and basics_cli check that refusal).
    if "$ORCH_BIN" info --engine="$so" >"$tmp/out" 2>"$tmp/err" &&
      grep -Eq '^abi: +1\.0 ' "$tmp/out"; then
      pass "info --engine=$so (ABI 1.0 accepted)"
    else
      fail "info --engine=$so: ABI 1.0 rejected"
      sed 's/^/      /' "$tmp/err"
    fi
    continue
  fi
  n_broken=$((n_broken + 1))
  expect_reject "$so" "$so" "$(reason_for "$name")"
done
[ "$n_broken" -ge 7 ] || fail "only $n_broken broken engines in $ORCH_BUILD/tests/engines"

printf 'plain text, not a library\n' >"$tmp/libengine_text.so"
expect_reject "$tmp/libengine_text.so" "$tmp/libengine_text.so" "not a shared library"
expect_reject "$tmp/absent.so" "$tmp/absent.so" "file not found"
# A FIFO is refused at once (opening it must not wait for a writer).
mkfifo "$tmp/libengine_fifo.so"
expect_reject "$tmp/libengine_fifo.so" "$tmp/libengine_fifo.so" \
  "not a regular file, not a shared library"
mkdir "$tmp/libengine_dir.so"
expect_reject "$tmp/libengine_dir.so" "$tmp/libengine_dir.so" "is a directory"
expect_reject "no_such_engine_xyz" "libengine_no_such_engine_xyz.so" "not found"

"$ORCH_BIN" info --bogus >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ]; then
  pass "info --bogus exits 2"
else
  fail "info --bogus: exit $rc"
fi

# ---- help texts ----------------------------------------------------------------------
"$ORCH_BIN" --help >"$tmp/help" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 0 ] && [ -s "$tmp/help" ]; then
  pass "orch --help"
else
  fail "orch --help: exit $rc"
fi
commands=$(awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}' "$tmp/help")
[ -n "$commands" ] || fail "orch --help lists no commands"
for cmd in $commands; do
  for flag in --help -h; do
    timeout 20 "$ORCH_BIN" "$cmd" "$flag" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -eq 0 ] && [ -s "$tmp/out" ]; then
      pass "orch $cmd $flag"
    else
      fail "orch $cmd $flag: exit $rc, $(wc -c <"$tmp/out") bytes of output"
      head -n 3 "$tmp/err" | sed 's/^/      /'
    fi
  done
done

# ---- exported symbols ----------------------------------------------------------------
n_engines=0
for so in "$ORCH_BUILD"/libengine_*.so; do
  [ -f "$so" ] || continue
  n_engines=$((n_engines + 1))
  syms=$(nm -D --defined-only "$so" | awk '{print $NF}' | sort)
  if [ "$syms" = orch_engine_get_api ]; then
    pass "nm -D $so: only orch_engine_get_api"
  else
    fail "nm -D $so exports: $(echo "$syms" | head -n 10 | tr '\n' ' ')"
  fi
done
[ "$n_engines" -ge 1 ] || fail "no libengine_*.so in $ORCH_BUILD"

if [ "$failures" -gt 0 ]; then
  echo "engine_cli: $failures failed"
  exit 1
fi
echo "engine_cli: all passed"
