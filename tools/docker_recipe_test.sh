#!/usr/bin/env bash
# docker_recipe_test.sh - build the repository's Dockerfile without Docker and
# smoke-test the image it describes (make docker-recipe-test).
#
# tools/docker_recipe.py interprets the Dockerfile itself (FROM/ARG/ENV/
# WORKDIR/COPY/RUN/USER/ENTRYPOINT) in chroots: each FROM debian:12 is a fresh
# Debian 12 minbase root unpacked from a debootstrap tarball, so the build
# stage installs its packages and runs make exactly as written, and the
# runtime stage gets only what its own RUN lines install plus the COPY --from
# artefacts. Then, inside the runtime root, as the image's USER, through its
# ENTRYPOINT:
#   - bare `orch` prints the usage; `orch info --engine cpu` and mock load;
#   - `orch prepare` with the gpt2 tokenizer finds the vocabulary the image
#     ships (/opt/orch/data/gpt2), without ORCH_DATA_DIR;
#   - a few training steps of the shipped configs/tiny-test.json on the mock
#     and cpu engines, `orch generate` from the cpu run, and a 2-rank mpirun
#     on the mock engine (as the non-root user, no --allow-run-as-root);
#   - every shared library of orch and the engines resolves (ldd), the user
#     is not root, no compiler or -dev headers are in the runtime stage;
#   - the image name tools/k8s/volcano-train.yaml runs is the one the
#     Dockerfile documents ("# Image: NAME");
#   - the packages of the CUDA=1 branches exist in Debian 12 non-free and
#     resolve in each stage (apt-get install --simulate; CUDA=1 itself, a
#     ~3 GB toolkit, is built only when the variable is set: CUDA=1 make
#     docker-recipe-test).
#
# Cached between runs under $BUILD/docker-recipe (never the source tree): the
# debootstrap tarball (debootstrap --make-tarball; made on the first run) and
# the downloaded .debs. The stage roots live in a fresh directory under
# ${TMPDIR:-/var/tmp} (never under build/, which `make clean` removes with
# rm -rf: a bind-mounted /dev left by a killed run must not be in its way);
# they are unmounted and removed at the end (KEEP=1 keeps them), and mounts
# that a killed earlier run left behind are undone first. The build log of
# the last run is kept as $BUILD/docker-recipe/last-run.log. Needs root, debootstrap (installed with apt-get when missing) and the
# Debian mirror; exits 77 with one line when one of them is unavailable.
# Prints the time each part took. Takes several minutes (package downloads,
# a full build on this machine's cores), so it is not part of `make test`.
set -u
cd "$(dirname "$0")/.."
root=$PWD
BUILD=${BUILD:-build}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
cache="$root/$BUILD/docker-recipe"
tarball="$cache/bookworm-minbase.tgz"
stage_parent=${TMPDIR:-/var/tmp}
t_start=$(date +%s)

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root (chroot, mount)"; exit 77; fi
host=${MIRROR#*://}; host=${host%%/*}
if ! timeout 10 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null; then
  echo "SKIP: the Debian mirror $host is not reachable"; exit 77
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null 2>&1 ||
    { echo "SKIP: debootstrap is not installed and apt-get could not install it"; exit 77; }
fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
mounts_under() { awk -v p="$1" 'index($2, p) == 1 { print $2 }' /proc/mounts | sort -r; }
unmount_all() { local m; for m in $(mounts_under "$1"); do umount -l "$m" 2>/dev/null; done; }
# a run that was killed may have left its mounts (and roots)
unmount_all "$stage_parent/orch-docker-recipe."
mkdir -p "$cache"
work=$(mktemp -d "$stage_parent/orch-docker-recipe.XXXXXX")
cleanup() {
  unmount_all "$work/"
  cp "$work/run.log" "$cache/last-run.log" 2>/dev/null
  if [ "${KEEP:-0}" != 1 ]; then
    [ -z "$(mounts_under "$work/")" ] && rm -rf --one-file-system "$work"
  else
    echo "kept the stage roots in $work"
  fi
}
trap cleanup EXIT

# --- the Debian 12 base, cached ---------------------------------------------
t0=$(date +%s)
if [ ! -s "$tarball" ]; then
  if ! debootstrap --variant=minbase --make-tarball="$tarball.tmp" bookworm "$work/tarball.tmp" \
      "$MIRROR" >"$work/make-tarball.log" 2>&1; then
    tail -n 5 "$work/make-tarball.log"; echo "FAIL: debootstrap --make-tarball"; exit 1
  fi
  mv "$tarball.tmp" "$tarball"
  echo "time: debootstrap --make-tarball $(($(date +%s) - t0)) s"
else
  echo "time: debootstrap tarball cached ($tarball)"
fi

# --- the Dockerfile, interpreted --------------------------------------------
t0=$(date +%s)
: >"$work/run.log"
if ! "$PY" tools/docker_recipe.py --dockerfile Dockerfile --context . --work "$work" \
    --tarball "$tarball" --mirror "$MIRROR" --apt-cache "$cache/apt-archives" \
    --log "$work/run.log" ${CUDA:+--build-arg CUDA=$CUDA}; then
  tail -n 30 "$work/run.log"; echo "FAIL: the Dockerfile did not build (log: $work/run.log)"
  KEEP=1; exit 1
fi
echo "time: Dockerfile build (both stages) $(($(date +%s) - t0)) s"

# --- smoke test in the runtime stage ----------------------------------------
t0=$(date +%s)
rt="$work/runtime"
image="$work/runtime.image.json"
jq_py() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$image"; }
user=$(jq_py x 'd["user"]')
home=$(jq_py x 'd["home"]')
wdir=$(jq_py x 'd["workdir"]')
mapfile -t entry < <(jq_py x '"\n".join(d["entrypoint"] or [])' | grep -v '^$')
mapfile -t envs < <(jq_py x '"\n".join("%s=%s" % kv for kv in d["env"].items())' | grep -v '^$')
mount -t proc proc "$rt/proc" && mount --bind /dev "$rt/dev" && mount --bind /dev/pts "$rt/dev/pts" ||
  { fail "cannot mount /proc and /dev in the runtime root"; exit 1; }
# as the image runs: its user, environment, working directory
as_image() { # command...
  chroot --userspec="$user" "$rt" /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME="$home" "${envs[@]}" \
    /bin/sh -c 'cd "$0" && exec "$@"' "$wdir" "$@"
}
run_image() { as_image "${entry[@]}" "$@"; } # docker run IMAGE ARGS...

[ "${#entry[@]}" -eq 1 ] && [ "${entry[0]}" = orch ] || fail "ENTRYPOINT is '${entry[*]}', not [\"orch\"]"
uid=$(as_image id -u)
[ -n "$uid" ] && [ "$uid" != 0 ] || fail "the image's user '$user' is root (uid '$uid')"

out=$(run_image 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '^usage: orch COMMAND' <<<"$out" || fail "bare orch: status $rc, output: ${out:0:200}"
for e in cpu mock; do
  out=$(run_image info --engine "$e" 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "^file: */opt/orch/bin/libengine_$e.so" <<<"$out" ||
    fail "orch info --engine $e: status $rc: ${out:0:300}"
done
for lib in "$rt"/opt/orch/bin/orch "$rt"/opt/orch/bin/libengine_*.so; do
  [ "$(basename "$lib")" = libengine_cuda.so ] && [ "${CUDA:-0}" != 1 ] && continue
  missing=$(chroot "$rt" ldd "${lib#"$rt"}" 2>&1 | grep 'not found')
  [ -z "$missing" ] || fail "$(basename "$lib"): $missing"
done
# sshd (the Volcano pods start it): its configuration and host keys are valid
out=$(chroot "$rt" /bin/sh -c 'mkdir -p /var/run/sshd && /usr/sbin/sshd -t -p 2222' 2>&1) || fail "sshd -t in the runtime stage: $out"
# the libraries the cpu engine dlopen()s (not visible to ldd)
for so in libopenblas.so.0 libdnnl.so.2; do
  chroot "$rt" /sbin/ldconfig -p | grep -qE "^[[:space:]]+${so//./\\.} " || fail "the runtime stage lacks $so (dlopen()ed by the cpu engine)"
done
out=$(run_image info --engine cpu 2>&1)
grep -q 'GEMM: OpenBLAS' <<<"$out" || fail "orch info --engine cpu does not report OpenBLAS: $(grep probe <<<"$out")"
for f in /usr/bin/gcc /usr/bin/cc /usr/bin/make /usr/include/cjson /usr/include/microhttpd.h; do
  [ ! -e "$rt$f" ] || fail "the runtime stage holds $f (build-only)"
done

# a corpus, the gpt2 vocabulary, training, generation - in the user's home
smoke="$home/smoke"
as_image mkdir -p "$smoke"
awk 'BEGIN { for (i = 0; i < 300; i++)
  printf "%d: and the %s said unto the people, let there be light.\n", i, (i % 3 ? "lord" : "king") }' |
  as_image sh -c "cat > $smoke/corpus.txt"
out=$(run_image prepare --tokenizer gpt2 --input "$smoke/corpus.txt" --out "$smoke/gpt2-data" \
  --val-fraction 0.1 2>&1) || fail "orch prepare --tokenizer gpt2 (the shipped vocabulary): ${out:0:300}"
out=$(run_image prepare --tokenizer byte --input "$smoke/corpus.txt" --out "$smoke/data" \
  --val-fraction 0.1 2>&1) || fail "orch prepare --tokenizer byte: ${out:0:300}"
train=(train --config /opt/orch/configs/tiny-test.json --steps 6
       --set "data.train=$smoke/data/train_*.bin" --set "data.val=$smoke/data/val_*.bin"
       --set engine.threads=1 --set train.eval_every=3 --set train.checkpoint_every=3)
for e in mock cpu; do
  out=$(run_image "${train[@]}" --engine "$e" --out "$smoke/run-$e" 2>&1); rc=$?
  n=$(grep -c '"loss"' "$rt$smoke/run-$e/metrics.jsonl" 2>/dev/null)
  [ $rc -eq 0 ] && [ "${n:-0}" -eq 6 ] ||
    fail "orch train --engine $e: status $rc, ${n:-0} steps logged: $(tail -n 3 <<<"$out")"
done
out=$(run_image generate --checkpoint "$smoke/run-cpu" --prompt "and the lord" --max-tokens 12 \
  --temperature 0 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q '^and the lord' <<<"$out" || fail "orch generate: status $rc: ${out:0:300}"
out=$(as_image mpirun --oversubscribe --bind-to none --mca btl self,vader \
  --mca btl_vader_single_copy_mechanism none --mca pml ob1 -np 2 \
  orch "${train[@]}" --engine mock --out "$smoke/run-mpi" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "data parallel over 2 ranks" <<<"$out" ||
  fail "mpirun -np 2 orch train (as $user): status $rc: $(tail -n 5 <<<"$out")"

[ "$fails" -eq 0 ] && echo "ok: as $user (uid $uid) through ENTRYPOINT ${entry[*]}: usage, info (cpu, mock), prepare (gpt2 vocabulary, byte), train 6 steps (mock, cpu), generate, mpirun -np 2; libraries resolve; no build tools"

# the image name the Volcano template runs is the one the Dockerfile documents
name=$(sed -n 's/^# Image: *\([^ ]*\).*/\1/p' Dockerfile | head -n 1)
[ -n "$name" ] || fail "the Dockerfile documents no '# Image: NAME' line"
while read -r img; do
  [ "$img" = "$name" ] || fail "tools/k8s/volcano-train.yaml runs image '$img', the Dockerfile builds '$name'"
done < <(sed -n 's/^ *image: *\([^ #]*\).*/\1/p' tools/k8s/volcano-train.yaml)
[ -n "$(sed -n 's/^ *image: *\([^ #]*\).*/\1/p' tools/k8s/volcano-train.yaml)" ] ||
  fail "tools/k8s/volcano-train.yaml names no image"
echo "time: smoke test $(($(date +%s) - t0)) s"

# CUDA=1 is not built here (nvidia-cuda-toolkit is ~3 GB); the packages each
# stage's CUDA branch names must at least exist in Debian 12 with the
# components that branch enables, and resolve (apt-get install --simulate).
if [ "${CUDA:-0}" != 1 ]; then
  t0=$(date +%s)
  for st in build runtime; do
    branch=$(sed -n "/^FROM .* AS $st\$/,/^FROM /p" Dockerfile | sed -n '/if \[ "$CUDA" = 1 \]/,/^ *fi\b/p')
    pkgs=$(grep -o 'apt-get install -y --no-install-recommends [^;]*' <<<"$branch" | tail -n 1 |
           sed 's/.*--no-install-recommends //')
    sedexpr=$(grep -o "sed -i '[^']*'" <<<"$branch" | head -n 1 | sed "s/^sed -i '//; s/'\$//")
    if [ -z "$pkgs" ] || [ -z "$sedexpr" ]; then fail "$st: no CUDA=1 branch with a package list"; continue; fi
    out=$(chroot "$work/$st" /bin/sh -c "sed -i '$sedexpr' /etc/apt/sources.list.d/debian.sources &&
      apt-get update -qq && apt-get install -s --no-install-recommends $pkgs" 2>&1) ||
      { fail "$st: CUDA=1 packages do not resolve: $pkgs: $(tail -n 3 <<<"$out")"; continue; }
    echo "ok: $st stage, CUDA=1: $pkgs resolve ($(grep -c '^Inst ' <<<"$out") packages to install)"
  done
  echo "time: CUDA package check $(($(date +%s) - t0)) s"
fi
echo "time: total $(($(date +%s) - t_start)) s"
echo "runtime stage: $(du -sh --one-file-system "$rt" 2>/dev/null | cut -f1) (build stage $(du -sh --one-file-system "$work/build" 2>/dev/null | cut -f1))"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; KEEP=1; exit 1; fi
echo "all passed"
