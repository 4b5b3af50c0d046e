"""Benchmark: N jobs of `touch {output}` through `snakemake --executor mesh` on one node of 2 slots, each job a task and in group jobs of G jobs each, against `snakemake --cores 2`, same run.

    MESH_BIN=target/release/mesh python snakemake-executor-plugin-mesh/tests/bench_snakemake.py [--jobs 1000] [--group 50]

A remote executor starts a Snakemake process per job it is given; a group
job (`--groups touch=g --group-components g=G`) is one process for G jobs.

Needs snakemake (tests/requirements.txt) in the Python that runs it.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import test_plugin  # noqa: E402
from test_plugin import mesh, snakemake_env  # noqa: E402

SNAKEFILE = """
N = {n}

rule all:
    input: expand("t/{{i}}.txt", i=range(N))

rule touch:
    output: "t/{{i}}.txt"
    shell: "touch {{output}}"
"""


def timed(folder, *args):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=folder, env=snakemake_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--group", type=int, default=50)
    ap.add_argument("--no-per-job", action="store_true", help="only the group jobs (a job per task takes about 0.75 s a job here)")
    a = ap.parse_args()
    folders = []
    for _ in range(3):
        d = tempfile.mkdtemp(prefix="mesh-smk-bench-")
        with open(os.path.join(d, "Snakefile"), "w") as f:
            f.write(SNAKEFILE.format(n=a.jobs))
        folders.append(d)
    local_s = timed(folders[0], "--cores", "2")
    with mesh.local(cpus=2) as n:
        mesh_s = farms = None
        if not a.no_per_job:
            mesh_s = timed(folders[1], "--executor", "mesh", "--jobs", "1000", "--mesh-state-dir", n.state_dir)
            farms = len([f for f in n.farms() if f.name == "snakemake"])
        grouped_s = timed(
            folders[2], "--executor", "mesh", "--jobs", "1000", "--mesh-state-dir", n.state_dir,
            "--groups", "touch=g", "--group-components", "g=%d" % a.group,
        )
    for d in folders:
        shutil.rmtree(d, True)
    if mesh_s is not None:
        print(
            "snakemake: %d touch jobs: --executor mesh (1 node, 2 slots) %.1f s in %d farms, --cores 2 %.1f s: ratio %.2f (target <= 1.5)"
            % (a.jobs, mesh_s, farms, local_s, mesh_s / local_s)
        )
    print(
        "snakemake: the same in group jobs of %d: --executor mesh %.1f s: ratio %.2f to --cores 2"
        % (a.group, grouped_s, grouped_s / local_s)
    )


if __name__ == "__main__":
    main()
