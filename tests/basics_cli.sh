#!/usr/bin/env bash
# basics_cli.sh - first contact with the orch binary and its flag parser:
#   - bare `orch` prints the usage on stdout and exits 0, writing nothing;
#   - `orch --version` / `orch version` print "orch X.Y.Z (engine ABI M.N)",
#     with the version of orchestrator/cli/version.h and the ABI of
#     engine_api/orch_engine.h;
#   - every command `orch --help` lists answers --help and -h with its usage
#     (exit 0, nothing on stderr), even after a bad argument, and rejects an
#     unknown flag with one "CMD: unknown argument" line (exit 2);
#   - the parser's messages for a missing value and a bad number, and the
#     "=" and space forms giving the same result.
set -u
: "${ORCH_BIN:?ORCH_BIN must name the orch binary}"
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect STATUS STDERR-LINE cmd... : exit status and the exact (only) stderr line.
expect() {
  local want=$1 line=$2 rc
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq "$want" ] || { fail "'$*': exit $rc, want $want: $(head -c 300 "$tmp/err")"; return; }
  [ "$(cat "$tmp/err")" = "$line" ] || fail "'$*': stderr '$(head -c 300 "$tmp/err")', want '$line'"
}

# ---- bare orch: usage, exit 0, no files --------------------------------------------
mkdir "$tmp/cwd"
(cd "$tmp/cwd" && "$ORCH_BIN" >"$tmp/out" 2>"$tmp/err")
rc=$?
[ "$rc" -eq 0 ] || fail "bare orch: exit $rc"
[ -s "$tmp/err" ] && fail "bare orch wrote to stderr: $(head -c 300 "$tmp/err")"
head -n 1 "$tmp/out" | grep -q '^usage: orch COMMAND' || fail "bare orch: $(head -n 2 "$tmp/out")"
grep -q '^  train ' "$tmp/out" || fail "bare orch: the usage lists no train command"
[ -z "$(ls -A "$tmp/cwd")" ] || fail "bare orch created files: $(ls -A "$tmp/cwd")"
"$ORCH_BIN" --help >"$tmp/help" 2>&1 || fail "orch --help: exit $?"
cmp -s "$tmp/out" "$tmp/help" || fail "bare orch and orch --help differ"

# ---- --version ------------------------------------------------------------------------
ver=$(sed -n 's/^#define ORCH_VERSION *"\(.*\)"$/\1/p' "$root/orchestrator/cli/version.h")
major=$(sed -n 's/^#define ORCH_ENGINE_ABI_MAJOR *\([0-9]*\)u$/\1/p' "$root/engine_api/orch_engine.h")
minor=$(sed -n 's/^#define ORCH_ENGINE_ABI_MINOR *\([0-9]*\)u$/\1/p' "$root/engine_api/orch_engine.h")
[ -n "$ver" ] && [ -n "$major" ] && [ -n "$minor" ] || fail "cannot read the versions from the headers"
for v in --version version; do
  out=$("$ORCH_BIN" "$v" 2>"$tmp/err")
  rc=$?
  [ "$rc" -eq 0 ] && [ ! -s "$tmp/err" ] || fail "orch $v: exit $rc"
  [ "$out" = "orch $ver (engine ABI $major.$minor)" ] || fail "orch $v: '$out'"
done
expect 2 "orch: error: unknown command 'frobnicate' (see orch --help)" "$ORCH_BIN" frobnicate

# ---- every command: --help, -h, and an unknown flag ------------------------------
commands=$(awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}' "$tmp/help")
[ "$(echo "$commands" | wc -w)" -ge 11 ] || fail "orch --help lists only: $commands"
for cmd in $commands; do
  for flag in --help -h "--bogus --help"; do
    # shellcheck disable=SC2086
    timeout 20 "$ORCH_BIN" "$cmd" $flag >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" -eq 0 ] || fail "orch $cmd $flag: exit $rc: $(head -c 200 "$tmp/err")"
    [ -s "$tmp/err" ] && fail "orch $cmd $flag: stderr: $(head -c 200 "$tmp/err")"
    head -n 1 "$tmp/out" | grep -q "^usage: orch $cmd" || fail "orch $cmd $flag: $(head -n 1 "$tmp/out")"
  done
  case $cmd in
  bench) args=(bench train --bogus) name="bench train" ;;
  config) args=(config check --bogus) name="config check" ;;
  *) args=("$cmd" --bogus) name=$cmd ;;
  esac
  expect 2 "orch: error: $name: unknown argument '--bogus' (see orch $name --help)" \
    "$ORCH_BIN" "${args[@]}"
done

# ---- the parser's messages ---------------------------------------------------------
expect 2 "orch: error: eval: --checkpoint: missing value" "$ORCH_BIN" eval --checkpoint
expect 2 "orch: error: generate: --max-tokens 'abc': expected a non-negative integer" \
  "$ORCH_BIN" generate --checkpoint x --max-tokens abc
expect 2 "orch: error: generate: --max-tokens '-3': expected a non-negative integer" \
  "$ORCH_BIN" generate --checkpoint x --max-tokens=-3
expect 2 "orch: error: train: --metrics-port '70000': expected an integer in [0, 65535]" \
  "$ORCH_BIN" train --metrics-port 70000
expect 2 "orch: error: prepare: --val-fraction '0.9': expected a number in [0, 0.5]" \
  "$ORCH_BIN" prepare --val-fraction=0.9
expect 2 "orch: error: bench infer: --block-size '0': expected a positive integer" \
  "$ORCH_BIN" bench infer --block-size 0
expect 2 "orch: error: bench train: --json: takes no value ('--json=1')" \
  "$ORCH_BIN" bench train --json=1
expect 2 "orch: error: train: --resume: missing value" "$ORCH_BIN" train --resume=
expect 2 "orch: error: import-gpt2: more than one input file given ('a', 'b')" \
  "$ORCH_BIN" import-gpt2 a b --out x
expect 2 "orch: error: config check: more than one FILE given ('a', 'b')" \
  "$ORCH_BIN" config check a b
# llama: checked against the configured engine (the mock runs it); an engine
# that cannot (ABI 1.0) is refused in one line naming the file and versions;
# an unknown arch or rope scaling type names the field and the value.
"$ORCH_BIN" config check "$root/configs/llama_tiny.json" >"$tmp/out" 2>"$tmp/err" ||
  fail "config check llama_tiny: $(cat "$tmp/err")"
grep -q "^$root/configs/llama_tiny.json: ok: llama, 2 layers, 4 heads (kv 2, untied head, rope theta 10000), width 64," "$tmp/out" ||
  fail "config check llama_tiny: $(cat "$tmp/out")"
"$ORCH_BIN" config check "$root/configs/llama_124m.json" --engine=mock >"$tmp/out" 2>"$tmp/err" ||
  fail "config check llama_124m: $(cat "$tmp/err")"
grep -q "12 heads (kv 4, tied head, rope theta 10000), width 768, context 1024, vocab 50257 (114.11M parameters)" "$tmp/out" ||
  fail "config check llama_124m: $(cat "$tmp/out")"
m0="${ORCH_BUILD:-$root/build}/tests/engines/minor_zero.so"
expect 2 "orch: error: $root/configs/llama_tiny.json: model.arch: 'llama' is not run by engine '$m0': engine '$m0': ABI version 1.0 cannot run model.arch llama (llama needs ABI 1.1 or later)" \
  "$ORCH_BIN" config check "$root/configs/llama_tiny.json" --engine="$m0"
expect 2 "orch: error: $root/configs/llama_tiny.json: after --set: model.rope_scaling.type: 'yarn' is not one of linear,llama3" \
  "$ORCH_BIN" config check "$root/configs/llama_tiny.json" --set 'model.rope_scaling={"type":"yarn","factor":2}'
expect 2 "orch: error: $root/configs/tiny-test.json: --set model.arch=mamba: model.arch: 'mamba' is not one of gpt2,llama" \
  "$ORCH_BIN" config check "$root/configs/tiny-test.json" --set model.arch=mamba
expect 2 "orch: error: $root/configs/tiny-test.json: --set model.rope_theta=10000: model.rope_theta: applies to model.arch llama only (gpt2 has learned positions)" \
  "$ORCH_BIN" config check "$root/configs/tiny-test.json" --set model.rope_theta=10000

# "--name=value" and "--name value" are the same flag.
cfg="$root/configs/tiny-test.json"
"$ORCH_BIN" config show "$cfg" --set train.lr=0.5 --set=train.seed=7 >"$tmp/a" 2>&1 ||
  fail "config show (space form): $(cat "$tmp/a")"
"$ORCH_BIN" config show "$cfg" --set=train.lr=0.5 --set train.seed=7 >"$tmp/b" 2>&1 ||
  fail "config show (= form): $(cat "$tmp/b")"
cmp -s "$tmp/a" "$tmp/b" || fail "--set=K=V and --set K=V differ"
grep -q '"seed":[[:space:]]*7' "$tmp/a" || fail "repeated --set not applied: $(cat "$tmp/a")"
# A value that looks like a flag is still the value of the flag before it.
printf 'x' | "$ORCH_BIN" tokenize --tokenizer byte >"$tmp/a" 2>&1 && [ "$(cat "$tmp/a")" = "120" ] ||
  fail "tokenize --tokenizer byte: $(cat "$tmp/a")"
expect 2 "orch: error: tokenize: unknown tokenizer '--help' (expected byte, gpt2 or hf)" \
  "$ORCH_BIN" tokenize --tokenizer --help

[ $fails -eq 0 ] || { echo "basics_cli: $fails failure(s)"; exit 1; }
echo "basics_cli: all passed"
