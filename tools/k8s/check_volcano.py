#!/usr/bin/env python3
"""check_volcano.py - validate Volcano manifests against tools/k8s/volcano-schema.json.

usage: check_volcano.py [--schema FILE] MANIFEST.yaml

Every YAML document must be a kind the schema file knows (by "apiVersion
kind"). Each value is checked against its schema: its type (integer means a
YAML integer, not a string or a float; int32/int64 ranges), enum, minimum,
pattern, required fields, and no field the schema does not define. Then the
rules Volcano's admission webhook applies to a Job (pkg/webhooks/admission/
jobs/validate in volcano-sh/volcano) that the schema cannot express:
  - at least one task; task names unique and DNS-1123 labels;
  - spec.minAvailable <= the sum of the task replicas;
  - a policy has an event (or events) or an exitCode, not both; exitCode != 0;
  - the tasks the mpi plugin's --master and --worker name exist;
  - spec.queue names a Queue of the same file, where one is defined there.
And the template's own contract (stated in its header): gang scheduling
places every pod at once, so spec.minAvailable equals the sum of the task
replicas; the launcher's RANKS equals the worker replicas.

Prints one line per problem ("PATH: what is wrong") and exits 1 when there is
any, 0 (with "ok: ...") otherwise; 2 for a file it cannot read.
"""
import argparse
import json
import os
import re
import sys

import yaml

INT_RANGE = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class Checker:
    def __init__(self, schema):
        self.defs = schema.get("definitions", {})
        self.kinds = schema["kinds"]
        self.errors = []

    def err(self, path, msg):
        self.errors.append("%s: %s" % (path, msg))

    def resolve(self, s):
        while "$ref" in s:
            s = self.defs[s["$ref"]]
        return s

    def type_ok(self, v, t):
        if t == "object":
            return isinstance(v, dict)
        if t == "array":
            return isinstance(v, list)
        if t == "string":
            return isinstance(v, str)
        if t == "boolean":
            return isinstance(v, bool)
        if t == "integer":
            return isinstance(v, int) and not isinstance(v, bool)
        if t == "number":
            return isinstance(v, (int, float)) and not isinstance(v, bool)
        raise ValueError("schema type %s unknown" % t)

    def check(self, v, s, path):
        s = self.resolve(s)
        if s.get("x-int-or-string"):
            if not (isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))):
                self.err(path, "expected an integer or a quantity string, got %s" % tname(v))
                return
            if isinstance(v, str) and "pattern" in s and not re.match(s["pattern"], v):
                self.err(path, "'%s' is not a resource quantity" % v)
            return
        t = s.get("type")
        if t and not self.type_ok(v, t):
            self.err(path, "expected %s, got %s (%s)" % (t, tname(v), json.dumps(v, default=str)[:40]))
            return
        if "enum" in s and v not in s["enum"]:
            self.err(path, "'%s' is not one of %s" % (v, ", ".join(map(str, s["enum"]))))
        if t == "integer":
            lo, hi = INT_RANGE.get(s.get("format"), (None, None))
            if lo is not None and not lo <= v <= hi:
                self.err(path, "%d is out of the %s range" % (v, s["format"]))
            if "minimum" in s and v < s["minimum"]:
                self.err(path, "%d is below the minimum %d" % (v, s["minimum"]))
        if t == "string" and "pattern" in s and not re.match(s["pattern"], v):
            self.err(path, "'%s' does not match %s" % (v, s["pattern"]))
        if t == "array" and "items" in s:
            for i, item in enumerate(v):
                self.check(item, s["items"], "%s[%d]" % (path, i))
        if t == "object":
            props = s.get("properties")
            extra = s.get("additionalProperties")
            for k in s.get("required", []):
                if k not in v:
                    self.err(path, "required field '%s' is missing" % k)
            for k, item in v.items():
                sub = "%s.%s" % (path, k) if path else str(k)
                if props is not None and k in props:
                    self.check(item, props[k], sub)
                elif isinstance(extra, dict):
                    self.check(item, extra, sub)
                elif props is not None or extra is False:
                    self.err(sub, "unknown field (not in the %s schema)" % (path or "document"))

    def document(self, doc, where):
        if not isinstance(doc, dict):
            self.err(where, "a document must be a mapping, got %s" % tname(doc))
            return None
        key = "%s %s" % (doc.get("apiVersion"), doc.get("kind"))
        if key not in self.kinds:
            self.err(where, "apiVersion/kind '%s' is not in the schema file (known: %s)" %
                     (key, "; ".join(self.kinds)))
            return None
        before = len(self.errors)
        self.check(doc, self.kinds[key], "")
        # prefix the document to every message it produced
        self.errors[before:] = ["%s %s" % (where, e) for e in self.errors[before:]]
        return key


def tname(v):
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null" if v is None else type(v).__name__


def job_rules(c, job, where, queues):
    """Webhook rules and the template's gang contract (types already checked)."""
    spec = job.get("spec") or {}
    tasks = spec.get("tasks") or []
    if not tasks:
        c.err(where + " spec.tasks", "no task specified (the webhook rejects the Job)")
        return
    names, total = [], 0
    for i, t in enumerate(tasks):
        n = t.get("name", "")
        if not isinstance(n, str) or not DNS1123_LABEL.match(n):
            c.err("%s spec.tasks[%d].name" % (where, i), "'%s' is not a DNS-1123 label" % n)
        if n in names:
            c.err("%s spec.tasks[%d].name" % (where, i), "duplicate task name '%s'" % n)
        names.append(n)
        r = t.get("replicas", 1)
        total += r if isinstance(r, int) else 0
        for j, p in enumerate(t.get("policies") or []):
            policy_rule(c, p, "%s spec.tasks[%d].policies[%d]" % (where, i, j))
    for j, p in enumerate(spec.get("policies") or []):
        policy_rule(c, p, "%s spec.policies[%d]" % (where, j))
    ma = spec.get("minAvailable")
    if isinstance(ma, int):
        if ma > total:
            c.err(where + " spec.minAvailable",
                  "%d exceeds the %d replicas of all tasks (the webhook rejects the Job)" % (ma, total))
        elif ma != total:
            c.err(where + " spec.minAvailable",
                  "%d, but the tasks have %d pods: gang scheduling must place all of them "
                  "(a partial job waits forever in its first all-reduce)" % (ma, total))
    mpi = (spec.get("plugins") or {}).get("mpi")
    if isinstance(mpi, list):
        roles = {}
        for a in mpi:
            m = re.match(r"^--(master|worker|port)=(.*)$", str(a))
            if not m:
                c.err(where + " spec.plugins.mpi", "unknown mpi plugin argument '%s'" % a)
                continue
            roles[m.group(1)] = m.group(2)
        for role in ("master", "worker"):
            if role in roles and roles[role] not in names:
                c.err(where + " spec.plugins.mpi",
                      "--%s=%s names no task (tasks: %s)" % (role, roles[role], ", ".join(names)))
        worker = roles.get("worker", "mpiworker")
        master = roles.get("master", "mpimaster")
        if worker in names and master in names:
            wrep = tasks[names.index(worker)].get("replicas", 1)
            for ct in ((tasks[names.index(master)].get("template") or {}).get("spec") or {}).get(
                    "containers") or []:
                for e in ct.get("env") or []:
                    if e.get("name") == "RANKS" and str(e.get("value")) != str(wrep):
                        c.err(where + " RANKS",
                              "the launcher starts %s ranks, the worker task has %s replicas"
                              % (e.get("value"), wrep))
    q = spec.get("queue")
    if queues and q not in queues:
        c.err(where + " spec.queue", "'%s' is not a Queue of this file (%s)" % (q, ", ".join(queues)))


def policy_rule(c, p, path):
    has_event = "event" in p or "events" in p
    if has_event and "exitCode" in p:
        c.err(path, "a policy has either event(s) or exitCode, not both")
    if not has_event and "exitCode" not in p:
        c.err(path, "a policy needs an event (or events) or an exitCode")
    if p.get("exitCode") == 0:
        c.err(path + ".exitCode", "0 is not allowed (the webhook rejects it)")
    if "action" not in p:
        c.err(path, "a policy needs an action")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schema", default=os.path.join(here, "volcano-schema.json"))
    ap.add_argument("manifest")
    a = ap.parse_args()
    try:
        with open(a.schema, encoding="utf-8") as f:
            schema = json.load(f)
        with open(a.manifest, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, ValueError, yaml.YAMLError) as e:
        print("check_volcano: %s" % e, file=sys.stderr)
        return 2
    c = Checker(schema)
    kinds = []
    for i, d in enumerate(docs):
        kinds.append(c.document(d, "doc %d" % (i + 1)))
    queues = [d["metadata"]["name"] for d, k in zip(docs, kinds)
              if k and k.endswith(" Queue") and isinstance(d.get("metadata"), dict)
              and "name" in d["metadata"]]
    for i, (d, k) in enumerate(zip(docs, kinds)):
        if k and k.endswith(" Job") and not any(e.startswith("doc %d " % (i + 1)) for e in c.errors):
            job_rules(c, d, "doc %d" % (i + 1), queues)
    for e in c.errors:
        print(e)
    if c.errors:
        return 1
    print("ok: %s: %d documents (%s) match %s" % (a.manifest, len(docs),
                                                  ", ".join(k.split(" ")[1] for k in kinds),
                                                  os.path.basename(a.schema)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
