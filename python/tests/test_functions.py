"""Python functions on real nodes, as Dask's futures: values and exceptions back, futures as arguments, cancel, kills, a client that comes back."""

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import unittest

import nodes
from nodes import WAIT_S, mesh
from test_client import InFolder


def inc(x):
    return x + 1


def add(*xs):
    return sum(xs)


def slow_square(x):
    time.sleep(0.3)
    return x * x


def kib_of(x):
    # Past what rides with a task's report: a file the client reads.
    return bytes([x % 256]) * 4096


def add_text(a, b):
    return "%s%s" % (a, b)


def nap(s, v):
    time.sleep(s)
    return v


def ballast(mib):
    """Leaves ``mib`` MiB held in its warm worker, for the calls after it."""
    sys.modules["mesh_warm"].cache["ballast"] = b"\1" * (mib << 20)
    time.sleep(0.5)


def hold(mib):
    """Holds ``mib`` MiB, every page touched, then lets it go."""
    x = bytearray(mib << 20)
    x[::4096] = bytes(len(x) // 4096)
    return len(x)


def spin(s):
    """Spins a core for ``s`` s of its own CPU (a loaded machine stretches
    the wall time, not the CPU)."""
    t0 = time.process_time()
    while time.process_time() - t0 < s:
        pass


def write(path, mib):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(b"\0" * (1 << 20))
    os.remove(path)


def hold_in_a_child(mib):
    """A child process that holds ``mib`` MiB for a second: as a Snakemake
    job's shell runs a tool."""
    subprocess.run([sys.executable, "-c", "import time; x = bytearray(%d << 20); x[::4096] = bytes(len(x) // 4096); time.sleep(1)" % mib], check=True)


class Functions(InFolder):
    def client_script(self, name, c, body):
        """A user's script in the test's folder, run as a process of its
        own: ``body``, with ``mesh`` of this repository imported and
        ``STATE`` the state folder of ``c``'s node."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("import sys\nsys.path.insert(0, %r)\nimport mesh\nSTATE = %r\n" % (os.path.join(nodes.REPO, "python"), c.state_dir))
            f.write(textwrap.dedent(body))
        return path

    def test_submit_a_lambda_and_get_its_value(self):
        c = self.node(cpus=2)
        f = c.submit(lambda x: x + 1, 10)
        self.assertIsInstance(f, mesh.Future)
        self.assertTrue(f.key.startswith("lambda-"), f.key)
        self.assertEqual(f.result(timeout=WAIT_S), 11)
        self.assertEqual(f.status, "finished")
        self.assertTrue(f.done())
        # Values come back as they were: not text.
        g = c.submit(lambda: {"a": [1, 2.5], "b": (None, b"\x00")})
        self.assertEqual(g.result(timeout=WAIT_S), {"a": [1, 2.5], "b": (None, b"\x00")})
        # The same call is the same future, as Dask's pure calls.
        self.assertIs(c.submit(inc, 1), c.submit(inc, 1))
        self.assertIsNot(c.submit(inc, 1, pure=False), c.submit(inc, 1, pure=False))

    def test_each_call_says_what_it_used_its_workers_own_apart(self):
        c = self.node(cpus=2)
        # Two warm workers first, each holding 100 MiB a call left behind:
        # what a later call held is counted above what its worker held.
        c.gather(c.map(ballast, [100, 100], pure=False))
        held = c.submit(hold, 200)
        spun = c.submit(spin, 1.0)
        wrote = c.submit(write, os.path.join(self.dir, "big.bin"), 50)
        child = c.submit(hold_in_a_child, 200)
        thin = c.submit(inc, 1)
        for f in (held, spun, wrote, child, thin):
            f.result(timeout=WAIT_S)
            self.assertIsInstance(f.usage, mesh.Usage, f)
            self.assertIs(f.usage, f.task.usage)
            self.assertFalse(f.usage.oom)
        mib = 1 << 20
        self.assertTrue(180 <= held.usage.peak_memory / mib <= 220, held.usage)
        self.assertTrue(0.8 <= spun.usage.cpu <= 1.3, spun.usage)
        self.assertGreaterEqual(wrote.usage.written_bytes, 50 * mib, wrote.usage)
        # The child's 200 MiB and its interpreter, looked at by the node.
        self.assertTrue(200 <= child.usage.peak_memory / mib <= 240, child.usage)
        self.assertGreater(child.usage.cpu, 0, child.usage)
        # A thin call: none of its worker's 100 MiB, little CPU.
        self.assertLess(thin.usage.peak_memory, 10 * mib, thin.usage)
        self.assertLess(thin.usage.cpu, 0.2, thin.usage)

    def test_a_map_gives_every_value_once_as_completed_and_gathered(self):
        c = self.node(cpus=2)
        fs = c.map(inc, range(60))
        self.assertEqual(len(fs), 60)
        seen = []
        for f, v in mesh.as_completed(fs, with_results=True):
            seen.append((f.key, v))
        self.assertEqual(sorted(v for _, v in seen), list(range(1, 61)), "each value exactly once")
        self.assertEqual(len({k for k, _ in seen}), 60)
        self.assertEqual(c.gather(fs), list(range(1, 61)))
        self.assertEqual(c.gather({"a": fs[0], "b": [fs[1], (fs[2],)]}), {"a": 1, "b": [2, (3,)]})
        # as_completed takes more while it runs.
        ac = mesh.as_completed([c.submit(inc, 100)])
        got = []
        for f in ac:
            got.append(f.result())
            if len(got) == 1:
                ac.add(c.submit(inc, 200))
        self.assertEqual(got, [101, 201])
        done, not_done = mesh.wait(c.map(inc, [7, 8]), timeout=WAIT_S)
        self.assertEqual((sorted(f.result() for f in done), not_done), ([8, 9], set()))

    def test_a_long_map_and_a_map_over_its_futures_give_every_value(self):
        # A stage of many calls (their keys and arguments sent as data,
        # kept end to end at the node): each value in its place, and no
        # file in calls/ but the calls' own.
        c = self.node(cpus=2)
        n = 300
        words = ["w%d-" % i + "x" * (i % 7) for i in range(n)]
        fs = c.map(add_text, words, range(n))
        again = c.map(add_text, fs, [1000] * n)
        self.assertEqual(c.gather(fs), ["%s%d" % (w, i) for i, w in enumerate(words)])
        self.assertEqual(c.gather(again), ["%s%d1000" % (w, i) for i, w in enumerate(words)])
        self.assertEqual([f.task_name.split("/")[1] for f in fs[:3]], ["0", "1", "2"])
        root = c._fns.root
        self.assertEqual([n for n in os.listdir(os.path.join(root, "calls")) if not n.endswith((".pkl", ".vals"))], [])

    def test_values_of_a_farm_the_client_moved_on_from_stay_readable(self):
        # The client's open farm closed under it (`mesh close`, as a user
        # might): the next calls go to another farm, whose stages the node
        # names by place as it named the first's, each farm's outputs in a
        # folder of their own. The first calls after the close are sent as
        # it happens, before the client hears of it: none is lost, and the
        # one that waits for a call of the closed farm gets its value.
        c = self.node(cpus=2)
        fs = []
        for i in range(2):
            f = c.submit(kib_of, i)
            mesh.wait([f], timeout=WAIT_S)
            fs.append(f)
        slow = c.submit(nap, 1.0, 7)
        deadline = time.monotonic() + WAIT_S
        while slow.task_name is None and time.monotonic() < deadline:
            time.sleep(0.01)
        slow._run.close()
        fs.append(c.submit(kib_of, 2))
        after_slow = c.submit(add_text, "s", slow)
        fs += [c.submit(kib_of, i) for i in range(3, 5)]
        mesh.wait(fs + [after_slow], timeout=WAIT_S)
        self.assertEqual(len({f._run.id for f in fs[:2]}), 1)
        self.assertNotEqual(fs[2]._run.id, fs[0]._run.id)
        self.assertEqual(len({f._run.id for f in fs[2:]}), 1)
        self.assertEqual([f.task_name for f in fs[:2]], ["c0/0", "c1/0"])
        self.assertTrue(all(f.task_name.startswith("c") for f in fs[2:]))
        self.assertEqual([f.result() for f in fs], [kib_of(i) for i in range(5)])
        self.assertEqual(slow.result(), 7)
        self.assertEqual(after_slow.result(), "s7")
        # And a loop of calls goes on in the new farm: the client holds it.
        self.assertEqual(c.submit(kib_of, 9).result(timeout=WAIT_S), kib_of(9))

    def test_a_remote_exception_is_raised_here_with_its_type_and_traceback(self):
        c = self.node(cpus=2)

        def solve(x):
            if x == 3:
                raise ValueError("solver diverged at step %d" % (17 + x))
            return x

        fs = c.map(solve, range(6))
        with self.assertRaises(ValueError) as e:
            fs[3].result(timeout=WAIT_S)
        self.assertEqual(str(e.exception), "solver diverged at step 20")
        self.assertIsInstance(e.exception.__cause__, mesh.RemoteTraceback)
        self.assertIn("in solve", str(e.exception.__cause__))
        self.assertIn('raise ValueError("solver diverged', str(e.exception.__cause__))
        self.assertEqual(fs[3].status, "error")
        self.assertIsInstance(fs[3].exception(), ValueError)
        self.assertEqual([f.result() for i, f in enumerate(fs) if i != 3], [0, 1, 2, 4, 5])
        # What it said is kept: the task's logs, as `mesh logs` reads them.
        out, err = fs[3].logs()
        self.assertIn(b"ValueError: solver diverged at step 20", err)
        self.assertEqual(fs[3].task.reason, "exit code 1: ValueError: solver diverged at step 20")
        # A dependent of a failed call gets its exception, as in Dask.
        with self.assertRaises(ValueError):
            c.submit(inc, fs[3]).result(timeout=WAIT_S)

    def test_a_missing_module_is_raised_and_stops_the_stage(self):
        c = self.node(cpus=2)

        def uses(x):
            import mesh_no_such_module  # noqa: F401

            return x

        fs = c.map(uses, range(30))
        with self.assertRaises(ModuleNotFoundError):
            fs[0].result(timeout=WAIT_S)
        mesh.wait(fs, timeout=WAIT_S)
        errors = [f.exception() for f in fs]
        ran = [e for e in errors if isinstance(e, ModuleNotFoundError)]
        self.assertTrue(all(e is not None for e in errors))
        self.assertLess(len(ran), 30, "failing fast: not every call ran")
        stopped = [e for e in errors if not isinstance(e, ModuleNotFoundError)]
        self.assertIn("failed the same way", str(stopped[0]))

    def test_an_argument_that_does_not_pickle_is_refused_at_once(self):
        c = self.node(cpus=2)
        with self.assertRaises(TypeError) as e:
            c.submit(inc, threading.Lock())
        self.assertIn("does not pickle", str(e.exception))

    def test_a_python_of_another_version_is_refused_with_both_versions(self):
        c = self.node(cpus=2)
        was = mesh._functions.PYTHON_VERSION
        mesh._functions.PYTHON_VERSION = "2.7"
        try:
            f = c.submit(inc, 5)
        finally:
            mesh._functions.PYTHON_VERSION = was
        with self.assertRaises(mesh.MeshError) as e:
            f.result(timeout=WAIT_S)
        here = "%d.%d" % sys.version_info[:2]
        self.assertIn("python %s here" % here, str(e.exception))
        self.assertIn("client's python 2.7", str(e.exception))

    def test_cancel_one_future_mid_map_and_the_others_finish(self):
        # One core: the others run only once the long call is killed.
        c = self.node(cpus=1)

        def nap(x):
            time.sleep(0.2 if x else 120)
            return x

        fs = c.map(nap, range(6))
        after = c.submit(inc, fs[0])
        self.assertTrue(nodes.wait_until(lambda: fs[0]._run is not None and fs[0]._run.progress().running > 0))
        time.sleep(0.5)
        t0 = time.monotonic()
        self.assertTrue(fs[0].cancel())
        self.assertTrue(fs[0].cancelled())
        self.assertEqual(fs[0].status, "cancelled")
        with self.assertRaises(cf.CancelledError):
            fs[0].result()
        self.assertEqual([f.result(timeout=WAIT_S) for f in fs[1:]], list(range(1, 6)))
        self.assertLess(time.monotonic() - t0, 60, "the 120 s call was killed, not waited for")
        # What needs its value is not run.
        with self.assertRaises(cf.CancelledError):
            after.result(timeout=WAIT_S)
        p = fs[0]._run.progress()
        # The call given it was cancelled with it (as Dask's), where it
        # waited if it was sent already.
        self.assertEqual((p.cancelled, p.done, p.skipped), (p.total - 5, 5, 0), p.view)
        # As Dask's: an ended call cancelled is forgotten, its value released.
        self.assertEqual(fs[1].result(), 1)
        self.assertTrue(fs[1].cancel())
        self.assertEqual(fs[1].status, "cancelled")
        self.assertRaises(cf.CancelledError, fs[1].result)
        again = c.submit(nap, 1)
        self.assertIsNot(again, fs[1], "the same call again is a new one")
        self.assertEqual(again.result(timeout=WAIT_S), 1)
        # As Dask's scheduler: the calls given a cancelled one, and those
        # given them, go with it, ended or not (none keeps a value made
        # from one that is gone); a call beside them is left alone.
        a = c.submit(inc, 10)
        b = c.submit(inc, a)
        e = c.submit(inc, b)
        beside = c.submit(inc, 20)
        self.assertEqual((e.result(timeout=WAIT_S), beside.result(timeout=WAIT_S)), (13, 21))
        self.assertTrue(a.cancel())
        self.assertEqual([a.status, b.status, e.status, beside.status], ["cancelled"] * 3 + ["finished"])
        self.assertRaises(cf.CancelledError, e.result)

    def test_a_chain_and_a_fan_in_of_futures(self):
        c = self.node(cpus=2)
        x = c.submit(inc, 1)
        y = c.submit(inc, x)
        z = c.submit(add, x, y, [x][0])
        parts = c.map(inc, range(10))
        total = c.submit(lambda ps, k: sum(ps) * k["k"], parts, {"k": y})
        self.assertEqual(z.result(timeout=WAIT_S), 2 + 3 + 2)
        self.assertEqual(total.result(timeout=WAIT_S), 55 * 3)
        # A future done in an earlier farm, given to a later call.
        self.assertEqual(c.submit(add, z, 100).result(timeout=WAIT_S), 107)

    def test_small_values_come_with_the_report_and_big_ones_as_files(self):
        c = self.node(cpus=2)
        fs = c.map(inc, range(20))
        big = c.submit(lambda n: "x" * n, 100_000)
        self.assertEqual(c.gather(fs), list(range(1, 21)))
        self.assertEqual(len(big.result(timeout=WAIT_S)), 100_000)

        def results():
            return sorted(f for _, _, names in os.walk(c.state_dir) for f in names if f.startswith("result-"))

        # No file per call: only the value too big to ride is one.
        self.assertEqual(set(results()), {"result-%s.pkl" % big.key}, results())
        # A call given small values has them in memory where it runs: no
        # file for them there either.
        self.assertEqual(c.submit(lambda a, b, s: a + b + len(s), fs[0], fs[1], big).result(timeout=WAIT_S), 100_003)
        self.assertEqual(set(results()), {"result-%s.pkl" % big.key}, results())

    def test_a_farm_closed_under_a_client_is_left_for_a_new_one(self):
        c = self.node(cpus=2)
        x = c.submit(inc, 1)
        self.assertEqual(x.result(timeout=WAIT_S), 2)
        first = x._run
        # Closed by someone else (`mesh close`, or its home once no hold
        # reached it for long): the client's hold hears it.
        first.close()
        deadline = time.monotonic() + WAIT_S
        while not first.closed_by_home and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue(first.closed_by_home)
        y = c.submit(inc, x)
        z = c.submit(inc, 10)
        self.assertEqual((y.result(timeout=WAIT_S), z.result(timeout=WAIT_S)), (3, 11))
        self.assertIsNot(z._run, first)

    def test_concurrent_futures_over_the_executor(self):
        c = self.node(cpus=2)
        with c.get_executor() as ex:
            fs = [ex.submit(slow_square, i) for i in range(6)]
            self.assertEqual(sorted(f.result() for f in cf.as_completed(fs, timeout=WAIT_S)), [i * i for i in range(6)])
            done, _ = cf.wait(fs, timeout=WAIT_S)
            self.assertEqual(len(done), 6)
            self.assertEqual(list(ex.map(inc, range(5))), [1, 2, 3, 4, 5])

    def test_a_wait_on_one_call_is_kept_while_the_others_end(self):
        # The futures of a client are settled under one condition: a call
        # waited for wakes as each other call ends, and must wait on.
        c = self.node(cpus=2)
        slow = c.submit(nap, 4.0, "slow")
        got = {}
        waiter = threading.Thread(target=lambda: got.update(v=slow.result(timeout=WAIT_S)))
        waiter.start()
        fast = c.map(inc, range(30))
        start = time.monotonic()
        with self.assertRaises(cf.TimeoutError):
            slow.result(timeout=1.0)
        self.assertGreaterEqual(time.monotonic() - start, 1.0)
        self.assertEqual(c.gather(fast), list(range(1, 31)))
        waiter.join(WAIT_S)
        self.assertEqual(got, {"v": "slow"})
        self.assertIsNone(slow.exception(timeout=0))

    def test_resources_per_call_are_held(self):
        # Seeds 000/001: experiments that each hold one TOKEN, of which the
        # node has 2, on 4 cores.
        n = nodes.start(cpus=4, resources={"TOKEN": 2})
        self.addCleanup(n.stop)

        def stamp(x):
            t = time.time()
            time.sleep(0.5)
            return (t, time.time())

        fs = n.map(stamp, range(6), resources={"TOKEN": 1})
        spans = sorted(f.result(timeout=WAIT_S) for f in fs)
        most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
        self.assertEqual(most, 2, spans)

    def test_another_client_gets_a_farms_futures_by_key(self):
        c = self.node(cpus=2)

        def half(x):
            if x == 3:
                raise ArithmeticError("three")
            return x / 2

        fs = c.map(half, range(6))
        mesh.wait(fs, timeout=WAIT_S)
        farm = fs[0]._run.id
        other = mesh.connect(state_dir=c.state_dir)
        got = other.futures(farm)
        self.assertEqual(set(got), {f.key for f in fs})
        for f in fs:
            g = got[f.key]
            if f.key == fs[3].key:
                with self.assertRaises(ArithmeticError):
                    g.result(timeout=WAIT_S)
            else:
                self.assertEqual(g.result(timeout=WAIT_S), f.result())

    def test_a_client_killed_mid_map_and_one_that_resumes_gets_every_finished_value_back(self):
        c = self.node(cpus=2)
        # A notebook's cell, run, killed, and run again as it is.
        script = self.client_script(
            "notebook.py",
            c,
            """
            import time
            def slow_square(x):
                time.sleep(0.3)
                return x * x
            c = mesh.connect(state_dir=STATE, resume=True)
            fs = c.map(slow_square, range(20))
            for f in mesh.as_completed(fs):
                print("done", f.result(), f.task.reused, flush=True)
            """,
        )
        p = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True)
        first = [p.stdout.readline().split() for _ in range(4)]
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        self.assertEqual([w[0] for w in first], ["done"] * 4)
        r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=WAIT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        said = [w.split() for w in r.stdout.splitlines()]
        self.assertEqual(sorted(int(w[1]) for w in said), sorted(i * i for i in range(20)), "every value, once")
        reused = {int(w[1]) for w in said if w[2] == "True"}
        self.assertTrue({int(w[1]) for w in first} <= reused, "what ended before the kill came back without running: %s" % said)
        self.assertLess(len(reused), 20, "the rest ran")
        # Neither run closed its farm (one was killed, the other just
        # ended): the node closed each once its process was gone, and each
        # ended with its calls.
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            farms = [p for p in c.farms() if p.name == "python"]
            if len(farms) == 2 and all(p.finished and not p.open for p in farms):
                break
            time.sleep(0.2)
        self.assertEqual([(p.finished, p.open) for p in farms], [(True, False)] * 2, [p.view for p in farms])

    def test_a_loop_of_submits_run_again_with_resume_is_reused_call_by_call(self):
        c = self.node(cpus=2)
        # Each call waited for before the next: a batch, a growth of the
        # client's open farm, each.
        script = self.client_script(
            "loop.py",
            c,
            """
            def square(x):
                return x * x
            with mesh.connect(state_dir=STATE, resume=True) as c:
                for i in range(8):
                    f = c.submit(square, i)
                    print(f.result(), f.task.reused, f._run.id, flush=True)
            """,
        )
        runs = []
        for _ in range(2):
            r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=WAIT_S)
            self.assertEqual(r.returncode, 0, r.stderr)
            runs.append([w.split() for w in r.stdout.splitlines()])
        first, again = runs
        self.assertEqual([int(w[0]) for w in again], [i * i for i in range(8)])
        self.assertEqual([w[1] for w in first], ["False"] * 8, "the first run ran every call")
        self.assertEqual([w[1] for w in again], ["True"] * 8, "run again, every call reused, in its first batch or a growth: %s" % again)
        self.assertEqual(len({w[2] for w in again}), 1, "one open farm")


class TwoNodes(InFolder):
    def two_nodes_apart(self):
        """A client's node of one core, and a second of one joined to it that
        does not see the first's folders (where mount namespaces can be made):
        the client, and the second node."""
        first = self.node(cpus=1)
        hide = [first.state_dir, self.dir] if nodes.apart_possible() else []
        second = nodes.start(cpus=1, join=first, hide=hide)
        self.addCleanup(second.stop)
        self.assertTrue(nodes.wait_until(lambda: len(first.status()["nodes"]) == 2))
        return first, second

    def test_futures_as_arguments_across_two_nodes_that_share_no_folder(self):
        first, _ = self.two_nodes_apart()

        def where(x):
            import socket

            time.sleep(0.3)
            return (x, os.getpid())

        xs = first.map(where, range(8))
        chain = first.submit(lambda ps: [p for p, _ in ps], xs)
        fan = first.submit(add, *[first.submit(lambda p: p[0], x) for x in xs])
        self.assertEqual(chain.result(timeout=WAIT_S), list(range(8)))
        self.assertEqual(fan.result(timeout=WAIT_S), sum(range(8)))
        ran_on = {f.task.node for f in xs}
        self.assertEqual(len(ran_on), 2, "both nodes ran calls")

    def test_calls_submitted_in_a_loop_grow_one_open_farm_across_two_nodes(self):
        first, _ = self.two_nodes_apart()
        # A submit at a time, as a loop of a user's does: each goes out on
        # its own, given the future of the one before (not done yet).
        chain = first.submit(inc, 0)
        links = [chain]
        for i in range(12):
            chain = first.submit(add, chain, i)
            links.append(chain)
            time.sleep(0.02)
        parts = [first.submit(slow_square, i) for i in range(10)]
        total = first.submit(add, *parts)
        self.assertEqual(chain.result(timeout=WAIT_S), 1 + sum(range(12)))
        self.assertEqual(total.result(timeout=WAIT_S), sum(i * i for i in range(10)))
        runs = {f._run.id for f in links + parts + [total]}
        self.assertEqual(len(runs), 1, "every call in the client's one open farm: %s" % runs)
        run = chain._run
        p = run.progress()
        self.assertGreater(len(p.stages), 3, "the farm grew a stage per batch: %s" % list(p.stages))
        self.assertEqual((p.done, p.total), (24, 24))
        self.assertFalse(p.finished, "open: not over while the client may add more")
        self.assertEqual(len({f.task.node for f in links + parts}), 2, "both nodes ran calls")
        first._functions()._close_open()
        self.assertTrue(nodes.wait_until(lambda: run.progress().finished), "closed: over")

    def test_a_node_killed_while_the_open_farm_grows_loses_no_value(self):
        first, second = self.two_nodes_apart()
        # A submit at a time, each given the future before it; the other
        # node (the coordinator or a worker) is killed a third of the way.
        fs, chain = [], None
        for i in range(30):
            fs.append(first.submit(slow_square, i))
            chain = first.submit(add, 0 if chain is None else chain, fs[-1])
            if i == 10:
                second.proc.send_signal(signal.SIGKILL)
            time.sleep(0.02)
        self.assertEqual(first.gather(fs), [i * i for i in range(30)])
        self.assertEqual(chain.result(timeout=WAIT_S), sum(i * i for i in range(30)))
        self.assertEqual(len({f._run.id for f in fs}), 1, "one open farm through the kill")

    def test_a_node_killed_mid_map_loses_no_value(self):
        first = self.node(cpus=1)
        second = nodes.start(cpus=2, join=first)
        self.addCleanup(second.stop)
        self.assertTrue(nodes.wait_until(lambda: len(first.status()["nodes"]) == 2))
        fs = first.map(slow_square, range(30))
        self.assertTrue(nodes.wait_until(lambda: sum(f.done() for f in fs) >= 3))
        second.proc.send_signal(signal.SIGKILL)
        self.assertEqual(first.gather(fs), [i * i for i in range(30)])


if __name__ == "__main__":
    unittest.main()
