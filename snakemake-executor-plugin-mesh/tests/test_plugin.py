"""snakemake --executor mesh against real nodes and real Snakemake: the same outputs as --cores 2, a failing rule's log, nothing rerun, Ctrl-C."""

import filecmp
import os
import shutil
import signal
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

WAIT_S = 300
OUTPUTS = ["sq/a.txt", "sq/b.txt", "sq/c.txt", "sq/d.txt", "summary.txt", "parts/p1.txt", "parts/p2.txt", "parts/p3.txt", "up/p1.txt", "up/p2.txt", "up/p3.txt", "agg.txt", "once/a.txt", "once/b.txt", "twice/a.txt", "twice/b.txt"]


def snakemake_env():
    env = dict(os.environ)
    # The plugin and `import mesh` from this repository, as `pip install` puts them.
    env["PYTHONPATH"] = os.pathsep.join([PLUGIN, os.path.join(REPO, "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def snakemake(folder, *args, timeout=WAIT_S):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=folder,
        env=snakemake_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def workflow_folder(test):
    d = tempfile.mkdtemp(prefix="mesh-smk-")
    test.addCleanup(shutil.rmtree, d, True)
    shutil.copy(os.path.join(HERE, "workflow", "Snakefile"), d)
    return d


def node(test, **kw):
    if not os.environ.get("MESH_BIN"):
        b = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"), "debug", "mesh")
        if not os.path.exists(b):
            raise unittest.SkipTest("no mesh binary: set MESH_BIN")
        os.environ["MESH_BIN"] = b
    n = mesh.local(start_within=WAIT_S, **kw)
    test.addCleanup(n.stop)
    return n


class Plugin(unittest.TestCase):
    def reference(self):
        ref = workflow_folder(self)
        r = snakemake(ref, "--cores", "2", "--resources", "token=1")
        self.assertEqual(r.returncode, 0, r.stderr)
        return ref

    def same_outputs(self, ref, got):
        for f in OUTPUTS:
            self.assertTrue(os.path.exists(os.path.join(got, f)), "%s missing" % f)
            self.assertTrue(filecmp.cmp(os.path.join(ref, f), os.path.join(got, f), shallow=False), "%s differs" % f)

    def test_one_node_same_outputs_a_failing_rules_log_and_nothing_rerun(self):
        ref = self.reference()
        n = node(self, cpus=2, resources={"token": 1})
        d = workflow_folder(self)
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.same_outputs(ref, d)
        # Every job ran as a task of the workflow's farms, on the node.
        farms = [f for f in n.farms() if f.name == "snakemake"]
        # 4 square, gather, split, 3 upper, agg, and a group job (once, twice) per sample.
        self.assertEqual(sum(f.done for f in farms), 12, farms)
        self.assertEqual(len(farms), 1, "the workflow run's jobs in one open farm: %s" % farms)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(f.finished for f in n.farms() if f.name == "snakemake"):
            time.sleep(0.2)
        self.assertTrue(all(f.finished for f in n.farms() if f.name == "snakemake"), "closed when the workflow ended")
        # Snakemake's own up-to-date check: a second run sends nothing.
        before = len(n.farms())
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Nothing to be done", r.stderr + r.stdout)
        self.assertEqual(len(n.farms()), before)
        # A failing rule: Snakemake says it, with the job's log.
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir, "bad.txt")
        self.assertNotEqual(r.returncode, 0)
        said = r.stderr + r.stdout
        self.assertIn("Error in rule fails", said)
        self.assertIn("ended with exit code 3", said)
        self.assertIn("logs/bad.log", said)
        logs = os.path.join(d, ".snakemake", "mesh_logs", "fails")
        (log,) = os.listdir(logs)
        with open(os.path.join(logs, log)) as f:
            self.assertIn("solver diverged", f.read())
        self.assertIn(os.path.join(".snakemake", "mesh_logs", "fails", log), said)

    def test_three_nodes_same_outputs(self):
        ref = self.reference()
        first = node(self, cpus=1, resources={"token": 1})
        key = os.path.join(first.state_dir, "mesh.key")
        others = [node(self, cpus=1, resources={"token": 1}, join=first.address, key=key) for _ in range(2)]
        deadline = time.monotonic() + WAIT_S
        while len(first.status()["nodes"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        d = workflow_folder(self)
        r = snakemake(d, "--executor", "mesh", "--jobs", "6", "--mesh-state-dir", first.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.same_outputs(ref, d)
        ran_on = set()
        for f in first.farms():
            if f.name == "snakemake":
                ran_on |= {t.node for t in first.run(f.id).tasks()}
        self.assertGreater(len(ran_on), 1, "jobs ran on more than one node")
        del others

    def slow_workflow(self, targets, running):
        """A node, and Snakemake run on it in the background for the slow
        jobs `targets` until `running` of them run: the node and the process."""
        n = node(self, cpus=2)
        d = workflow_folder(self)
        p = subprocess.Popen(
            [sys.executable, "-m", "snakemake", "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir, *targets],
            cwd=d,
            env=snakemake_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.addCleanup(lambda: p.poll() is None and p.kill())
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and sum(f.running for f in n.farms()) < running:
            time.sleep(0.2)
        return n, p

    def test_ctrl_c_leaves_no_task_running(self):
        n, p = self.slow_workflow(["slow/1.txt", "slow/2.txt", "slow/3.txt"], running=2)
        self.assertGreaterEqual(sum(f.running for f in n.farms()), 2)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=WAIT_S)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum(f.running for f in n.farms()) > 0:
            time.sleep(0.2)
        self.assertEqual(sum(f.running for f in n.farms()), 0, "the sleeps were killed")

    def test_a_killed_snakemake_leaves_no_farm_open(self):
        n, p = self.slow_workflow(["slow/1.txt"], running=1)
        self.assertEqual([(f.name, f.open) for f in n.farms()], [("snakemake", True)])
        # No shutdown runs: the node sees the workflow gone, and closes its
        # farm (its job runs on, and the farm ends with it).
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=WAIT_S)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(f.open for f in n.farms()):
            time.sleep(0.2)
        self.assertEqual([(f.name, f.open, f.running) for f in n.farms()], [("snakemake", False, 1)])


if __name__ == "__main__":
    unittest.main()
