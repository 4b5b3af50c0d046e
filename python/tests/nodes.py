"""Real mesh nodes for the tests: the binary cargo built, on 127.0.0.1, OS-picked ports, always stopped."""

import atexit
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import mesh  # noqa: E402

#: The longest a test waits for anything (a farm's end, a node's start).
WAIT_S = 120


def mesh_bin():
    """``$MESH_BIN``, else the debug binary of ``$CARGO_TARGET_DIR`` or ``target/``."""
    b = os.environ.get("MESH_BIN")
    if b:
        return b
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    b = os.path.join(target, "debug", "mesh")
    if not os.path.exists(b):
        raise unittest.SkipTest("no mesh binary at %s: run `cargo build -p mesh-cli` first, or set MESH_BIN" % b)
    return b


def start(cpus=2, join=None, hide=(), python=None, resources=None):
    """A node of ``cpus`` cores; joining ``join`` (a LocalNode) when given;
    in a mount namespace of its own with an empty tmpfs over each folder of
    ``hide`` (another machine, which does not see them: see apart_possible)."""
    os.environ["MESH_BIN"] = mesh_bin()
    binary = None
    if hide:
        binary = _hiding(hide)
    if join is None:
        return mesh.local(cpus=cpus, resources=resources, start_within=WAIT_S, binary=binary, python=python)
    return mesh.local(
        cpus=cpus,
        resources=resources,
        join=join.address,
        key=os.path.join(join.state_dir, "mesh.key"),
        start_within=WAIT_S,
        binary=binary,
        python=python,
    )


def apart_possible():
    """Whether a node can run in a mount namespace of its own (root, ``unshare -m``)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True)
    return r.returncode == 0


def _hiding(folders):
    """A program that runs the mesh binary in a new mount namespace with ``folders`` hidden."""
    mounts = "".join("mount -t tmpfs tmpfs %s && " % shlex.quote(f) for f in folders)
    fd, path = tempfile.mkstemp(prefix="mesh-apart-", suffix=".sh")
    with os.fdopen(fd, "w") as f:
        f.write("#!/bin/sh\nexec unshare -m sh -c %s %s \"$@\"\n" % (shlex.quote(mounts + 'exec "$0" "$@"'), shlex.quote(mesh_bin())))
    os.chmod(path, 0o755)
    # Gone with the tests (one was left in /tmp per node started apart).
    atexit.register(lambda: os.path.exists(path) and os.remove(path))
    return path


def wait_until(cond, limit=WAIT_S, every=0.05):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()
