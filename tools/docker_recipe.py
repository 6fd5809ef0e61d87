#!/usr/bin/env python3
"""docker_recipe.py - run a Dockerfile's build without Docker, in chroots.

A small interpreter for the subset of the Dockerfile language that the
repository's Dockerfile uses, so tools/docker_recipe_test.sh exercises the
real file rather than a copy of its commands:

  ARG NAME[=default]        (before the first FROM: global; in a stage: declares)
  FROM debian:12 [AS name]  (a fresh root unpacked from a debootstrap tarball)
  ENV K=V [K2=V2 ...] | ENV K V
  WORKDIR path              (created; relative to the previous WORKDIR)
  COPY [--from=stage] [--chown=u[:g]] src... dest
  RUN command | RUN ["exe", "arg", ...]
  USER name | ENTRYPOINT [...] | CMD [...] | LABEL k=v ...   (recorded)

Anything else is an error naming the instruction and its line. Build
arguments come from --build-arg NAME=VALUE. The build context is the
directory given with --context, filtered by its .dockerignore (plain paths and
fnmatch patterns, `!` exceptions; the subset this repository uses).

Each stage's root is <work>/<stage>; RUN executes `/bin/sh -c` in it through
chroot(8) with Docker's environment (PATH, HOME, the stage's ARG and ENV
values) as the stage's current USER, with /proc, /dev, /dev/pts bound and the
host's resolv.conf copied in; /var/cache/apt/archives is bound to --apt-cache
so reruns download nothing. A policy-rc.d that refuses to start services is
put in place (Docker's containers start none either). Mounts are undone on
exit, also on failure.

Writes <work>/<stage>.image.json: user, workdir, env, entrypoint, cmd, labels
(what `docker run` would use). Needs root.

--check interprets the file without building anything (no root, no network):
every instruction is parsed and must be in the subset, ARG/ENV values are
expanded, each COPY source must exist in the context and not be excluded by
.dockerignore, each COPY --from must name an earlier stage; it prints the
stages and the last stage's image settings as JSON. Exit status 0 on success, 1 on the
first failing instruction (its line number and command are printed), 2 on a
usage error or an unsupported instruction.
"""
import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The deb822 sources of the debian:12 image (debuerreotype).
DEBIAN12_SOURCES = """Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class RecipeError(Exception):
    """An instruction failed (status 1) or is unsupported (status 2)."""

    def __init__(self, msg, status=1):
        super().__init__(msg)
        self.status = status


def parse(text):
    """Return [(lineno, INSTRUCTION, rest)] with continuations joined and
    comment lines dropped (also inside a continued instruction)."""
    out = []
    cur, start = None, 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if cur is None and (not line or line.startswith("#")):
            continue
        if cur is not None and line.startswith("#"):
            continue
        cont = line.endswith("\\")
        if cont:
            line = line[:-1]
        if cur is None:
            cur, start = line, no
        else:
            cur += " " + line.strip()
        if not cont:
            word, _, rest = cur.strip().partition(" ")
            out.append((start, word.upper(), rest.strip()))
            cur = None
    if cur is not None:
        raise RecipeError("line %d: the file ends inside a continued instruction" % start, 2)
    return out


def expand(s, env):
    """Docker's $VAR / ${VAR} / ${VAR:-default} substitution."""

    def rep(m):
        name = m.group(1) or m.group(2)
        default = m.group(3)
        v = env.get(name, "")
        if default is not None and v == "":
            return default
        return v

    return re.sub(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\})",
                  rep, s)


def json_or_words(rest):
    rest = rest.strip()
    if rest.startswith("["):
        v = json.loads(rest)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise RecipeError("not a JSON array of strings: %s" % rest, 2)
        return v, True
    return shlex.split(rest), False


def kv_pairs(rest, what):
    words = shlex.split(rest)
    if len(words) >= 2 and "=" not in words[0]:  # legacy `ENV K V...`
        return [(words[0], " ".join(words[1:]))]
    pairs = []
    for w in words:
        if "=" not in w:
            raise RecipeError("%s: '%s' is not KEY=VALUE" % (what, w), 2)
        k, v = w.split("=", 1)
        pairs.append((k, v))
    return pairs


class Ignore:
    """The .dockerignore subset: patterns matched with fnmatch against the
    path and every parent directory; later `!` lines re-include."""

    def __init__(self, path):
        self.rules = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    neg = line.startswith("!")
                    pat = line[1:] if neg else line
                    self.rules.append((neg, os.path.normpath(pat.strip("/"))))

    def ignored(self, rel):
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        out = False
        for neg, pat in self.rules:
            if any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
                out = not neg
        return out


class Mounts:
    def __init__(self):
        self.points = []

    def bind(self, src, dst, fstype=None):
        os.makedirs(dst, exist_ok=True)
        cmd = ["mount", "-t", fstype, fstype, dst] if fstype else ["mount", "--bind", src, dst]
        subprocess.run(cmd, check=True)
        self.points.append(dst)

    def undo(self):
        for p in reversed(self.points):
            subprocess.run(["umount", "-l", p], check=False)
        self.points = []


class Builder:
    def __init__(self, args):
        self.a = args
        self.context = os.path.abspath(args.context)
        self.ignore = Ignore(os.path.join(self.context, ".dockerignore"))
        self.build_args = dict(kv.split("=", 1) for kv in args.build_arg)
        self.global_args = {}
        self.stages = {}  # name -> root
        self.mounts = Mounts()
        self.log = sys.stdout
        self.dry = args.check

    # --- stages --------------------------------------------------------
    def new_root(self, image, name):
        if image != "debian:12":
            raise RecipeError("FROM %s: only debian:12 is provided (a debootstrap tarball)" % image, 2)
        root = os.path.join(self.a.work, name)
        if self.dry:
            return root
        if os.path.exists(root):
            subprocess.run(["rm", "-rf", "--one-file-system", root], check=True)
        os.makedirs(root)
        t0 = time.time()
        r = subprocess.run(["debootstrap", "--variant=minbase",
                            "--unpack-tarball=" + os.path.abspath(self.a.tarball),
                            "bookworm", root, self.a.mirror],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RecipeError("debootstrap --unpack-tarball failed:\n" + r.stdout[-2000:])
        srcl = os.path.join(root, "etc/apt/sources.list")
        if os.path.exists(srcl):
            os.remove(srcl)
        with open(os.path.join(root, "etc/apt/sources.list.d/debian.sources"), "w") as f:
            f.write(DEBIAN12_SOURCES)
        prc = os.path.join(root, "usr/sbin/policy-rc.d")
        with open(prc, "w") as f:
            f.write("#!/bin/sh\n# docker_recipe.py: start no services in the chroot\nexit 101\n")
        os.chmod(prc, 0o755)
        self.say("  [%s] debian:12 root from the tarball in %.0f s" % (name, time.time() - t0))
        return root

    def mount_all(self, root):
        if self.dry:
            return
        self.mounts.bind(None, os.path.join(root, "proc"), "proc")
        self.mounts.bind("/dev", os.path.join(root, "dev"))
        if os.path.isdir("/dev/pts"):
            self.mounts.bind("/dev/pts", os.path.join(root, "dev/pts"))
        os.makedirs(self.a.apt_cache, exist_ok=True)
        self.mounts.bind(os.path.abspath(self.a.apt_cache),
                         os.path.join(root, "var/cache/apt/archives"))
        shutil.copy("/etc/resolv.conf", os.path.join(root, "etc/resolv.conf"))

    def say(self, msg):
        print(msg, file=self.log, flush=True)

    # --- instructions ----------------------------------------------------
    def run_in(self, st, argv, lineno):
        if self.dry:
            return
        env = {"PATH": DEFAULT_PATH, "HOME": "/root" if st["user"] == "root" else st["home"]}
        env.update(st["args"])
        env.update(st["env"])
        script = "cd %s && exec \"$@\"" % shlex.quote(st["workdir"])
        cmd = ["chroot"]
        if st["user"] != "root":
            cmd.append("--userspec=%s" % st["user"])
        cmd += [st["root"], "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in env.items()]
        cmd += ["/bin/sh", "-c", script, "sh"] + argv
        r = subprocess.run(cmd, stdout=self.a.out, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise RecipeError("line %d: RUN exited with status %d: %s" %
                              (lineno, r.returncode, " ".join(argv)[:300]))

    def copy(self, st, rest, lineno):
        words = shlex.split(rest)
        src_root, chown = self.context, None
        while words and words[0].startswith("--"):
            opt = words.pop(0)
            if opt.startswith("--from="):
                name = opt[len("--from="):]
                if name not in self.stages:
                    raise RecipeError("line %d: COPY --from=%s: no such earlier stage" % (lineno, name), 2)
                src_root = self.stages[name]
            elif opt.startswith("--chown="):
                chown = opt[len("--chown="):]
            else:
                raise RecipeError("line %d: COPY option %s is not supported" % (lineno, opt), 2)
        if len(words) < 2:
            raise RecipeError("line %d: COPY needs a source and a destination" % lineno, 2)
        env = dict(st["args"], **st["env"])
        srcs, dest = [expand(w, env) for w in words[:-1]], expand(words[-1], env)
        if not dest.startswith("/"):
            dest = os.path.join(st["workdir"], dest)
        dest_host = st["root"] + os.path.normpath(dest)
        from_context = src_root == self.context
        for s in srcs:
            rel = os.path.normpath(s.lstrip("/")) if from_context else s
            host = os.path.join(self.context, rel) if from_context else src_root + os.path.normpath(s)
            if from_context and (rel.startswith("..") or self.ignore.ignored(rel)):
                raise RecipeError("line %d: COPY %s: outside the context or excluded by .dockerignore"
                                  % (lineno, s))
            if self.dry and not from_context:
                continue  # a stage's files exist only once it is built
            if not os.path.lexists(host):
                raise RecipeError("line %d: COPY %s: not found in the %s" %
                                  (lineno, s, "context" if from_context else "stage"))
            if self.dry:
                continue
            if os.path.isdir(host) and not os.path.islink(host):
                self.copy_tree(host, dest_host, rel if from_context else None)
            else:
                target = dest_host
                if dest.endswith("/") or len(srcs) > 1 or os.path.isdir(dest_host):
                    os.makedirs(dest_host, exist_ok=True)
                    target = os.path.join(dest_host, os.path.basename(host))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(host, target, follow_symlinks=False)
        if chown and not self.dry:
            u = chown
            subprocess.run(["chroot", st["root"], "chown", "-R", u, os.path.normpath(dest)], check=True)

    def copy_tree(self, src, dst, rel_base):
        """Docker copies a directory's contents (not the directory itself)."""
        os.makedirs(dst, exist_ok=True)
        for dirpath, dirnames, filenames in os.walk(src):
            sub = os.path.relpath(dirpath, src)
            keep = []
            for d in dirnames:
                rel = os.path.normpath(os.path.join(rel_base, sub, d)) if rel_base else None
                if rel and self.ignore.ignored(rel):
                    continue
                keep.append(d)
            dirnames[:] = keep
            out_dir = os.path.normpath(os.path.join(dst, sub))
            os.makedirs(out_dir, exist_ok=True)
            for fn in filenames:
                rel = os.path.normpath(os.path.join(rel_base, sub, fn)) if rel_base else None
                if rel and self.ignore.ignored(rel):
                    continue
                shutil.copy2(os.path.join(dirpath, fn), os.path.join(out_dir, fn),
                             follow_symlinks=False)

    def build(self, text):
        instrs = parse(text)
        st = None
        t_stage = 0.0
        for lineno, ins, rest in instrs:
            if ins == "ARG":
                name, eq, default = rest.partition("=")
                name = name.strip()
                if st is None:
                    self.global_args[name] = self.build_args.get(name, default if eq else "")
                else:
                    val = self.build_args.get(name, default if eq else self.global_args.get(name, ""))
                    st["args"][name] = val
                continue
            if ins == "FROM":
                if st is not None:
                    self.finish_stage(st, t_stage)
                words = rest.split()
                if len(words) == 3 and words[1].upper() == "AS":
                    image, name = words[0], words[2]
                elif len(words) == 1:
                    image, name = words[0], "stage%d" % len(self.stages)
                else:
                    raise RecipeError("line %d: FROM %s: expected `IMAGE [AS NAME]`" % (lineno, rest), 2)
                image = expand(image, self.global_args)
                self.say("stage %s (FROM %s, line %d)" % (name, image, lineno))
                t_stage = time.time()
                root = self.new_root(image, name)
                self.mount_all(root)
                st = {"name": name, "root": root, "args": {}, "env": {}, "workdir": "/",
                      "user": "root", "home": "/root", "entrypoint": None, "cmd": None,
                      "labels": {}}
                continue
            if st is None:
                raise RecipeError("line %d: %s before the first FROM" % (lineno, ins), 2)
            env = dict(st["args"], **st["env"])
            t0 = time.time()
            if ins == "ENV":
                for k, v in kv_pairs(rest, "ENV"):
                    st["env"][k] = expand(v, env)
            elif ins == "WORKDIR":
                wd = expand(rest.strip(), env)
                st["workdir"] = os.path.normpath(os.path.join(st["workdir"], wd))
                if not self.dry:
                    os.makedirs(st["root"] + st["workdir"], exist_ok=True)
            elif ins == "COPY":
                self.copy(st, rest, lineno)
            elif ins == "RUN":
                argv, is_json = json_or_words(rest)
                if not is_json:
                    argv = ["/bin/sh", "-c", rest]
                self.run_in(st, argv, lineno)
            elif ins == "USER":
                user = expand(rest.strip(), env)
                st["user"] = user
                if self.dry:
                    st["home"] = "/home/" + user.split(":")[0]
                    continue
                home = subprocess.run(["chroot", st["root"], "getent", "passwd", user.split(":")[0]],
                                      stdout=subprocess.PIPE, text=True).stdout.split(":")
                if len(home) < 6:
                    raise RecipeError("line %d: USER %s: no such user in the stage" % (lineno, user))
                st["home"] = home[5]
            elif ins == "ENTRYPOINT":
                st["entrypoint"] = json_or_words(rest)[0]
            elif ins == "CMD":
                st["cmd"] = json_or_words(rest)[0]
            elif ins == "LABEL":
                for k, v in kv_pairs(rest, "LABEL"):
                    st["labels"][k] = expand(v, env)
            else:
                raise RecipeError("line %d: instruction %s is not supported by docker_recipe.py"
                                  % (lineno, ins), 2)
            dt = time.time() - t0
            self.say("  [%s] line %d %s %s (%.0f s)" % (st["name"], lineno, ins,
                                                        rest[:60] + ("..." if len(rest) > 60 else ""), dt))
        if st is None:
            raise RecipeError("no FROM in the Dockerfile", 2)
        self.finish_stage(st, t_stage)

    def finish_stage(self, st, t_stage):
        self.stages[st["name"]] = st["root"]
        image = {k: st[k] for k in ("user", "workdir", "env", "entrypoint", "cmd", "labels", "home")}
        self.last_image = dict(image, stage=st["name"], stages=list(self.stages))
        if self.dry:
            return
        with open(os.path.join(self.a.work, st["name"] + ".image.json"), "w") as f:
            json.dump(image, f, indent=1)
        self.say("stage %s done in %.0f s" % (st["name"], time.time() - t_stage))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dockerfile", required=True)
    p.add_argument("--context", required=True)
    p.add_argument("--check", action="store_true", help="interpret without building (no root)")
    p.add_argument("--work", help="directory for the stage roots")
    p.add_argument("--tarball", help="debootstrap --make-tarball output")
    p.add_argument("--mirror", default="http://deb.debian.org/debian")
    p.add_argument("--apt-cache", help="host directory for downloaded .debs")
    p.add_argument("--build-arg", action="append", default=[])
    p.add_argument("--log", help="file for the RUN output (default: stdout)")
    a = p.parse_args()
    if a.check:
        a.work, a.out = "/nonexistent-stage-roots", None
        b = Builder(a)
        b.log = open(os.devnull, "w")
        try:
            with open(a.dockerfile, encoding="utf-8") as f:
                b.build(f.read())
        except (RecipeError, ValueError) as e:
            print("docker_recipe.py: %s" % e, file=sys.stderr)
            return getattr(e, "status", 2)
        print(json.dumps(b.last_image, sort_keys=True))
        return 0
    if not (a.work and a.tarball and a.apt_cache):
        p.error("--work, --tarball and --apt-cache are required (or --check)")
    if os.geteuid() != 0:
        print("docker_recipe.py: needs root (chroot, mount)", file=sys.stderr)
        return 2
    a.out = open(a.log, "a") if a.log else None
    os.makedirs(a.work, exist_ok=True)
    b = Builder(a)
    try:
        with open(a.dockerfile, encoding="utf-8") as f:
            b.build(f.read())
    except RecipeError as e:
        print("docker_recipe.py: %s" % e, file=sys.stderr)
        return e.status
    finally:
        b.mounts.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
