"""Real mesh nodes for the tests: the binary cargo built, on 127.0.0.1, OS-picked ports, always stopped."""

import os
import sys
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


def start(cpus=2, join=None):
    """A node of ``cpus`` cores; joining ``join`` (a LocalNode) when given."""
    os.environ["MESH_BIN"] = mesh_bin()
    if join is None:
        return mesh.local(cpus=cpus, start_within=WAIT_S)
    return mesh.local(
        cpus=cpus,
        join=join.address,
        key=os.path.join(join.state_dir, "mesh.key"),
        start_within=WAIT_S,
    )


def wait_until(cond, limit=WAIT_S, every=0.05):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()
