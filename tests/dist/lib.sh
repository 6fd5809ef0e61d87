# lib.sh - shared setup of the tests/dist_*.sh suites (sourced, not run).
# Provides: root, tmp (removed on exit, with every process we started),
# MPIRUN (a quiet, fast loopback mpirun for 2 ranks), common (train flags on
# configs/tiny-test.json and a small byte corpus), fail/finish, figures,
# dist_have_mpi_orch, dist_require_mpi, rank_pid, wait_steps.
ORCH_BIN=${ORCH_BIN:-build/orch}
ORCH_BUILD=${ORCH_BUILD:-build}
export ORCH_ENGINE_PATH=${ORCH_ENGINE_PATH:-$ORCH_BUILD}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d)
bg_pids=()
cleanup() {
  local p
  for p in "${bg_pids[@]}"; do kill -9 -- "-$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
finish() {
  if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
  echo "all passed"; exit 0
}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

# Loopback, shared memory, no CPU binding (other suites share the 2 cores),
# no single-copy (needs ptrace rights containers often lack).
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none
        --mca btl self,vader --mca btl_vader_single_copy_mechanism none
        --mca pml ob1 -np 2)
# Never let an outer Slurm allocation steer mpirun or orch.
for v in $(compgen -e | grep -E '^(SLURM_|OMPI_|PMI_|PMIX_)'); do unset "$v"; done
# A sanitizer build: OpenMPI's own allocations are not ours to report. Its
# libraries lack frame pointers and it unloads its plugins at MPI_Finalize,
# so leak stacks need the slow unwinder and plugins that stay loaded before
# the suppressions can name them.
if [ "${ORCH_SAN:-0}" = 1 ]; then
  export LSAN_OPTIONS="suppressions=$root/tests/dist/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"
  export OMPI_MCA_mca_base_component_disable_dlclose=1
fi

dist_have_mpi_orch() { # orch linked with MPI?
  ldd "$ORCH_BIN" 2>/dev/null | grep -q 'libmpi\.so'
}
dist_require_mpi() {
  if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"; exit 77
  fi
  if ! dist_have_mpi_orch; then
    echo "SKIP: $ORCH_BIN was built without MPI (make NO_MPI=1 or no mpicc)"; exit 77
  fi
}

# A small corpus with some structure, prepared as byte shards.
prepare_corpus() {
  awk 'BEGIN { srand(7); for (i = 0; i < 400; i++) {
    printf "%d: and the %s said unto the %s, let there be %s.\n", i,
      (i % 3 ? "lord" : "king"), (i % 5 ? "people" : "waters"), (i % 7 ? "light" : "bread") } }' \
    >"$tmp/corpus.txt"
  if ! "$ORCH_BIN" prepare --tokenizer byte --input "$tmp/corpus.txt" \
      --out "$tmp/data" --val-fraction 0.1 >"$tmp/prepare.log" 2>&1; then
    cat "$tmp/prepare.log"; echo "FAIL: orch prepare"; exit 1
  fi
}
common=(--config "$root/configs/tiny-test.json"
        --set "data.train=$tmp/data/train_*.bin" --set "data.val=$tmp/data/val_*.bin"
        --set engine.threads=1)

# The comparable part of metrics.jsonl: everything but the timing fields.
figures() { sed -E 's/,"tokens_per_s":[^,}]*//; s/,"elapsed":[^,}]*//' "$1"; }

# PID of rank R among the children of mpirun PID M (empty if none yet).
rank_pid() {
  local m=$1 r=$2 p
  for p in $(pgrep -P "$m"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$r"; then
      echo "$p"; return 0
    fi
  done
  return 1
}

# Wait (at most S seconds) until FILE has at least N lines.
wait_steps() {
  local f=$1 n=$2 s=$3 i
  for ((i = 0; i < s * 10; i++)); do
    [ -f "$f" ] && [ "$(wc -l <"$f")" -ge "$n" ] && return 0
    sleep 0.1
  done
  return 1
}
