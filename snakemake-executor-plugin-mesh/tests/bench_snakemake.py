"""Benchmark: Snakemake's jobs through `snakemake --executor mesh` on one node of 2 slots against `snakemake --cores 2`, same run.

    MESH_BIN=target/release/mesh python snakemake-executor-plugin-mesh/tests/bench_snakemake.py [--touch 1000] [--sleep 200] [--group 0] [--rounds 1]

Two workflows, no group jobs: N jobs of `touch {output}` (a job's own
cost, target <= 1.5x `--cores 2`) and M jobs of `sleep 0.5` (target <=
1.2x). `--group G` also runs the touch jobs in group jobs of G
(`--groups touch=g --group-components g=G`). Each round runs `--cores 2`
and the mesh one after the other, alternating which goes first.

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

import smk  # noqa: E402
from smk import mesh, snakemake_env  # noqa: E402

TOUCH = """
rule all:
    input: expand("t/{{i}}.txt", i=range({n}))

rule touch:
    output: "t/{{i}}.txt"
    shell: "touch {{output}}"
"""

SLEEP = """
rule all:
    input: expand("s/{{i}}.txt", i=range({n}))

rule nap:
    output: "s/{{i}}.txt"
    shell: "sleep 0.5; touch {{output}}"
"""


def timed(snakefile, *args):
    d = tempfile.mkdtemp(prefix="mesh-smk-bench-")
    try:
        with open(os.path.join(d, "Snakefile"), "w") as f:
            f.write(snakefile)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=d, env=snakemake_env(), capture_output=True, text=True)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr[-3000:]
        return took
    finally:
        shutil.rmtree(d, True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--touch", type=int, default=1000, help="touch jobs (0: none)")
    ap.add_argument("--sleep", type=int, default=200, help="sleep 0.5 jobs (0: none)")
    ap.add_argument("--group", type=int, default=0, help="also the touch jobs in group jobs of G")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    cases = []
    if a.touch:
        cases.append(("%d touch jobs" % a.touch, TOUCH.format(n=a.touch), [], 1.5))
    if a.sleep:
        cases.append(("%d sleep 0.5 jobs" % a.sleep, SLEEP.format(n=a.sleep), [], 1.2))
    if a.touch and a.group:
        cases.append(
            ("%d touch jobs in group jobs of %d" % (a.touch, a.group), TOUCH.format(n=a.touch), ["--groups", "touch=g", "--group-components", "g=%d" % a.group], None)
        )
    smk.mesh_bin()
    with mesh.local(cpus=2) as n:
        # The node's warm workers are started by a first workflow, as a
        # user's second run finds them.
        timed(TOUCH.format(n=4), "--executor", "mesh", "--jobs", "100", "--mesh-state-dir", n.state_dir)
        for r in range(a.rounds):
            for name, snakefile, extra, target in cases:
                runs = [("cores", ["--cores", "2"]), ("mesh", ["--executor", "mesh", "--jobs", "1000", "--mesh-state-dir", n.state_dir] + extra)]
                if r % 2:
                    runs.reverse()
                took = {k: timed(snakefile, *args) for k, args in runs}
                ratio = took["mesh"] / took["cores"]
                print(
                    "snakemake: %s: --executor mesh (1 node, 2 slots) %.1f s, --cores 2 %.1f s: ratio %.2f%s"
                    % (name, took["mesh"], took["cores"], ratio, "" if target is None else " (target <= %.1f)" % target),
                    flush=True,
                )


if __name__ == "__main__":
    main()
