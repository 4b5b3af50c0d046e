"""The examples in examples/python run as they are, on a throwaway node."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import nodes

EXAMPLES = os.path.join(nodes.REPO, "examples", "python")


def run_example(name, folder, env_more=None):
    env = dict(os.environ)
    env.update(env_more or {})
    env["MESH_BIN"] = nodes.mesh_bin()
    # No node of the user's: the example starts its own.
    env["MESH_STATE_DIR"] = os.path.join(folder, "no-node")
    env.pop("MESH_ADDR", None)
    r = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=nodes.WAIT_S,
    )
    assert r.returncode == 0, "%s exited %d:\n%s\n%s" % (name, r.returncode, r.stdout, r.stderr)
    return r.stdout


class Examples(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mesh-py-ex-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_seed_004s_workflow(self):
        out = run_example("user_workflow.py", self.dir)
        results = [l for l in out.splitlines() if l.startswith("result: ")]
        self.assertEqual(len(results), 8, out)
        self.assertEqual(
            sorted(r.split()[1] for r in results),
            sorted("experiment/%d" % i for i in range(1, 9)),
        )
        self.assertIn("8 of 8 done, 0 failed", out)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "mesh-out", "freefem", "map", "0", "iv.dat")))

    def test_the_sweep_prints_the_best_so_far(self):
        out = run_example("hyperparams.py", self.dir)
        runs = [l for l in out.splitlines() if l.startswith("train/")]
        self.assertEqual(len(runs), 30, out)
        self.assertIn("<- best so far", runs[0])
        self.assertIn("best: lr=0.003 depth=6", out)


FREEFEM = """#!/bin/sh
# FreeFem++-nw for the test: reads the model and the mesh func staged
# beside it, and writes the I-V point as the real script would.
set -e
test -s "$1"
test -s BF_RefMeshLIR_100x100x95x100.msh
current=$(awk -v v="$2" 'BEGIN { printf "%.6f", 0.035 - 1e-12 * (exp(v / 0.0259) - 1) }')
echo "solved $1 at V=$2: I=$current"
printf '%s %s\\n' "$2" "$current" > iv.dat
"""


class DaskExamples(unittest.TestCase):
    """Dask's code with mesh in place of Dask (examples/python/dask)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mesh-py-dask-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_seed_004s_user_workflow_with_its_func_unchanged(self):
        if not shutil.which("rsync"):
            self.skipTest("seed 004's func runs rsync, which is not installed")
        # The job's folder, as the seed's sched.slurm runs it.
        for f in ("foo.txt", "wrapper.sh"):
            shutil.copy(os.path.join(EXAMPLES, f), self.dir)
        shutil.copytree(os.path.join(EXAMPLES, "user_case"), os.path.join(self.dir, "user_case"))
        bin_dir = os.path.join(self.dir, "bin")
        os.makedirs(bin_dir)
        with open(os.path.join(bin_dir, "FreeFem++-nw"), "w") as f:
            f.write(FREEFEM)
        os.chmod(os.path.join(bin_dir, "FreeFem++-nw"), 0o755)
        env = {"EXP_NAME": "experiment", "PWD": self.dir, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
        out = run_example(os.path.join("dask", "user_workflow.py"), self.dir, env)
        self.assertEqual([l for l in out.splitlines() if l.startswith("result: ")], ["result:  True"] * 8, out)
        with open(os.path.join(EXAMPLES, "foo.txt")) as f:
            volts = f.read().split()
        for i, v in enumerate(volts, 1):
            d = os.path.join(self.dir, "experiment", str(i))
            with open(os.path.join(d, "iv.dat")) as f:
                self.assertEqual(f.read().split()[0], v, "task %d's own voltage" % i)
            with open(os.path.join(d, "out.log")) as f:
                self.assertIn("running FreeFem++-nw pv_LIR_etau_IVCurve_SF.edp %s" % v, f.read())

    def test_seed_003s_snippets(self):
        out = run_example(os.path.join("dask", "seed003.py"), self.dir)
        self.assertIn("lambda: 11", out)
        self.assertIn("slow_increment: 5001", out)
        self.assertIn("sum: 55", out)

    def test_experiments_holding_a_token_each(self):
        out = run_example(os.path.join("dask", "tokens.py"), self.dir)
        self.assertEqual(len([l for l in out.splitlines() if l.startswith("alpha=")]), 10, out)
        self.assertIn("at most 2 at once; best alpha=0.3", out)


if __name__ == "__main__":
    unittest.main()
