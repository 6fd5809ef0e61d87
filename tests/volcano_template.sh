#!/usr/bin/env bash
# volcano_template.sh - tools/k8s/volcano-train.yaml against Volcano's schema.
#  - tools/k8s/check_volcano.py accepts the template: every field of the Queue
#    and the Job is one tools/k8s/volcano-schema.json (the batch.volcano.sh/
#    v1alpha1 Job and scheduling.volcano.sh/v1beta1 Queue CRD schemas, for the
#    fields used) defines, with its type; the webhook's rules and the gang
#    contract (minAvailable = all pods, RANKS = worker replicas) hold.
#  - deliberately broken copies are rejected, each with the message naming
#    the field: a wrong type (replicas as a string, a boolean as a string, an
#    integer as a float), an unknown field (a misspelt maxRetry, a field in a
#    container), a missing required field (a volume's mountPath, a container's
#    name), an enum value Volcano does not know, a bad resource quantity,
#    minAvailable that leaves out the launcher, RANKS != worker replicas, an
#    mpi plugin naming no task, a policy with both event and exitCode.
# Needs python3 with python3-yaml (tools/setup.sh installs it).
set -u
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import yaml' 2>/dev/null; then
  echo "SKIP: python3-yaml is not installed (tools/setup.sh installs it)"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
yaml=tools/k8s/volcano-train.yaml
check=(tools/k8s/check_volcano.py)

out=$("$PY" "${check[@]}" "$yaml" 2>&1) || fail "the template does not validate: $out"
echo "$out"

# mutate NAME 'python statement on docs (q = Queue, j = Job)' 'expected message (grep -E)'
mutate() {
  local name=$1 stmt=$2 want=$3 out rc
  "$PY" - "$yaml" "$tmp/$name.yaml" "$stmt" <<'PYEOF' || { fail "$name: could not write the copy"; return; }
import sys, yaml
src, dst, stmt = sys.argv[1:4]
docs = [d for d in yaml.safe_load_all(open(src)) if d]
q = next(d for d in docs if d["kind"] == "Queue")
j = next(d for d in docs if d["kind"] == "Job")
launcher = next(t for t in j["spec"]["tasks"] if t["name"] == "launcher")
worker = next(t for t in j["spec"]["tasks"] if t["name"] == "worker")
lc = launcher["template"]["spec"]["containers"][0]
wc = worker["template"]["spec"]["containers"][0]
exec(stmt)
yaml.safe_dump_all(docs, open(dst, "w"), sort_keys=False)
PYEOF
  out=$("$PY" "${check[@]}" "$tmp/$name.yaml" 2>&1)
  rc=$?
  if [ $rc -ne 1 ]; then
    fail "$name: the checker exited $rc (want 1): $out"
  elif ! grep -qE -- "$want" <<<"$out"; then
    fail "$name: no message matching '$want' in: $out"
  else
    echo "ok: $name rejected: $(grep -E -- "$want" <<<"$out" | head -n 1)"
  fi
}
# A copy with no change passes (the mutation harness itself is sound).
out=$("$PY" - "$yaml" "$tmp/same.yaml" <<'PYEOF' 2>&1 && "$PY" "${check[@]}" "$tmp/same.yaml" 2>&1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
yaml.safe_dump_all(docs, open(sys.argv[2], "w"), sort_keys=False)
PYEOF
) || fail "an unchanged round-tripped copy does not validate: $out"

mutate replicas-string 'worker["replicas"] = "2"' \
  'spec\.tasks\[1\]\.replicas: expected integer, got string'
mutate bool-string 'q["spec"]["reclaimable"] = "yes"' 'spec\.reclaimable: expected boolean, got string'
mutate float-int 'j["spec"]["maxRetry"] = 2.5' 'spec\.maxRetry: expected integer, got number'
mutate int32-range 'j["spec"]["maxRetry"] = 2**31' 'spec\.maxRetry: 2147483648 is out of the int32 range'
mutate args-not-list 'wc["args"] = "sleep infinity"' 'containers\[0\]\.args: expected array, got string'
mutate unknown-spec 'j["spec"]["maxRetries"] = j["spec"].pop("maxRetry")' \
  'spec\.maxRetries: unknown field'
mutate unknown-container 'lc["workdir"] = lc.pop("workingDir")' \
  'containers\[0\]\.workdir: unknown field'
mutate unknown-queue 'q["spec"]["weigth"] = 1' 'spec\.weigth: unknown field'
mutate missing-mountpath 'del j["spec"]["volumes"][0]["mountPath"]' \
  "spec\.volumes\[0\]: required field 'mountPath' is missing"
mutate missing-container-name 'del wc["name"]' "containers\[0\]: required field 'name' is missing"
mutate missing-containers 'del worker["template"]["spec"]["containers"]' \
  "template\.spec: required field 'containers' is missing"
mutate bad-event 'j["spec"]["policies"][0]["event"] = "PodKilled"' \
  "'PodKilled' is not one of"
mutate bad-quantity 'wc["resources"]["requests"]["memory"] = "32 GB"' \
  "resources\.requests\.memory: '32 GB' is not a resource quantity"
mutate gang-partial 'j["spec"]["minAvailable"] = 2' \
  'spec\.minAvailable: 2, but the tasks have 3 pods'
mutate gang-too-many 'j["spec"]["minAvailable"] = 4' 'spec\.minAvailable: 4 exceeds the 3 replicas'
mutate ranks 'worker["replicas"] = 4; j["spec"]["minAvailable"] = 5' \
  'RANKS: the launcher starts 2 ranks, the worker task has 4 replicas'
mutate mpi-task 'j["spec"]["plugins"]["mpi"][1] = "--worker=workers"' '--worker=workers names no task'
mutate policy-both 'launcher["policies"][1]["event"] = "PodFailed"' \
  'either event\(s\) or exitCode, not both'
mutate wrong-queue 'j["spec"]["queue"] = "default"' "spec\.queue: 'default' is not a Queue"
mutate unknown-kind 'j["apiVersion"] = "batch.volcano.sh/v1"' \
  "'batch\.volcano\.sh/v1 Job' is not in the schema file"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
