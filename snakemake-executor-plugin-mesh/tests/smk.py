"""What the plugin's tests share: real nodes (some apart, in a mount namespace that does not see the workflows' folder), real Snakemake, outputs compared."""

import atexit
import filecmp
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.dirname(HERE)
REPO = os.path.dirname(PLUGIN)
sys.path.insert(0, os.path.join(REPO, "python"))

import mesh  # noqa: E402

#: The longest a test waits for anything.
WAIT_S = 300

#: Where the tests' workflow folders are made: a folder of its own, which
#: nodes started apart do not see (an empty tmpfs over it).
_ROOT = None


def workflows_root():
    global _ROOT
    if _ROOT is None:
        _ROOT = tempfile.mkdtemp(prefix="mesh-smk-workflows-")
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


def snakemake_python():
    """The Python whose Snakemake runs (``$MESH_TEST_SNAKEMAKE_PYTHON``: an
    older Snakemake's venv), by default this one."""
    return os.environ.get("MESH_TEST_SNAKEMAKE_PYTHON") or sys.executable


def snakemake_env():
    env = dict(os.environ)
    # The plugin and `import mesh` from this repository, as `pip install` puts them.
    env["PYTHONPATH"] = os.pathsep.join([PLUGIN, os.path.join(REPO, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def snakemake(folder, *args, timeout=WAIT_S, python=None):
    return subprocess.run(
        [python or snakemake_python(), "-m", "snakemake", *args],
        cwd=folder,
        env=snakemake_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def popen(folder, *args, python=None):
    return subprocess.Popen(
        [python or snakemake_python(), "-m", "snakemake", *args],
        cwd=folder,
        env=snakemake_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def folder_of(test, src=None, snakefile=None, name="wf"):
    """A fresh workflow folder under workflows_root(): a copy of ``src`` (a
    folder) and/or a Snakefile of text ``snakefile``."""
    d = tempfile.mkdtemp(prefix=name + "-", dir=workflows_root())
    test.addCleanup(shutil.rmtree, d, True)
    if src is not None:
        shutil.copytree(src, d, dirs_exist_ok=True)
    if snakefile is not None:
        with open(os.path.join(d, "Snakefile"), "w") as f:
            f.write(snakefile)
    return d


def mesh_bin():
    b = os.environ.get("MESH_BIN")
    if not b:
        b = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"), "debug", "mesh")
        if not os.path.exists(b):
            raise unittest.SkipTest("no mesh binary: set MESH_BIN")
        os.environ["MESH_BIN"] = b
    return b


def apart_possible():
    """Whether a node can run where it does not see the workflows' folder
    (root, ``unshare -m``: a mount namespace of its own)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return r.returncode == 0


def _apart_binary(stale=None):
    """The mesh binary run in a mount namespace of its own, with an empty
    tmpfs over the workflows' folder: another machine. ``stale``: (a
    folder, the workflow folder it is copied to there): that machine has
    its own old copy of a workflow at the same path (rsynced once)."""
    root = workflows_root()
    setup = "mount -t tmpfs tmpfs %s && " % shlex.quote(root)
    if stale is not None:
        src, dest = stale
        setup += "mkdir -p %s && cp -a %s/. %s && " % (shlex.quote(dest), shlex.quote(src), shlex.quote(dest))
    fd, path = tempfile.mkstemp(prefix="mesh-smk-apart-", suffix=".sh")
    with os.fdopen(fd, "w") as f:
        f.write("#!/bin/sh\nexec unshare -m sh -c %s %s \"$@\"\n" % (shlex.quote(setup + 'exec "$0" "$@"'), shlex.quote(mesh_bin())))
    os.chmod(path, 0o755)
    atexit.register(lambda: os.path.exists(path) and os.remove(path))
    return path


def node(test=None, apart=False, stale=None, join=None, **kw):
    """A node (``mesh.local``), stopped with the test (or the class);
    ``apart``: one that does not see the workflows' folder; ``join``: a
    node to join."""
    mesh_bin()
    workflows_root()
    if apart or stale:
        kw["binary"] = _apart_binary(stale)
    if join is not None:
        kw["join"] = join.address
        kw["key"] = os.path.join(join.state_dir, "mesh.key")
    n = mesh.local(start_within=WAIT_S, **kw)
    if test is not None:
        test.addCleanup(n.stop)
    return n


def wait_nodes(first, count):
    deadline = time.monotonic() + WAIT_S
    while len(first.status()["nodes"]) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    if len(first.status()["nodes"]) < count:
        raise AssertionError("the mesh has %d nodes, not %d" % (len(first.status()["nodes"]), count))


def files_of(folder):
    """Every file a workflow made or has (relative paths), but Snakemake's
    own folder and git's (Snakemake runs `git ls-files` for a remote
    executor's sources, which may write git's index)."""
    out = set()
    for d, dirs, files in os.walk(folder):
        rel = os.path.relpath(d, folder)
        dirs[:] = [x for x in dirs if not (rel == "." and x in (".snakemake", ".git"))]
        for f in files:
            out.add(os.path.normpath(os.path.join(rel, f)))
    return out


def same_outputs(test, ref, got, ignore=(), compare=None):
    """The same files in both folders, byte for byte (``compare(path, a,
    b)`` for those it says differ legitimately)."""
    a, b = files_of(ref), files_of(got)
    a = {f for f in a if not any(f.startswith(i) for i in ignore)}
    b = {f for f in b if not any(f.startswith(i) for i in ignore)}
    test.assertEqual(sorted(b - a), [], "files only in %s" % got)
    test.assertEqual(sorted(a - b), [], "files missing in %s" % got)
    for f in sorted(a):
        pa, pb = os.path.join(ref, f), os.path.join(got, f)
        if os.path.islink(pa) or os.path.islink(pb):
            continue
        if compare is not None:
            r = compare(f, pa, pb)
            if r is not None:
                test.assertTrue(r, "%s differs" % f)
                continue
        test.assertTrue(filecmp.cmp(pa, pb, shallow=False), "%s differs" % f)
