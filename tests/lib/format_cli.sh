# shellcheck shell=bash
# tests/lib/format_cli.sh - sourced by the model-format CLI suites
# (gguf_cli.sh, hf_cli.sh) after they cd into their work directory and
# define fail(): skips without python3 or the GPT-2 vocabulary, picks the
# engine (cpu when built, else mock) and defines expect_err.
command -v python3 >/dev/null || { echo "skip: python3 not found"; exit 77; }
echo x | "$ORCH_BIN" tokenize --tokenizer gpt2 >/dev/null 2>&1 || { echo "skip: GPT-2 vocabulary missing (run tools/setup.sh)"; exit 77; }
ENGINE=mock
[ -f "$(dirname "$ORCH_BIN")/libengine_cpu.so" ] && ENGINE=cpu
export ENGINE

# expect_err STATUS TEXT CMD...: fails unless CMD exits STATUS with one stderr
# line containing TEXT.
expect_err() {
  local want=$1 text=$2; shift 2
  "$@" >out.txt 2>err.txt
  local rc=$?
  [ "$rc" -eq "$want" ] || { cat err.txt; fail "$* exited $rc, not $want"; }
  [ "$(wc -l <err.txt)" -eq 1 ] || { cat err.txt; fail "$*: not one line on stderr"; }
  grep -qF -- "$text" err.txt || fail "$*: '$(cat err.txt)' lacks '$text'"
}
