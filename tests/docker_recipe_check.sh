#!/usr/bin/env bash
# docker_recipe_check.sh - the Dockerfile, interpreted without building (fast).
#  - tools/docker_recipe.py --check accepts the Dockerfile: every instruction
#    is in the subset the chroot build (tools/docker_recipe_test.sh, make
#    docker-recipe-test) runs, every COPY source exists in the context and is
#    not excluded by .dockerignore, COPY --from names an earlier stage; the
#    stages are build and runtime; the image runs as a non-root user with
#    ENTRYPOINT ["orch"].
#  - the build stage installs every build package of tools/setup.sh (the
#    compiler, pkg-config and the -dev libraries; not check and clang's
#    runtime, which only the tests, fuzzers and sanitizer builds use).
#  - the image name tools/k8s/volcano-train.yaml runs is the one the
#    Dockerfile documents ("# Image: NAME").
#  - broken copies are rejected with a message naming the problem: an
#    instruction outside the subset, a COPY of a missing path, of a path
#    .dockerignore excludes, COPY --from of no stage, another base image, a
#    file ending inside a continued line.
# The full build in debootstrap chroots is `make docker-recipe-test` (root,
# the Debian mirror, about 4 minutes: not part of make test).
set -u
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
recipe() { "$PY" tools/docker_recipe.py --check --context . --dockerfile "$@"; }

if ! img=$(recipe Dockerfile 2>&1); then
  fail "the Dockerfile does not interpret: $img"
else
  echo "ok: Dockerfile: $img"
  "$PY" - "$img" <<'PYEOF' || fail "the image settings"
import json, sys
d = json.loads(sys.argv[1])
bad = []
if d["stages"] != ["build", "runtime"]: bad.append("stages %s, want build, runtime" % d["stages"])
if d["user"] in ("", "root", "0"): bad.append("the runtime stage runs as root")
if d["entrypoint"] != ["orch"]: bad.append("ENTRYPOINT %s, want [\"orch\"]" % d["entrypoint"])
for b in bad: print("Dockerfile:", b)
sys.exit(1 if bad else 0)
PYEOF
fi

# the build packages of tools/setup.sh are installed by the build stage
build_stage=$(sed -n '/^FROM .* AS build/,/^FROM /p' Dockerfile)
for p in $(sed -n '/^PACKAGES=(/,/^)/p' tools/setup.sh | tr ' ' '\n' |
           grep -E '^(build-essential|pkg-config|lib[a-z0-9.+-]*-dev|openmpi-bin)$' |
           grep -v '^libclang-rt-'); do  # libclang-rt: the fuzz and sanitizer builds
  grep -qw -- "$p" <<<"$build_stage" || fail "the build stage does not install $p (tools/setup.sh does)"
done

name=$(sed -n 's/^# Image: *\([^ ]*\).*/\1/p' Dockerfile | head -n 1)
images=$(sed -n 's/^ *image: *\([^ #]*\).*/\1/p' tools/k8s/volcano-train.yaml | sort -u)
[ -n "$name" ] || fail "the Dockerfile documents no '# Image: NAME' line"
[ -n "$images" ] || fail "tools/k8s/volcano-train.yaml names no image"
for i in $images; do
  [ "$i" = "$name" ] || fail "tools/k8s/volcano-train.yaml runs '$i', the Dockerfile documents '$name'"
done
[ "$fails" -eq 0 ] && echo "ok: volcano-train.yaml runs $images, the image the Dockerfile documents"

# broken NAME 'sed expression' 'expected message'
broken() {
  local name=$1 expr=$2 want=$3 out rc
  sed -e "$expr" Dockerfile >"$tmp/$name"
  cmp -s Dockerfile "$tmp/$name" && { fail "$name: the sed expression changed nothing"; return; }
  out=$(recipe "$tmp/$name" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    fail "$name: accepted"
  elif ! grep -qF -- "$want" <<<"$out"; then
    fail "$name: status $rc, no '$want' in: $out"
  else
    echo "ok: $name rejected: $out"
  fi
}
broken unknown-instruction '$a HEALTHCHECK CMD orch info' 'instruction HEALTHCHECK is not supported'
broken missing-source 's|^COPY configs configs/|COPY config configs/|' 'COPY config: not found in the context'
broken ignored-source 's|^COPY data/gpt2 data/gpt2/|COPY build/orch /usr/local/bin/|' \
  'COPY build/orch: outside the context or excluded by .dockerignore'
broken no-stage 's|^COPY --from=build |COPY --from=builder |' 'COPY --from=builder: no such earlier stage'
broken other-base 's|^FROM debian:12 AS runtime|FROM ubuntu:22.04 AS runtime|' \
  'FROM ubuntu:22.04: only debian:12 is provided'
broken open-continuation '$s|$| \\|' 'the file ends inside a continued instruction'

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
