"""Python functions a Dask user can trust: no stale value, no silence limit, Dask's keywords, imports, threads, words for what cannot run.

Each test is a case a user porting a Dask script met (issue 61), run as
that user runs it: a script run twice on a running node, a first call
that runs longer than half a minute, a global changed between submits.
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest
import warnings

import nodes
from nodes import WAIT_S, mesh
from test_client import InFolder


def label(x, name="default", out="o", root="r", shell="s", stage="t"):
    return "%s:%s:%s%s%s%s%s" % (name, x, out, root, shell, stage, "")


def threads(_):
    return {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")}


def nap(s):
    time.sleep(s)
    return s


class Trust(InFolder):
    def script(self, name, c, body):
        """A user's script in the test's folder: ``body``, with ``c`` the
        client of the running node (``mesh.connect``; with ``resume=True``
        where ``$RESUME`` is 1)."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("import mesh\n")
            f.write("import os\nc = mesh.connect(state_dir=%r, resume=os.environ.get('RESUME') == '1')\n" % c.state_dir)
            f.write(textwrap.dedent(body))
        return path

    def run_script(self, path, cwd=None, resume=False):
        env = dict(os.environ, PYTHONPATH=os.path.join(nodes.REPO, "python"), RESUME="1" if resume else "0")
        r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=WAIT_S, cwd=cwd or self.dir, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def test_a_script_run_twice_computes_again_what_reads_draws_or_writes(self):
        c = self.node(cpus=2)
        script = self.script(
            "user_workflow.py",
            c,
            """
            import json, os, random, time
            def readfile(p):
                return open(p).read()
            def draw(_):
                return random.random()
            def now(_):
                return time.time()
            def write(i):
                os.makedirs("exp_c", exist_ok=True)
                with open("exp_c/%d" % i, "w") as f:
                    f.write("run %d" % i)
                return True
            out = {
                "read": c.submit(readfile, "data.txt").result(),
                "draw": c.submit(draw, 1).result(),
                "now": c.submit(now, 1).result(),
                "wrote": c.gather(c.map(write, range(1, 9))),
            }
            print(json.dumps(out))
            c.close()
            """,
        )
        with open(os.path.join(self.dir, "data.txt"), "w") as f:
            f.write("first")
        first = json.loads(self.run_script(script).stdout)
        self.assertEqual(first["read"], "first")
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, "exp_c"))), [str(i) for i in range(1, 9)])
        # The user edits the input and removes the outputs, then runs again.
        with open(os.path.join(self.dir, "data.txt"), "w") as f:
            f.write("second")
        subprocess.run(["rm", "-rf", os.path.join(self.dir, "exp_c")], check=True)
        again = json.loads(self.run_script(script).stdout)
        self.assertEqual(again["read"], "second", "the file as it is now, as Dask reads it")
        self.assertNotEqual(again["draw"], first["draw"], "a new draw")
        self.assertGreater(again["now"], first["now"], "a new clock")
        self.assertEqual(again["wrote"], [True] * 8)
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, "exp_c"))), [str(i) for i in range(1, 9)], "the files are written again")

    def test_a_dropped_future_submitted_again_reads_the_file_anew(self):
        c = self.node(cpus=2)

        def readfile(p):
            return open(p).read()

        with open("data.txt", "w") as f:
            f.write("old")
        f = c.submit(readfile, "data.txt")
        self.assertEqual(f.result(timeout=WAIT_S), "old")
        # Held: the same key is the same future, as in Dask.
        self.assertIs(c.submit(readfile, "data.txt"), f)
        del f
        with open("data.txt", "w") as f:
            f.write("new")
        self.assertEqual(c.submit(readfile, "data.txt").result(timeout=WAIT_S), "new")

    def test_a_global_changed_between_submits_is_the_new_value(self):
        c = self.node(cpus=2)
        script = self.script(
            "scaled.py",
            c,
            """
            SCALE = 2
            def scaled(x):
                return x * SCALE
            a = c.submit(scaled, 3).result()
            SCALE = 5
            b = c.submit(scaled, 3).result()
            SCALE = 7
            m = c.gather(c.map(scaled, [1, 2]))
            print(a, b, m)
            """,
        )
        self.assertEqual(self.run_script(script).stdout.strip().split(None, 2), ["6", "15", "[7, 14]"])

    def test_map_gives_the_function_its_own_keywords(self):
        c = self.node(cpus=2)
        fs = c.map(label, [1, 2], name="run7", out="O", root="R", shell="S", stage="T")
        self.assertEqual(c.gather(fs), ["run7:1:ORST", "run7:2:ORST"])
        # Dask's own keywords stay the map's.
        fs = c.map(label, [3], key=["mine-3"], pure=False, retries=1, priority=1, batch_size=10)
        self.assertEqual((fs[0].key, fs[0].result(timeout=WAIT_S)), ("mine-3", "default:3:orst"))
        # The command form keeps its options.
        run = c.map("echo {}", [1, 2], name="echoes")
        self.assertEqual(run.wait(timeout=WAIT_S).done, 2)
        self.assertTrue(run.id.startswith("echoes-"), run.id)

    def test_a_helper_module_beside_the_script_is_imported_in_a_mapped_call(self):
        c = self.node(cpus=2)
        lab = os.path.join(self.dir, "lab")
        os.makedirs(lab)
        with open(os.path.join(lab, "physics.py"), "w") as f:
            f.write("def energy(m):\n    return m * 299792458 ** 2\n")
        script = self.script(
            "lab/experiment.py",
            c,
            """
            def run(m):
                from physics import energy
                return energy(m)
            print(c.gather(c.map(run, [1, 2])))
            """,
        )
        # Run from another folder: the script's own folder is what counts.
        r = self.run_script(script, cwd=self.dir)
        self.assertEqual(r.stdout.strip(), str([299792458**2, 2 * 299792458**2]))

    def test_each_call_and_task_gets_its_granted_cores_as_its_thread_counts(self):
        c = self.node(cpus=2)
        self.assertEqual(set(c.submit(threads, 1).result(timeout=WAIT_S).values()), {"1"})
        self.assertEqual(set(c.submit(threads, 2, resources={"cpu": 2}).result(timeout=WAIT_S).values()), {"2"})
        # A command task too; a stage's own setting wins.
        run = c.map("sh -c 'echo $OMP_NUM_THREADS $MKL_NUM_THREADS > t.txt'", [1], workdir="w", outputs=["t.txt"], env={"OMP_NUM_THREADS": "3"}, resources={"cpu": 2})
        (t,) = run.gather(timeout=WAIT_S)
        with open(t.output) as f:
            self.assertEqual(f.read().split(), ["3", "2"])

    def test_a_call_no_node_can_hold_fails_at_once_in_words(self):
        n = nodes.start(cpus=2, resources={"token": 2})
        self.addCleanup(n.stop)
        f = n.submit(nap, 0, resources={"TOKEN": 1})
        with self.assertRaises(mesh.MeshError) as e:
            f.result(timeout=30)
        self.assertIn("no node offers TOKEN: did you mean token?", str(e.exception))
        g = n.submit(nap, 0, resources={"cpu": 64})
        with self.assertRaises(mesh.MeshError) as e:
            g.result(timeout=30)
        self.assertIn("cpu=64 asked, 2 on the largest node", str(e.exception))
        # What needs its value fails with it; the rest runs.
        self.assertRaises(mesh.MeshError, n.submit(nap, f).result, 30)
        self.assertEqual(n.submit(nap, 0.1, resources={"token": 1}).result(timeout=WAIT_S), 0.1)

    def test_a_call_asking_what_no_amount_is_fails_with_its_key_and_field_and_the_rest_runs(self):
        n = nodes.start(cpus=2)
        self.addCleanup(n.stop)
        # The first batch opens the farm, a later one grows it: both refuse
        # the batch in words that name the call and its field, and the
        # client goes on.
        for i in range(2):
            f = n.submit(nap, 0, resources={"mem": 512}, key="nap-mem-%d" % i)
            with self.assertRaises(mesh.MeshError) as e:
                f.result(timeout=30)
            self.assertIn("call nap-mem-%d: resources.mem: 512 bytes: give the unit" % i, str(e.exception))
            self.assertEqual(n.submit(nap, 0.1, resources={"mem": "1KiB"}).result(timeout=WAIT_S), 0.1)
        # What the client can tell itself, it says at the call.
        for bad in (-1, 1.5, "2"):
            with self.assertRaises(ValueError):
                n.submit(nap, 0, retries=bad)

    def test_a_killed_client_run_again_says_so_or_takes_its_calls_over(self):
        c = self.node(cpus=2)
        body = """
            import time
            def slow(x):
                time.sleep(0.3)
                return x * x
            fs = c.map(slow, range(24))
            for f in mesh.as_completed(fs):
                print("done", f.result(), f.task.reused, f._run.id, flush=True)
            """
        plain = self.script("notebook.py", c, body)
        env = dict(os.environ, PYTHONPATH=os.path.join(nodes.REPO, "python"))

        def killed_four_values_in():
            """The script run and SIGKILLed once 4 values came: its farm runs on."""
            p = subprocess.Popen([sys.executable, plain], stdout=subprocess.PIPE, text=True, env=env)
            first = [p.stdout.readline().split() for _ in range(4)]
            p.send_signal(signal.SIGKILL)
            p.wait()
            p.stdout.close()
            return first[0][3]

        dead = killed_four_values_in()
        # Run again as it is: Dask's semantics, every call runs, and the
        # user is told of the farm still running.
        r = self.run_script(plain)
        said = [w.split() for w in r.stdout.splitlines()]
        self.assertEqual(sorted(int(w[1]) for w in said), sorted(i * i for i in range(24)))
        self.assertEqual({w[2] for w in said}, {"False"}, "nothing reused without resume")
        self.assertIn("farm %s of a Python client that is gone still runs" % dead, r.stderr)
        self.assertIn("mesh cancel %s" % dead, r.stderr)
        self.assertIn("resume=True", r.stderr)
        # Killed again, then run with resume=True: what the dead client's
        # farm ran is reused, what it runs is followed there, not run twice.
        gone = killed_four_values_in()
        r = self.run_script(plain, resume=True)
        said = [w.split() for w in r.stdout.splitlines()]
        self.assertEqual(sorted(int(w[1]) for w in said), sorted(i * i for i in range(24)))
        self.assertNotIn("still runs", r.stderr)
        ran_here = [w for w in said if w[3] != gone and w[2] == "False"]
        self.assertEqual(ran_here, [], "every call was reused or followed in the dead client's farm: %s" % said)
        farm = [p for p in c.farms() if p.id == gone][0]
        self.assertTrue(nodes.wait_until(lambda: [p for p in c.farms() if p.id == gone][0].finished))
        farm = [p for p in c.farms() if p.id == gone][0]
        self.assertEqual((farm.done, farm.total), (24, 24))

    def test_the_small_things_a_dask_user_meets(self):
        with self.assertRaises(mesh.MeshError) as e:
            mesh.connect(python="/no/such/python")
        self.assertIn("/no/such/python", str(e.exception))
        c = nodes.start(cpus=2)
        fs = c.map(nap, [0, 0])
        # A future knows its farm once map has returned.
        self.assertIsNotNone(fs[0]._run)
        self.assertEqual(c.gather(fs), [0, 0])
        t0 = time.monotonic()
        c.close()
        self.assertLess(time.monotonic() - t0, 1.5, "a throwaway node stops at once")
        with self.assertRaises(mesh.MeshError) as e:
            c.submit(nap, 0)
        self.assertEqual(str(e.exception), "client closed")


    def test_a_local_mesh_closed_with_calls_running_stops_them_at_once_and_quietly(self):
        # A notebook cell interrupted, or a script's `with` left early: Dask's
        # LocalCluster closes at once; so does the node, saying nothing of
        # "going away" (it goes on purpose) and leaving no worker behind.
        path = os.path.join(self.dir, "early.py")
        with open(path, "w") as f:
            f.write(textwrap.dedent("""
                import os, time, mesh
                def slow(x):
                    time.sleep(60)
                    return os.getpid()
                t0 = time.monotonic()
                with mesh.local(cpus=2) as c:
                    fs = c.map(slow, range(6))
                    time.sleep(1.5)
                print(round(time.monotonic() - t0, 2))
            """))
        r = self.run_script(path)
        self.assertLess(float(r.stdout.strip()), 10, "the calls sleep 60 s: it waited for them")
        self.assertEqual(r.stderr.strip(), "", "closing said something")


def inc(x):
    return x + 1


def add(*xs):
    return sum(xs)


def pick(i, data):
    return data[i]


class DataAPI(InFolder):
    def test_scatter_gives_futures_of_data_that_calls_take(self):
        c = self.node(cpus=2)
        data = list(range(1000))
        [d] = c.scatter([data])
        self.assertEqual(d.status, "finished")
        self.assertEqual(d.result(), data)
        self.assertEqual(c.gather(c.map(pick, [1, 999], data=d)), [1, 999])
        # A list gives a list, a dict a dict, as in Dask; the same data the same future.
        fs = c.scatter([1, 2, 3])
        self.assertEqual([f.result() for f in fs], [1, 2, 3])
        self.assertEqual(c.submit(add, *fs).result(timeout=WAIT_S), 6)
        self.assertEqual(set(c.scatter({"a": 1, "b": 2})), {"a", "b"})
        self.assertIs(c.scatter([data])[0], d)

    def test_an_uploaded_module_is_imported_and_imported_anew_when_uploaded_again(self):
        c = self.node(cpus=2)
        # Not beside any script of the client's: only the upload brings it.
        where = os.path.join(self.dir, "elsewhere")
        os.makedirs(where)
        path = os.path.join(where, "shipped_helper.py")

        def uses(_):
            import shipped_helper

            return shipped_helper.VALUE

        with open(path, "w") as f:
            f.write("VALUE = 'one'\n")
        with self.assertRaises(ModuleNotFoundError):
            c.submit(uses, 0).result(timeout=WAIT_S)
        c.upload_file(path)
        self.assertEqual(c.submit(uses, 1).result(timeout=WAIT_S), "one")
        with open(path, "w") as f:
            f.write("VALUE = 'two'\n")
        c.upload_file(path)
        self.assertEqual(c.gather(c.map(uses, [2, 3])), ["two", "two"])
        self.assertRaises(ValueError, c.upload_file, os.path.join(self.dir, "notes.txt"))

    def test_dask_graphs_run_as_calls(self):
        try:
            import dask
            import dask.bag as db
            from dask import delayed
        except ImportError:
            raise unittest.SkipTest("dask is not installed")
        c = self.node(cpus=2)
        a = delayed(inc)(1)
        b = delayed(inc)(a)
        x = delayed(add)(a, b, 10)
        self.assertEqual(dask.compute(x, scheduler=c.get), (15,))
        self.assertEqual(x.compute(scheduler=c.get), 15)
        f = c.compute(x)
        self.assertIsInstance(f, mesh.Future)
        self.assertEqual(f.result(timeout=WAIT_S), 15)
        p = c.persist(x)
        self.assertEqual(p.compute(scheduler=c.get), 15)
        bag = db.from_sequence(range(10), npartitions=3).map(inc).filter(lambda v: v % 2 == 0).sum()
        self.assertEqual(bag.compute(scheduler=c.get), sum(v for v in range(1, 11) if v % 2 == 0))
        # Each task a call: the graph's tasks are the farm's.
        ran = c.farms()
        self.assertTrue(any(i.name == "python" and i.done >= 4 for i in ran), [i.view for i in ran])
        # A graph dict, as Dask's `get` takes it.
        self.assertEqual(c.get({"x": 1, "y": (inc, "x"), "z": (add, "x", "y")}, ["z", ["y"]]), [3, [2]])


class LongCalls(InFolder):
    def test_a_first_call_longer_than_thirty_seconds_comes_back(self):
        c = self.node(cpus=2)
        fs = c.map(nap, [33, 34])
        self.assertEqual(c.gather(fs), [33, 34])


class Dies(InFolder):
    def test_a_node_killed_takes_its_tasks_and_workers_with_it(self):
        first = self.node(cpus=1)
        # Three of the four tasks run here: a call and a command at least.
        second = nodes.start(cpus=3, join=first)
        self.addCleanup(second.stop)
        self.assertTrue(nodes.wait_until(lambda: len(first.status()["nodes"]) == 2))
        marker = "mesh-test-%d" % os.getpid()
        calls = first.map(nap, [300 + i for i in range(2)])
        run = first.map("sh -c 'sleep 400; echo %s'" % marker, [1, 2])

        def on(pid):
            """The processes whose ancestry leads to ``pid``."""
            out = subprocess.run(["ps", "-eo", "pid,ppid,pgid,args"], capture_output=True, text=True).stdout
            rows = [l.split(None, 3) for l in out.splitlines()[1:]]
            kids, found = {pid}, True
            while found:
                found = False
                for r in rows:
                    if int(r[1]) in kids and int(r[0]) not in kids:
                        kids.add(int(r[0]))
                        found = True
            return sorted(kids - {pid})

        def kinds():
            out = subprocess.run(["ps", "-o", "args=", "-p", ",".join(map(str, on(second.proc.pid))) or "0"], capture_output=True, text=True).stdout
            return ("warm.py" in out, marker in out)

        self.assertTrue(nodes.wait_until(lambda: kinds() == (True, True)), "the second node runs a call and a command")
        theirs = on(second.proc.pid)
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            second.proc.send_signal(signal.SIGKILL)
            second.proc.wait()

            def alive():
                return [p for p in theirs if _alive(p)]

            self.assertTrue(nodes.wait_until(lambda: not alive(), limit=10), "still running: %s" % alive())
            # The client says which node went, within seconds.
            gone = "mesh: node %s left the mesh; any task of %s it was running runs again" % (second.node, calls[0]._run.id)
            self.assertTrue(nodes.wait_until(lambda: gone in said.getvalue(), limit=30), said.getvalue())
        for f in calls:
            f.cancel()
        run.cancel()


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    unittest.main()
