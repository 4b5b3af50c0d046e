"""The differential test against Dask (dask_diff.py) at length: many sessions, every mode.

    python python/tests/bench_dask_diff.py [--sessions 2000] [--seed S] [--batch 25]
        [--modes local,connect,resume,apart] [--kinds k1,k2] [--every-mode]
        [--only 17,42] [--self-check] [--keep DIR] [--out REPORT]

Needs dask[distributed], numpy and cloudpickle in the Python that runs it,
and the mesh binary (``$MESH_BIN``, else ``target/debug/mesh``). Each batch
of sessions is one script, run with Dask's ``LocalCluster`` and with mesh:
in one mode per batch, in turn, or in every mode (``--every-mode``).
``--self-check`` runs the Dask script in place of mesh's: any difference
then is the generator's (a value that is not Dask's own every time), not
mesh's. Prints the table of what was compared and found, and each first
difference's own script; exits 1 on any difference.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import dask_diff  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--seed", default=None, help="default: the time, printed")
    ap.add_argument("--batch", type=int, default=25, help="sessions per script")
    ap.add_argument("--modes", default=",".join(dask_diff.MODES))
    ap.add_argument("--kinds", default=",".join(dask_diff.KINDS))
    ap.add_argument("--every-mode", action="store_true", help="each batch in every mode, not one mode per batch in turn")
    ap.add_argument("--only", default="", help="these sessions only: 17,42 or 25-49")
    ap.add_argument("--self-check", action="store_true", help="Dask against Dask: the generator's own determinism")
    ap.add_argument("--keep", default=None, help="keep the scripts and their folders here")
    ap.add_argument("--out", default=None, help="write the report here too")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    settings = {
        "sessions": a.sessions,
        "seed": a.seed or str(int(time.time())),
        "kinds": [k for k in a.kinds.split(",") if k],
        "modes": [m for m in a.modes.split(",") if m],
        "batch": a.batch,
        "only": dask_diff.parse_only(a.only),
        "keep": a.keep,
    }
    for k in settings["kinds"]:
        if k not in dask_diff.KINDS:
            ap.error("no step kind %s (kinds: %s)" % (k, ", ".join(dask_diff.KINDS)))
    for m in settings["modes"]:
        if m not in dask_diff.MODES:
            ap.error("no mode %s (modes: %s)" % (m, ", ".join(dask_diff.MODES)))
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        sys.exit("needs dask[distributed]: pip install -r python/requirements-ci.txt")
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
        root = tempfile.mkdtemp(prefix="mesh-diff-", dir=a.keep)
    else:
        root = tempfile.mkdtemp(prefix="mesh-diff-")
    log = (lambda s: None) if a.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    meshes = dask_diff.Meshes(root)
    t0 = time.monotonic()
    try:
        tally, unavailable = dask_diff.run_all(
            settings, meshes, log=log, every_mode=a.every_mode, self_check=a.self_check,
            skip=lambda m, why: print("mode %s skipped: %s" % (m, why), file=sys.stderr, flush=True),
        )
    finally:
        meshes.stop()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    text = dask_diff.report(tally, settings)
    text += "\n\n%d sessions compared in %.0f s%s" % (sum(tally.sessions.values()), time.monotonic() - t0, " (Dask against Dask)" if a.self_check else "")
    for m, why in unavailable.items():
        text += "\nmode %s skipped: %s" % (m, why)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    sys.exit(1 if tally.diffs else 0)


if __name__ == "__main__":
    main()
