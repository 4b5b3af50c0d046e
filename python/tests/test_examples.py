"""The examples in examples/python run as they are, on a throwaway node."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import nodes

EXAMPLES = os.path.join(nodes.REPO, "examples", "python")


def run_example(name, folder):
    env = dict(os.environ)
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


if __name__ == "__main__":
    unittest.main()
