"""snakemake --executor mesh against real nodes and real Snakemake, as its users run it.

The same outputs as --cores 2 on one node and on three (two of which do
not see the workflow folder), a failing rule's own exit code and log, a
second run that sends nothing; and each way a job could be lost from
Snakemake's sight (issue 62): a job asking more than any node has, a task
that fits no node, one cancelled, a node gone for good, a time limit, a
stale copy of the folder on a node, Snakemake killed, Ctrl-C.
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import smk  # noqa: E402
from smk import WAIT_S, node, snakemake  # noqa: E402

OUTPUTS = ["sq/a.txt", "sq/b.txt", "sq/c.txt", "sq/d.txt", "summary.txt", "parts/p1.txt", "parts/p2.txt", "parts/p3.txt", "up/p1.txt", "up/p2.txt", "up/p3.txt", "agg.txt", "once/a.txt", "once/b.txt", "twice/a.txt", "twice/b.txt"]


def workflow_folder(test):
    return smk.folder_of(test, src=os.path.join(HERE, "workflow"))


def farms_of(n):
    return [f for f in n.farms() if f.name == "snakemake"]


def running(n):
    return sum(f.running for f in n.farms())


def plugins_words(out):
    """What Snakemake said, but the mesh client's own line while it waits
    for a node to come back (the client's words, for Python users)."""
    return "\n".join(line for line in out.splitlines() if " went away" not in line)


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def wait_for(cond, limit=WAIT_S):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


class Plugin(unittest.TestCase):
    def reference(self):
        ref = workflow_folder(self)
        r = snakemake(ref, "--cores", "2", "--resources", "token=1")
        self.assertEqual(r.returncode, 0, r.stderr)
        return ref

    def same_outputs(self, ref, got):
        for f in OUTPUTS:
            self.assertTrue(os.path.exists(os.path.join(got, f)), "%s missing" % f)
        smk.same_outputs(self, ref, got, ignore=["logs"])

    def test_one_node_same_outputs_a_failing_rules_log_and_nothing_rerun(self):
        ref = self.reference()
        n = node(self, cpus=2, resources={"token": 1})
        d = workflow_folder(self)
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.same_outputs(ref, d)
        self.assertEqual(len(farms_of(n)), 1, "the workflow run's jobs in one open farm: %s" % n.farms())
        self.assertTrue(wait_for(lambda: all(f.finished for f in farms_of(n)), 30), "closed when the workflow ended")
        # Snakemake's own up-to-date check: a second run sends nothing.
        before = len(n.farms())
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Nothing to be done", r.stderr + r.stdout)
        self.assertEqual(len(n.farms()), before)
        # A failing rule: Snakemake says it, with the job's own exit code
        # (3, not its Snakemake's 1), set apart from Snakemake's next words.
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir, "bad.txt")
        self.assertNotEqual(r.returncode, 0)
        said = r.stderr + r.stdout
        self.assertIn("Error in rule fails", said)
        self.assertRegex(said, r"the job's command ended with exit code 3\.\n")
        self.assertIn("logs/bad.log", said)
        logs = os.path.join(d, ".snakemake", "mesh_logs", "fails")
        (log,) = os.listdir(logs)
        with open(os.path.join(logs, log)) as f:
            self.assertIn("solver diverged", f.read())
        self.assertIn(os.path.join(".snakemake", "mesh_logs", "fails", log), said)
        # `mesh logs TASK --farm FARM`, as the docs say, shows the same.
        farm, task = re.search(r"mesh task (\S+) of (\S+):", said).group(2, 1)
        got = subprocess.run(
            [smk.mesh_bin(), "logs", task, "--farm", farm, "--state-dir", n.state_dir], capture_output=True, text=True
        )
        self.assertEqual(got.returncode, 0, got.stderr)
        self.assertIn("solver diverged", got.stdout + got.stderr)

    def test_three_nodes_two_apart_same_outputs(self):
        """Two of three nodes do not see the workflow folder: their jobs run
        in copies the mesh brings, and come back."""
        ref = self.reference()
        apart = smk.apart_possible()
        first = node(self, cpus=1, resources={"token": 1})
        others = [node(self, apart=apart, cpus=1, resources={"token": 1}, join=first) for _ in range(2)]
        smk.wait_nodes(first, 3)
        d = workflow_folder(self)
        r = snakemake(d, "--executor", "mesh", "--jobs", "6", "--mesh-state-dir", first.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.same_outputs(ref, d)
        ran_on = set()
        for f in farms_of(first):
            ran_on |= {t.node for t in first.run(f.id).tasks()}
        self.assertGreater(len(ran_on), 1, "jobs ran on more than one node")
        del others

    def test_threads_above_the_largest_node_run_with_its_cores(self):
        """The tutorial's `threads: 8` on a 2-core mesh: as --cores 2, the job
        runs with 2 threads (it hung, unplaceable, before)."""
        sf = 'rule all:\n    input: "t.txt"\n\nrule t:\n    output: "t.txt"\n    threads: 8\n    shell: "echo {threads} > {output}"\n'
        ref = smk.folder_of(self, snakefile=sf)
        self.assertEqual(snakemake(ref, "--cores", "2").returncode, 0)
        n = node(self, cpus=2)
        d = smk.folder_of(self, snakefile=sf)
        r = snakemake(d, "--executor", "mesh", "--jobs", "2", "--mesh-state-dir", n.state_dir, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        smk.same_outputs(self, ref, d)

    def test_memory_or_gpus_no_node_has_fail_the_job_at_once_in_words(self):
        sf = (
            'rule all:\n    input: "g.txt", "m.txt", "ok.txt"\n\n'
            'rule g:\n    output: "g.txt"\n    resources: gpu=1\n    shell: "touch {output}"\n\n'
            'rule m:\n    output: "m.txt"\n    resources: mem_mb=93000000\n    shell: "touch {output}"\n\n'
            'rule ok:\n    output: "ok.txt"\n    shell: "touch {output}"\n'
        )
        n = node(self, cpus=2)
        d = smk.folder_of(self, snakefile=sf)
        t0 = time.monotonic()
        r = snakemake(d, "--executor", "mesh", "--jobs", "3", "--keep-going", "--mesh-state-dir", n.state_dir, timeout=120)
        self.assertLess(time.monotonic() - t0, 60)
        self.assertNotEqual(r.returncode, 0)
        said = r.stderr + r.stdout
        self.assertRegex(said, r"it asks gpu=1, more than any node of the mesh has: no node has any; the largest node: \S+ \(cpu=2")
        self.assertRegex(said, r"it asks mem_mb=93000000, more than any node of the mesh has: [0-9.]+ GB on the node with the most")
        self.assertTrue(os.path.exists(os.path.join(d, "ok.txt")), "the job that fits ran")

    def test_a_resource_no_node_offers_is_ignored_with_one_warning(self):
        """As Snakemake without --resources: a rule's `token=1` holds nothing."""
        sf = 'rule all:\n    input: expand("t/{i}.txt", i=range(3))\n\nrule t:\n    output: "t/{i}.txt"\n    resources: token=1\n    shell: "touch {output}"\n'
        n = node(self, cpus=2)
        d = smk.folder_of(self, snakefile=sf)
        r = snakemake(d, "--executor", "mesh", "--jobs", "3", "--mesh-state-dir", n.state_dir, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        said = r.stderr + r.stdout
        self.assertEqual(said.count("resource token (asked by rule t) is offered by no node of the mesh: ignored"), 1, said)

    def test_a_task_that_fits_no_node_is_reported_failed(self):
        """Each ask alone fits some node, together none: the mesh cannot
        place the task, and Snakemake hears it in seconds."""
        sf = 'rule all:\n    input: "t.txt"\n\nrule t:\n    output: "t.txt"\n    threads: 2\n    resources: token=1\n    shell: "touch {output}"\n'
        first = node(self, cpus=2)
        other = node(self, cpus=1, resources={"token": 1}, join=first)
        smk.wait_nodes(first, 2)
        d = smk.folder_of(self, snakefile=sf)
        t0 = time.monotonic()
        r = snakemake(d, "--executor", "mesh", "--jobs", "2", "--mesh-state-dir", first.state_dir, timeout=120)
        self.assertLess(time.monotonic() - t0, 60)
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr + r.stdout, r"mesh task \S+ of \S+: (unplaceable: )?stage \S+ fits no node of the mesh: token=1 asked, 0 on the largest node")
        del other

    def slow_workflow(self, targets, running_at_least, *extra, n=None):
        """Snakemake run in the background for the slow jobs `targets` until
        `running_at_least` of them run: the node and the process."""
        n = n or node(self, cpus=2)
        d = workflow_folder(self)
        p = smk.popen(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", n.state_dir, *extra, *targets)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        self.assertTrue(wait_for(lambda: running(n) >= running_at_least), "the slow jobs run")
        return n, p, d

    def test_a_cancelled_task_is_reported_failed(self):
        n, p, _ = self.slow_workflow(["slow/1.txt"], 1)
        (f,) = farms_of(n)
        (t,) = [t for t in n.run(f.id).tasks() if t.state == "unfinished"]
        n.run(f.id).cancel_task(t.task)
        out, _ = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertRegex(out, r"the mesh did not run mesh task %s of %s" % (re.escape(t.task), f.id))

    def test_a_node_gone_for_good_ends_the_workflow_in_words_and_ctrl_c_is_clean(self):
        n, p, _ = self.slow_workflow(["slow/1.txt"], 1, "--mesh-lost-after", "3")
        n.proc.kill()
        n.proc.wait()
        out, _ = p.communicate(timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("has not answered for 3 s (no mesh node runs with state folder", out)
        self.assertNotIn("Traceback", out)
        self.assertNotIn("mesh.local()", plugins_words(out))
        # Ctrl-C while the node is gone: no traceback either.
        n, p, _ = self.slow_workflow(["slow/1.txt"], 1)
        n.proc.kill()
        n.proc.wait()
        time.sleep(1)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=60)
        self.assertNotIn("Traceback", out)
        self.assertNotIn("mesh.local()", plugins_words(out))

    def test_runtime_is_the_time_limit(self):
        """`resources: runtime=1` (minutes) stops a job of `sleep 100` after
        a minute, as SLURM's time limit would."""
        sf = 'rule all:\n    input: "t.txt"\n\nrule t:\n    output: "t.txt"\n    resources: runtime=1\n    shell: "sleep 100; touch {output}"\n'
        n = node(self, cpus=2)
        d = smk.folder_of(self, snakefile=sf)
        t0 = time.monotonic()
        r = snakemake(d, "--executor", "mesh", "--jobs", "1", "--mesh-state-dir", n.state_dir, timeout=150)
        took = time.monotonic() - t0
        self.assertNotEqual(r.returncode, 0)
        self.assertLess(took, 95)
        self.assertRegex(r.stderr + r.stdout, r"timed out.*\(its runtime resource is its time limit\)")

    def test_thin_jobs_go_several_to_a_task(self):
        """Jobs that take no time are packed by their measured cost: fewer
        tasks than jobs, the same outputs as --cores 2."""
        sf = 'rule all:\n    input: expand("t/{i}.txt", i=range(60))\n\nrule t:\n    output: "t/{i}.txt"\n    shell: "echo {wildcards.i} > {output}"\n'
        ref = smk.folder_of(self, snakefile=sf)
        self.assertEqual(snakemake(ref, "--cores", "2").returncode, 0)
        n = node(self, cpus=2)
        d = smk.folder_of(self, snakefile=sf)
        r = snakemake(d, "--executor", "mesh", "--jobs", "100", "--mesh-state-dir", n.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        smk.same_outputs(self, ref, d)
        (f,) = farms_of(n)
        tasks = n.run(f.id).tasks()
        self.assertLess(len(tasks), 30, "60 thin jobs in fewer tasks")

    def test_a_failing_job_among_packed_ones_fails_alone(self):
        sf = (
            'rule all:\n    input: expand("t/{i}.txt", i=range(40))\n\n'
            'rule t:\n    output: "t/{i}.txt"\n    shell: "test {wildcards.i} != 27 && echo {wildcards.i} > {output}"\n'
        )
        n = node(self, cpus=2)
        d = smk.folder_of(self, snakefile=sf)
        r = snakemake(d, "--executor", "mesh", "--jobs", "100", "--keep-going", "--mesh-state-dir", n.state_dir)
        self.assertNotEqual(r.returncode, 0)
        made = sorted(int(f[:-4]) for f in os.listdir(os.path.join(d, "t")))
        self.assertEqual(made, [i for i in range(40) if i != 27])
        said = r.stderr + r.stdout
        self.assertGreaterEqual(said.count("Error in rule t:"), 1, said)
        self.assertRegex(said, r"the job failed \(the task ran \d+ thin jobs of rule t")
        (f,) = farms_of(n)
        self.assertLess(len(n.run(f.id).tasks()), 20, "packed")

    def test_ctrl_c_leaves_no_task_running(self):
        n, p, _ = self.slow_workflow(["slow/1.txt", "slow/2.txt", "slow/3.txt"], 2)
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=WAIT_S)
        self.assertTrue(wait_for(lambda: running(n) == 0, 30), "the sleeps were killed")
        self.assertNotIn("Traceback", out)

    def test_sighup_and_sigterm_leave_no_task_running(self):
        """A closed terminal (SIGHUP) or `kill` (SIGTERM): the jobs are
        cancelled, none starts after (they went on, and two queued ones
        started after Snakemake was gone)."""
        for sig in (signal.SIGHUP, signal.SIGTERM):
            n, p, _ = self.slow_workflow(["slow/1.txt", "slow/2.txt", "slow/3.txt", "slow/4.txt"], 2)
            p.send_signal(sig)
            # A bound, not a speed: as the Ctrl-C test waits (a loaded CI
            # machine once took over 60 s to see Snakemake out).
            p.communicate(timeout=WAIT_S)
            self.assertTrue(wait_for(lambda: running(n) == 0, 10), "%s: no job runs on" % sig.name)
            time.sleep(3)
            self.assertEqual(running(n), 0, "%s: no job starts after" % sig.name)
            self.assertTrue(all(f.finished for f in farms_of(n)))

    def test_a_killed_snakemake_leaves_nothing_running(self):
        """SIGKILL: no shutdown runs; the node sees the workflow's hold of
        its farm gone, and ends it: its job killed, none starts after."""
        n, p, _ = self.slow_workflow(["slow/1.txt", "slow/2.txt", "slow/3.txt"], 2)
        self.assertEqual([(f.name, f.open) for f in n.farms()], [("snakemake", True)])
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=WAIT_S)
        self.assertTrue(wait_for(lambda: all(f.finished for f in n.farms()), 30), "the node cancels the farm it no longer hears held")
        self.assertTrue(wait_for(lambda: running(n) == 0, 10), "its job killed")
        time.sleep(3)
        self.assertEqual(running(n), 0, "no job starts after")

    def test_a_node_killed_mid_job_takes_its_job_processes_with_it(self):
        """A worker node SIGKILLed while its jobs run: their processes go
        with it (they ran about 20 s on while the jobs ran again
        elsewhere, two writers of one output)."""
        first = node(self, cpus=1)
        second = node(self, cpus=2, join=first)
        smk.wait_nodes(first, 2)
        d = workflow_folder(self)
        p = smk.popen(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", first.state_dir, "slow/1.txt", "slow/2.txt", "slow/3.txt")
        self.addCleanup(lambda: p.poll() is None and p.kill())

        def under(pid):
            out = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True).stdout
            rows = [tuple(map(int, l.split())) for l in out.splitlines()[1:]]
            kids, grew = {pid}, True
            while grew:
                grew = False
                for c, parent in rows:
                    if parent in kids and c not in kids:
                        kids.add(c)
                        grew = True
            return kids - {pid}

        def sleeping():
            return [k for k in under(second.proc.pid) if "sleep" in _cmdline(k)]

        self.assertTrue(wait_for(sleeping), "a slow job runs on the second node")
        theirs = under(second.proc.pid)
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait()
        self.assertTrue(wait_for(lambda: not [k for k in theirs if _alive(k)], 10), "its job processes are gone")
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=WAIT_S)

    def test_a_stale_copy_of_the_folder_on_a_node_is_never_used(self):
        """A node sees its own old copy of the workflow folder at the same
        path (rsynced once): its jobs run on copies of this run's inputs,
        and the results are this run's (they were the old ones, exit 0)."""
        if not smk.apart_possible():
            self.skipTest("needs root and `unshare -m` (a node that sees another copy of the folder)")
        sf = (
            'rule all:\n    input: "final.txt"\n\n'
            'rule prep:\n    input: "data/{s}.txt"\n    output: "prep/{s}.txt"\n    shell: "cp {input} {output}"\n\n'
            'rule remote:\n    input: "prep/{s}.txt"\n    output: "remote/{s}.txt"\n    resources: token=1\n    shell: "cp {input} {output}"\n\n'
            'rule final:\n    input: "remote/a.txt"\n    output: "final.txt"\n    resources: token=1\n    shell: "cat {input} > {output}"\n'
        )
        d = smk.folder_of(self, snakefile=sf)
        os.makedirs(os.path.join(d, "data"))
        with open(os.path.join(d, "data", "a.txt"), "w") as f:
            f.write("old\n")
        self.assertEqual(snakemake(d, "--cores", "2", "--resources", "token=1").returncode, 0)
        stale = tempfile.mkdtemp(prefix="mesh-smk-stale-")
        self.addCleanup(subprocess.run, ["rm", "-rf", stale])
        subprocess.run(["cp", "-a", d + "/.", stale], check=True)
        time.sleep(1.1)
        with open(os.path.join(d, "data", "a.txt"), "w") as f:
            f.write("new\n")
        home = node(self, cpus=2)
        # Only the node with the stale copy offers the token the last two rules hold.
        other = node(self, stale=(stale, d), cpus=2, resources={"token": 1}, join=home)
        smk.wait_nodes(home, 2)
        r = snakemake(d, "--executor", "mesh", "--jobs", "4", "--mesh-state-dir", home.state_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        for f in ("prep/a.txt", "remote/a.txt", "final.txt"):
            with open(os.path.join(d, f)) as fh:
                self.assertEqual(fh.read(), "new\n", f)
        r = snakemake(d, "--cores", "2", "--resources", "token=1")
        self.assertIn("Nothing to be done", r.stderr + r.stdout)
        del other

    def test_the_docs_say_mesh_logs_as_it_works(self):
        for path in (os.path.join(smk.PLUGIN, "README.md"), os.path.join(smk.REPO, "docs", "snakemake.md")):
            with open(path) as f:
                text = f.read()
            for m in re.finditer(r"mesh logs[^`\n]*", text):
                self.assertRegex(m.group(0), r"^mesh logs TASK --farm FARM", path)


if __name__ == "__main__":
    unittest.main()
