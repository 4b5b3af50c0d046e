"""The Python client against real nodes: map and as_completed, cancel, a failing task's stderr, a bad farm, a 2-node mesh, the protocol's version."""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import nodes
from nodes import WAIT_S, mesh


class InFolder(unittest.TestCase):
    """Each test in a fresh folder, which farms take as theirs."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mesh-py-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.was = os.getcwd()
        os.chdir(self.dir)
        self.addCleanup(os.chdir, self.was)

    def node(self, cpus=2, join=None):
        n = nodes.start(cpus=cpus, join=join)
        self.addCleanup(n.stop)
        return n


class OneNode(InFolder):
    def test_a_map_of_100_gives_every_result_once_in_the_order_they_end(self):
        c = self.node(cpus=2)
        # Task 0 takes longest: it ends after tasks given out after it.
        run = c.map(
            "sh -c 'if [ {index} = 0 ]; then sleep 1.5; fi; echo $(( {} * 2 )) > r.txt'",
            range(100),
            workdir="w/{index}",
            outputs=["r.txt"],
        )
        self.assertEqual(run.total, 100)
        seen = []
        for t in run.as_completed(timeout=WAIT_S):
            self.assertEqual(t.state, "done", t)
            self.assertEqual(t.exit_code, 0)
            self.assertEqual(t.node, c.node)
            self.assertEqual(len(t.outputs), 1)
            # Yielded only once its output is home: it can be read now.
            with open(t.output) as f:
                self.assertEqual(f.read().strip(), str(int(t.params["arg0"]) * 2))
            self.assertEqual(t.params["arg0"], str(t.index))
            self.assertIsNotNone(t.start)
            self.assertLessEqual(t.start, t.end)
            seen.append(t)
        self.assertEqual(sorted(t.index for t in seen), list(range(100)), "every task once")
        ats = [t.at for t in seen]
        self.assertEqual(ats, sorted(ats), "in the order the home had them")
        self.assertGreater([t.index for t in seen].index(0), 1, "task 0 ended after others")
        p = run.wait(timeout=WAIT_S)
        self.assertTrue(p.ok)
        self.assertEqual((p.done, p.total), (100, 100))
        self.assertEqual(os.path.dirname(os.path.dirname(os.path.dirname(seen[0].output))), os.path.join(self.dir, "mesh-out", "sh"))
        # A follower that comes after the end hears every task too.
        again = [t.index for t in run.as_completed(timeout=WAIT_S)]
        self.assertEqual(sorted(again), list(range(100)))
        self.assertEqual(len(run.tasks(state="done")), 100)
        self.assertEqual(run.tasks(state="failed"), [])
        self.assertIn(run.id, [f.id for f in c.farms()])

    def test_a_map_per_item_in_a_loop_gives_each_its_own_farm_and_result(self):
        # A Dask user's `submit` in a loop: one map of one item each, all of
        # one name, sent within the same milliseconds. Their farm ids once
        # collided: 63 ids for 100 maps, and 37 results another input's.
        c = self.node(cpus=2)
        runs = [c.map("expr {} + 1", [i], name="one") for i in range(100)]
        self.assertEqual(len({r.id for r in runs}), 100, "a farm for each map")
        for i, r in enumerate(runs):
            self.assertTrue(r.wait(timeout=WAIT_S).ok, r)
            (t,) = r.tasks()
            self.assertEqual(t.stdout().strip(), str(i + 1), "map %d's own result" % i)

    def test_a_reused_task_shows_the_logs_of_the_run_that_made_its_outputs(self):
        c = self.node(cpus=2)
        cmd = "sh -c 'echo made {} at $$; echo warned {} >&2; echo {} > r.txt'"
        first = c.map(cmd, ["a", "b"], name="same", workdir="w/{index}", outputs=["r.txt"])
        self.assertTrue(first.wait(timeout=WAIT_S).ok)
        said = {t.index: (t.stdout(), t.stderr()) for t in first.tasks()}
        self.assertTrue(said[0][0].startswith("made a at "), said)
        again = c.map(cmd, ["a", "b"], name="same", workdir="w/{index}", outputs=["r.txt"])
        self.assertTrue(again.wait(timeout=WAIT_S).ok)
        for t in again.tasks():
            self.assertTrue(t.reused, t)
            # The very lines of the first run (its pid among them), not ''.
            self.assertEqual((t.stdout(), t.stderr()), said[t.index])

    def test_each_task_says_what_it_used(self):
        c = self.node(cpus=2)
        hold = "import time; x = bytearray({} << 20); x[::4096] = bytes(len(x) // 4096); time.sleep(1)"
        run = c.map('python3 -c "%s"' % hold, [64, 160], name="hold")
        self.assertTrue(run.wait(timeout=WAIT_S).ok)
        peaks = {}
        for t in run.tasks():
            self.assertIsInstance(t.usage, mesh.Usage, t)
            self.assertFalse(t.usage.oom)
            self.assertGreater(t.usage.read_bytes, 0, "python reads its modules")
            self.assertLess(t.usage.cpu, t.duration + 0.05)
            peaks[int(t.params["arg0"])] = t.usage.peak_memory / (1 << 20)
        for mib, peak in peaks.items():
            # The interpreter's own 8-20 MiB on top of what it holds.
            self.assertTrue(mib <= peak <= mib * 1.1 + 20, (mib, peak))
        self.assertIn("peak_memory=", repr(t.usage))

    def test_progress_says_when_the_farm_ends_from_what_is_left(self):
        c = self.node(cpus=2)
        # 12 tasks of 1.10 s to 1.21 s, two at a time: 7 s in all.
        run = c.map("sleep 1.{}", list(range(10, 22)), name="eta")
        self.assertTrue(nodes.wait_until(lambda: run.progress().done >= 4))
        self.assertTrue(nodes.wait_until(lambda: run.progress().eta is not None, limit=10))
        p = run.progress()
        p50, p90 = p.ends_at
        self.assertLessEqual(p50, p90)
        self.assertEqual(p.eta["guessed"], [], p.eta)
        self.assertIn("ends in about", repr(p))
        final = run.wait(timeout=WAIT_S)
        self.assertIsNone(final.eta, "a finished farm has no estimate")
        ended = max(t.end for t in run.tasks())
        # Counted from when it was made, the estimate is within 1.5 s of
        # the end (a rate over the last seconds is too, here: the point is
        # that it is there, refreshed, and from the farm's own runtimes).
        self.assertLess(abs(p50 - ended), 1.5, (p.eta, ended))

    def test_cancel_mid_farm(self):
        c = self.node(cpus=2)
        run = c.map("sleep {}", [30] * 20)
        self.assertTrue(nodes.wait_until(lambda: run.progress().running > 0), run.progress())
        t0 = time.monotonic()
        run.cancel()
        p = run.wait(timeout=WAIT_S, raise_on_error=False)
        self.assertLess(time.monotonic() - t0, 25, "the running sleeps were killed")
        self.assertTrue(p.finished)
        self.assertEqual(p.done, 0)
        self.assertGreater(p.cancelled, 0, p.view)
        with self.assertRaises(mesh.FarmFailed):
            run.wait(timeout=WAIT_S)
        self.assertEqual(len(run.tasks(state="unfinished")), 20)
        # as_completed of a cancelled farm ends, with nothing done to say.
        self.assertEqual([t for t in run.as_completed(timeout=WAIT_S) if t.ok], [])

    def test_a_failing_task_says_its_exit_code_and_stderr(self):
        c = self.node(cpus=2)
        run = c.map(
            ["sh", "-c", 'echo "out {}"; echo "no such case: {}" >&2; exit {}'],
            ["a"],
            ["b"],
            [3],
            max_fails=0,
        )
        got = list(run.as_completed(timeout=WAIT_S))
        self.assertEqual(len(got), 1)
        t = got[0]
        self.assertEqual(t.state, "failed")
        self.assertFalse(t.ok)
        self.assertEqual(t.exit_code, 3)
        self.assertEqual(t.reason, "exit code 3: no such case: b")
        self.assertEqual(t.stderr(), "no such case: b\n")
        self.assertEqual(t.stdout(), "out a\n")
        with self.assertRaises(mesh.TaskFailed) as e:
            t.result()
        self.assertIn("map/0", str(e.exception))
        # The cause, not only the code, without asking for the logs.
        self.assertIn("exit code 3: no such case: b", str(e.exception))
        with self.assertRaises(mesh.FarmFailed) as e:
            run.wait(timeout=WAIT_S)
        self.assertIn("exit code 3", str(e.exception))
        self.assertEqual([x.task for x in run.tasks(state="failed")], ["map/0"])
        # Resumed on its home, it is followed as before; into another folder
        # once over, it is refused with where its outputs are.
        self.assertIs(run.resume(), run)
        with self.assertRaises(mesh.MeshError) as e:
            run.resume(out="elsewhere")
        self.assertIn("has finished", str(e.exception))

    def test_a_success_other_than_0_says_its_exit_code(self):
        c = self.node(cpus=2)
        run = c.map(["sh", "-c", "exit {}"], [0, 3], success_codes=[0, 3])
        got = {t.index: t for t in run.as_completed(timeout=WAIT_S)}
        self.assertTrue(all(t.ok for t in got.values()), got)
        self.assertEqual({i: t.exit_code for i, t in got.items()}, {0: 0, 1: 3})

    def test_an_open_farms_tasks_that_will_not_run_are_told_while_it_is_open(self):
        # An open farm is not over until closed: its follower hears of a
        # task skipped for a failed dependency as soon as it is known, as
        # of one that ended, not at the farm's end.
        c = self.node(cpus=2)
        f = mesh.Farm("grows")
        bad = f.stage("bad", shell="exit 3", sweep={"x": [1]}, retries=0)
        f.stage("after_bad", command=["echo", "{y}"], sweep={"y": [1, 2]}, after=bad)
        f.stage("fine", command=["echo", "ok"])
        run = c.submit(f, open=True)
        got = {}
        for t in run.as_completed(progress=False, timeout=WAIT_S):
            got[t.task] = t
            if len(got) == 4:
                break
        self.assertEqual(sorted(got), ["after_bad/0", "after_bad/1", "bad/0", "fine/0"])
        self.assertEqual((got["fine/0"].state, got["bad/0"].state), ("done", "failed"))
        for t in ("after_bad/0", "after_bad/1"):
            self.assertEqual((got[t].state, got[t].attempt), ("failed", 0), got[t])
            self.assertIn("skipped", got[t].reason)
        self.assertFalse(run.progress().finished, "told while the farm is open")
        run.close()

    def test_a_bad_farm_gets_the_located_words_of_mesh_check(self):
        c = self.node(cpus=1)
        f = mesh.Farm("bad")
        solve = f.stage("solve", command=["echo", "{x}"], sweep={"x": [1, 2]})
        f.stage("report", shell="cat {out}/solve/*/r.txt", after=solve, workdr="w")
        with self.assertRaises(mesh.FarmError) as e:
            c.submit(f)
        err = e.exception
        self.assertEqual(err.field, "stage.workdr")
        self.assertEqual(err.line, f.to_toml().splitlines().index('workdr = "w"') + 1)
        self.assertEqual(err.file, os.path.join(self.dir, "bad.toml"))
        self.assertIn("did you mean `workdir`", str(err))
        self.assertIn('| workdr = "w"', str(err), "the line is shown")
        # A file on disk: its own name and line, as `mesh check` says them.
        with open("farm.toml", "w") as fh:
            fh.write('[farm]\nname = "f"\n\n[[stage]]\nname = "report"\nafter = ["solv"]\nshell = "true"\n')
        with self.assertRaises(mesh.FarmError) as e:
            c.submit("farm.toml")
        self.assertTrue(
            str(e.exception).startswith(
                "%s:6:10: stage `report`, field `after`: unknown stage `solv`" % os.path.join(self.dir, "farm.toml")
            ),
            e.exception,
        )
        self.assertEqual((e.exception.line, e.exception.column), (6, 10))
        self.assertEqual(c.farms(), [], "nothing was submitted")
        # What checks passes runs.
        checked = c.check(_good())
        self.assertEqual((checked["tasks"], checked["stages"]), (3, {"s": 3}))


class Restart(InFolder):
    def test_as_completed_carries_on_through_a_restart_of_the_node(self):
        state = os.path.join(self.dir, "state")
        first = mesh.local(cpus=2, state_dir=state, start_within=WAIT_S)
        self.addCleanup(first.stop)
        run = first.map("sh -c 'sleep 0.3; echo {} > r.txt'", range(12), workdir="w/{index}", outputs=["r.txt"])
        got = []
        again = None
        for t in run.as_completed(timeout=WAIT_S, reconnect=WAIT_S):
            got.append(t.index)
            with open(t.output) as f:
                self.assertEqual(f.read().strip(), str(t.index))
            if len(got) == 3:
                first.proc.kill()  # as a power cut: no goodbye
                first.proc.wait()
                again = mesh.local(cpus=2, state_dir=state, start_within=WAIT_S)
                self.addCleanup(again.stop)
        self.assertIsNotNone(again)
        self.assertEqual(sorted(got), list(range(12)), "every task once, across the restart")
        self.assertTrue(run.wait(timeout=WAIT_S).ok)


def _good():
    f = mesh.Farm("good")
    f.stage("s", command=["echo", "{x}"], sweep={"x": range(3)})
    return f


class TwoNodes(InFolder):
    def test_every_result_comes_home_to_the_submitting_node(self):
        first = self.node(cpus=1)
        second = self.node(cpus=1, join=first)
        self.assertTrue(
            nodes.wait_until(lambda: len(first.status()["nodes"]) == 2 and len(second.status()["nodes"]) == 2),
            "the nodes did not see each other",
        )
        # Submitted on the node that joined: it is the home.
        run = second.map(
            "sh -c 'sleep 0.2; echo {} > r.txt'",
            range(20),
            workdir="w/{index}",
            outputs=["r.txt"],
        )
        out = os.path.join(self.dir, "mesh-out", "sh")
        ran_on = set()
        got = []
        for t in run.as_completed(timeout=WAIT_S):
            self.assertTrue(t.ok, t)
            ran_on.add(t.node)
            # When it ran, on whichever node: the farm's log carries it.
            self.assertIsNotNone(t.start, t)
            self.assertIsNotNone(t.end, t)
            self.assertGreaterEqual(t.duration, 0.2, t)
            self.assertLessEqual(t.end, t.at, t)
            self.assertEqual(t.exit_code, 0, t)
            self.assertTrue(t.output.startswith(out + os.sep), t.output)
            with open(t.output) as f:
                self.assertEqual(f.read().strip(), str(t.index))
            got.append(t.index)
        self.assertEqual(sorted(got), list(range(20)))
        self.assertEqual(ran_on, {first.node, second.node}, "both nodes ran tasks")
        p = run.wait(timeout=WAIT_S)
        self.assertEqual(p.home, second.node)
        # The logs of a task that ran on the other node come from there.
        remote = next(t for t in run.tasks(state="done") if t.node == first.node)
        self.assertEqual(remote.stdout(), "")

    def test_a_machine_with_no_node_reaches_the_mesh_through_the_mesh_binary(self):
        first = self.node(cpus=2)
        c = mesh.connect(mesh=first.address, key=os.path.join(first.state_dir, "mesh.key"))
        self.assertEqual(c.node, first.node)
        run = c.map("echo {}", ["x", "y", "z"])
        got = {t.params["arg0"]: t.stdout() for t in run.as_completed(timeout=WAIT_S)}
        self.assertEqual(got, {"x": "x\n", "y": "y\n", "z": "z\n"})
        self.assertTrue(run.wait(timeout=WAIT_S).ok)
        # A wrong key is said, not waited on forever.
        bad = os.path.join(self.dir, "other.key")
        subprocess.run([nodes.mesh_bin(), "--state-dir", os.path.join(self.dir, "other"), "init"], check=True, capture_output=True)
        shutil.copy(os.path.join(self.dir, "other", "mesh.key"), bad)
        os.chmod(bad, 0o600)
        t0 = time.monotonic()
        with self.assertRaises(mesh.MeshError):
            mesh.connect(mesh=first.address, key=bad)
        self.assertLess(time.monotonic() - t0, 60)


class Protocol(InFolder):
    def test_another_api_version_is_a_clear_error(self):
        c = self.node(cpus=1)
        was = mesh._proto.API
        mesh._proto.API = was + 1
        try:
            t0 = time.monotonic()
            with self.assertRaises(mesh.ProtocolError) as e:
                mesh.connect(state_dir=c.state_dir)
            self.assertLess(time.monotonic() - t0, 10)
        finally:
            mesh._proto.API = was
        words = str(e.exception)
        self.assertIn("control API %d" % was, words)
        self.assertIn("client speaks %d" % (was + 1), words)

    def test_a_node_older_than_the_api_is_named_so(self):
        with FakeNode(self.dir, OLDER) as f:
            with self.assertRaises(mesh.ProtocolError) as e:
                mesh.connect(state_dir=f.dir)
        self.assertIn("older than the control API", str(e.exception))

    def test_a_node_of_api_1_is_older_whatever_its_words(self):
        # API 1 said refusals as words, with no kind: its answer to a hello
        # of another version is one, and names this package's version.
        api1 = b'{"Error":"this node (mesh 0.1.0) speaks control API 1 and the client speaks 2: ..."}\n'
        with FakeNode(self.dir, api1) as f:
            with self.assertRaises(mesh.ProtocolError) as e:
                mesh.connect(state_dir=f.dir)
        self.assertIn("older than the control API %d" % mesh.API, str(e.exception))

    def test_an_unknown_farm_is_raised_as_one_by_its_kind(self):
        c = self.node(cpus=1)
        with self.assertRaises(mesh.UnknownFarm) as e:
            c.run("no-such-farm")
        # The node's words, unchanged.
        self.assertIn("no farm `no-such-farm` is known", str(e.exception))
        # The kind decides, not the words: a node that says anything of
        # kind unknown_farm is heard so, and a kind this package does not
        # know is a plain refusal.
        said = lambda kind: {"Error": {"kind": kind, "message": "words"}}
        for kind, cls in [
            ("unknown_farm", mesh.UnknownFarm),
            ("closed_farm", mesh.FarmClosed),
            ("other_api", mesh.ProtocolError),
        ]:
            self.assertIs(type(mesh._proto.error(said(kind))), cls)
        e = mesh._proto.error(said("from_a_newer_node"))
        self.assertIs(type(e), mesh.MeshError)
        self.assertEqual(str(e), "words")
        fake = b'{"Error":{"kind":"unknown_farm","message":"words of no farm"}}\n'
        with FakeNode(self.dir, fake) as f:
            with self.assertRaises(mesh.UnknownFarm):
                mesh.connect(state_dir=f.dir)

    def test_a_node_that_says_nothing_is_an_error_not_a_hang(self):
        with FakeNode(self.dir, None) as f:
            t0 = time.monotonic()
            with self.assertRaises(mesh.MeshError) as e:
                mesh.connect(state_dir=f.dir, within=1)
            self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("said nothing within 1 s", str(e.exception))

    def test_a_node_still_starting_is_waited_for(self):
        # As a node marks itself from its first step until its socket
        # listens: a live process's id in node.starting.
        starting = subprocess.Popen(["sleep", "30"])
        self.addCleanup(starting.wait)
        self.addCleanup(starting.kill)
        state = os.path.join(self.dir, "fake")
        os.makedirs(state)
        marker = os.path.join(state, "node.starting")
        with open(marker, "w") as f:
            f.write("%d\n" % starting.pid)
        fakes = []
        self.addCleanup(lambda: [f.__exit__() for f in fakes])
        later = threading.Timer(0.5, lambda: fakes.append(FakeNode(self.dir, OLDER)))
        later.start()
        self.addCleanup(later.cancel)
        # Reached once its socket is there: the node's own answer, not
        # "no mesh node is running".
        with self.assertRaises(mesh.ProtocolError) as e:
            mesh.connect(state_dir=state)
        self.assertIn("older than the control API", str(e.exception))
        # The process gone, the mark is stale: no node is starting.
        starting.kill()
        starting.wait()
        other = os.path.join(self.dir, "stale")
        os.makedirs(other)
        shutil.copy(marker, other)
        t0 = time.monotonic()
        with self.assertRaises(mesh.MeshError) as e:
            mesh.connect(state_dir=other)
        self.assertIn("no mesh node is running", str(e.exception))
        self.assertLess(time.monotonic() - t0, 10)

    def test_a_node_started_in_the_background_is_reached_at_once(self):
        # `subprocess.Popen(["mesh", "node", ...])` and at once connect, as
        # README's `mesh node &` then a command: before the node's first
        # step it has no socket and no mark yet, only its process.
        key_dir = os.path.join(self.dir, "st")
        subprocess.run([nodes.mesh_bin(), "--state-dir", key_dir, "init"], check=True, capture_output=True)
        for _ in range(5):
            p = subprocess.Popen(
                [nodes.mesh_bin(), "--state-dir", key_dir, "node", "--listen", "/ip4/127.0.0.1/tcp/0"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                c = mesh.connect(state_dir=key_dir)
                self.assertTrue(c.node)
            finally:
                p.terminate()
                p.wait(timeout=WAIT_S)

    def test_no_node_is_said_with_what_to_do(self):
        with self.assertRaises(mesh.MeshError) as e:
            mesh.connect(state_dir=os.path.join(self.dir, "none"))
        self.assertIn("no mesh node is running", str(e.exception))


#: What a node older than the control API answers the client's hello.
OLDER = b'{"Error":"bad request: unknown variant `Hello`, expected one of `Submit`, `Wait`"}\n'


class FakeNode:
    """A control socket that answers every request with ``answer`` (None: never)."""

    def __init__(self, root, answer):
        self.dir = os.path.join(root, "fake")
        os.makedirs(self.dir, exist_ok=True)
        self.answer = answer
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(os.path.join(self.dir, "node.sock"))
        self.sock.listen(4)
        self.conns = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            conn.recv(1 << 16)
            if self.answer is not None:
                conn.sendall(self.answer)
                conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()
        for c in self.conns:
            c.close()


if __name__ == "__main__":
    unittest.main()
