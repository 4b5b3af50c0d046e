"""Benchmark: 10,000 ``true`` tasks through ``client.map`` and ``as_completed`` against ``mesh run`` of the same farm, and the time to the first result.

    python3 python/tests/bench_client.py [--tasks 10000] [--pairs 3] [--bin target/release/mesh]

Each pair runs the Python client (a node started for it, already up: what
a notebook has) and ``mesh run`` one after the other, alternating which
goes first, in the same folder with the same cores; the ratio is of the
medians. The client's wall time runs from the call of ``map`` (the farm
written as TOML, sent, checked and made durable by the node) to the last
task out of ``as_completed``; ``mesh run``'s from its start to its exit.
The first result is timed from the call of ``map`` too.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import mesh  # noqa: E402


def python_run(client, n, folder, name):
    t0 = time.monotonic()
    run = client.map("true", range(n), root=folder, out=os.path.join(folder, "out-py"), name=name)
    first = None
    count = 0
    for _ in run.as_completed(progress=False):
        if first is None:
            first = time.monotonic() - t0
        count += 1
    wall = time.monotonic() - t0
    assert count == n, (count, n)
    return wall, first


def mesh_run(binary, farm_file, folder, cpus):
    out = os.path.join(folder, "out-run")
    shutil.rmtree(out, ignore_errors=True)
    state = os.path.join(folder, "run-state")
    shutil.rmtree(state, ignore_errors=True)
    t0 = time.monotonic()
    r = subprocess.run(
        [binary, "--state-dir", state, "run", farm_file, "--out", out, "--resources", "cpu=%d" % cpus, "-q", "--rerun"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--bin", default=None, help="the mesh binary (default: target/release/mesh, $MESH_BIN)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    binary = a.bin or os.environ.get("MESH_BIN") or os.path.join(target, "release", "mesh")
    folder = tempfile.mkdtemp(prefix="mesh-bench-py-")
    try:
        # The same farm, as the client writes it, for `mesh run`.
        farm = mesh.Farm("bench", root=folder)
        farm.stage("map", command=["true"], sweep={"arg0": range(a.tasks)})
        farm_file = os.path.join(folder, "bench.toml")
        farm.save(farm_file)
        py, first, runs = [], [], []
        with mesh.local(cpus=a.cpus, binary=binary) as client:
            # A name of its own for each farm of the client: a farm of a name
            # run before would reuse every result (the content key).
            for i in range(a.pairs):
                order = ["py", "run"] if i % 2 == 0 else ["run", "py"]
                for which in order:
                    if which == "py":
                        w, f = python_run(client, a.tasks, folder, "bench-%d" % i)
                        py.append(w)
                        first.append(f)
                    else:
                        runs.append(mesh_run(binary, farm_file, folder, a.cpus))
                print(
                    "pair %d: client %.2f s (first result %.3f s), mesh run %.2f s" % (i + 1, py[-1], first[-1], runs[-1]),
                    flush=True,
                )
            # The first result of a farm submitted to an idle node.
            time.sleep(1)
            idle_first = [python_run(client, 1, folder, "first-%d" % i)[1] for i in range(5)]
        fig = {
            "tasks": a.tasks,
            "cpus": a.cpus,
            "client_wall_s": py,
            "mesh_run_wall_s": runs,
            "ratio_of_medians": statistics.median(py) / statistics.median(runs),
            "first_result_s": first,
            "first_result_idle_node_s": idle_first,
        }
        print(
            "client.map + as_completed / mesh run, %d x true on %d cores: %.3f (medians %.2f s / %.2f s; target <= 1.1)"
            % (a.tasks, a.cpus, fig["ratio_of_medians"], statistics.median(py), statistics.median(runs))
        )
        print(
            "first result after submit: %.3f s at most in the big farms; %.3f s median for a one-task farm on an idle node (target <= 0.5 s)"
            % (max(first), statistics.median(idle_first))
        )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(fig, f, indent=2)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
