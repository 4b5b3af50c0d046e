"""The ``mesh`` program: where it is, and what it says of itself.

What the package must agree on with the binary (the state folder a node
keeps its socket in, the order of a stage's fields in farm text) is read
from ``mesh describe --json`` rather than copied here, so that the two
cannot drift apart.
"""

import json
import os
import shutil
import subprocess
import sys
import threading

from ._errors import MeshError

#: Seconds ``mesh describe`` has to answer: it reads no state, only its
#: environment.
DESCRIBE_WITHIN_S = 30

_described = {}
_described_lock = threading.Lock()


def mesh_binary(binary=None):
    """The ``mesh`` program: ``binary``, ``$MESH_BIN``, ``mesh`` on PATH, or
    the one ``pip install`` put beside this Python (a venv not activated)."""
    b = binary or os.environ.get("MESH_BIN") or shutil.which("mesh")
    beside = os.path.join(os.path.dirname(sys.executable), "mesh")
    if not b and os.access(beside, os.X_OK):
        b = beside
    if not b:
        raise MeshError(
            "cannot find the mesh program: looked for $MESH_BIN (not set), `mesh` on PATH "
            "and %s (not there). pip install ./python brings it, or put it on PATH "
            "(cargo install --path cli), or set MESH_BIN" % beside
        )
    return b


def describe(binary=None, env=None, cwd=None):
    """What ``mesh describe --json`` says: ``state_dir`` (the state folder of
    that environment), ``stage_fields`` (a stage's fields in the order the
    docs list them), ``default_fields``, ``version``. ``env`` and ``cwd``:
    the environment and folder to ask it in (default: this process's).
    Asked once per program, environment and folder."""
    b = mesh_binary(binary)
    # Found here, not in `env` and `cwd`, which may be another process's.
    b = os.path.abspath(b) if os.sep in b else (shutil.which(b) or b)
    env = dict(os.environ if env is None else env)
    cwd = os.getcwd() if cwd is None else cwd
    try:
        st = os.stat(b)
        stamp = (st.st_ino, st.st_mtime_ns)
    except OSError:
        stamp = None
    # The whole environment, not the variables the rule reads: which those
    # are is the binary's to know.
    key = (b, stamp, cwd, frozenset(env.items()))
    with _described_lock:
        got = _described.get(key)
    if got is not None:
        return got
    try:
        r = subprocess.run(
            [b, "describe", "--json"],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DESCRIBE_WITHIN_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise MeshError("cannot run %s describe --json: %s" % (b, e)) from None
    if r.returncode != 0:
        said = r.stderr.strip() or "exit status %d" % r.returncode
        raise MeshError(
            "%s describe --json failed (the package needs a mesh as new as itself): %s" % (b, said)
        )
    try:
        got = json.loads(r.stdout)
        got["state_dir"], got["stage_fields"]
    except (ValueError, KeyError, TypeError):
        raise MeshError("%s describe --json said what this package cannot read: %r" % (b, r.stdout[:200])) from None
    with _described_lock:
        _described[key] = got
    return got
