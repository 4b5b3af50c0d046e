"""Benchmark: Python functions on mesh against Dask distributed, in the same run.

    python python/tests/bench_functions.py [--tasks 10000] [--bin target/release/mesh] [--only NAME]

Needs dask[distributed] and numpy in the Python that runs it (a venv:
``pip install "dask[distributed]" numpy cloudpickle``). Each figure:

- ``thin``: N ``inc`` calls, ``map`` then ``gather``, on ``mesh.local(cpus=2)``
  against Dask's ``LocalCluster(n_workers=2, threads_per_worker=1)``, both
  started before the clock; the ratio mesh / Dask (target <= 0.3).
- ``first``: ``submit(inc, i).result()`` on a warm node, the median of 30.
- ``loop``: ``submit(inc, i).result()`` 600 times, on one node and on two
  (each keeping a copy of the farm): the median of each 50 calls, which
  should stay flat over an open farm's growths (each call is one).
- ``long``: ``submit(inc, i).result()`` 20,000 times on one node, all in
  the client's one open farm (20,000 growths): the median of each 2,000,
  and the last over the first, which should stay near 1 (a growth costs
  what it adds, not the farm).
- ``numpy``: 1,000 calls that import numpy and return an array's sum, with
  warm workers against an interpreter started per call.
- ``two``: 2,000 ``time.sleep(0.005)`` calls on 2 nodes of 1 core against
  one node of 2 (target <= 1.10).
- ``memory``: 100,000 pending futures: bytes per future at the client, and
  the node's resident memory per task against a command sweep of as many.
- ``linalg``: 1,000 calls of about 10 ms of numpy work (a 200x200 matrix
  product and solve) against Dask's ``LocalCluster`` (target <= 1.0).
- ``big``: a 100 MB result (bytes) brought back by ``result()``, against
  Dask (target <= 1.5); the median of 3.
- ``graph``: a ``dask.delayed`` graph of 10,000 small tasks with fan-in
  (100 groups of 100 ``inc``, each summed, then the sums summed), with
  ``dask.compute(scheduler=client.get)`` against Dask distributed's
  ``client.compute`` (target <= 0.5).
"""

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import mesh  # noqa: E402
import mesh._functions  # noqa: E402


def inc(x):
    return x + 1


def nap(x):
    time.sleep(0.005)
    return x


def numpy_sum(n):
    import numpy as np

    return int(np.arange(n).sum())


def linalg(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    a = rng.random((200, 200)) + 200 * np.eye(200)
    b = rng.random(200)
    x = np.linalg.solve(a @ a.T, b)
    return float(x.sum())


def big_bytes(n):
    return b"x" * n


def total(xs):
    return sum(xs)


def dask_cluster():
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    return cluster, Client(cluster)


def linalg_calls(n=1000):
    cluster, dc = dask_cluster()
    with cluster, dc:
        dc.gather(dc.map(linalg, range(n, n + 4)))
        dask_s, want = timed(lambda: dc.gather(dc.map(linalg, range(n))))
    with mesh.local(cpus=2) as c:
        c.gather(c.map(linalg, range(n, n + 4)))
        mesh_s, got = timed(lambda: c.gather(c.map(linalg, range(n))))
    assert got == want
    print("linalg: %d calls of ~10 ms of numpy: mesh %.2f s, Dask %.2f s: ratio %.3f (target <= 1.0)" % (n, mesh_s, dask_s, mesh_s / dask_s))


def big(n=100_000_000, runs=3):
    cluster, dc = dask_cluster()
    with cluster, dc:
        dask_s = statistics.median(timed(lambda: len(dc.submit(big_bytes, n, pure=False).result()))[0] for _ in range(runs))
    with mesh.local(cpus=2) as c:
        c.submit(inc, 0).result()
        mesh_s = statistics.median(timed(lambda: len(c.submit(big_bytes, n, pure=False).result()))[0] for _ in range(runs))
    print("big: a %d MB result: mesh %.2f s, Dask %.2f s: ratio %.2f (target <= 1.5)" % (n // 1_000_000, mesh_s, dask_s, mesh_s / dask_s))


def graph(groups=100, width=100):
    import dask
    from dask import delayed

    def build():
        sums = [delayed(total)([delayed(inc)(g * width + i) for i in range(width)]) for g in range(groups)]
        return delayed(total)(sums)

    want = sum(range(1, groups * width + 1))
    cluster, dc = dask_cluster()
    with cluster, dc:
        dc.submit(inc, 0).result()
        dask_s, got = timed(lambda: dc.compute(build()).result())
        assert got == want
    with mesh.local(cpus=2) as c:
        c.submit(inc, 0).result()
        mesh_s, got = timed(lambda: dask.compute(build(), scheduler=c.get)[0])
        assert got == want
    print("graph: %d delayed tasks with fan-in: mesh %.2f s, Dask %.2f s: ratio %.3f (target <= 0.5)" % (groups * width + groups + 1, mesh_s, dask_s, mesh_s / dask_s))


def timed(f):
    t0 = time.monotonic()
    v = f()
    return time.monotonic() - t0, v


def thin(n):
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as dc:
        dc.submit(inc, -1).result()
        dask_s, got = timed(lambda: dc.gather(dc.map(inc, range(n))))
        assert got == list(range(1, n + 1))
    with mesh.local(cpus=2) as c:
        c.submit(inc, -1).result()
        mesh_s, got = timed(lambda: c.gather(c.map(inc, range(n))))
        assert got == list(range(1, n + 1))
    print("thin: %d inc calls: mesh %.2f s (%.3f ms a call), Dask %.2f s (%.3f ms): ratio %.3f (target <= 0.3)" % (n, mesh_s, mesh_s / n * 1e3, dask_s, dask_s / n * 1e3, mesh_s / dask_s))


def first():
    with mesh.local(cpus=2) as c:
        for i in range(5):
            c.submit(inc, 10_000 + i).result()
        times = []
        for i in range(30):
            t0 = time.monotonic()
            c.submit(inc, i).result()
            times.append(time.monotonic() - t0)
    print("first: submit(...).result() on a warm node: median %.1f ms, min %.1f ms (target <= 5 ms)" % (statistics.median(times) * 1e3, min(times) * 1e3))


@contextlib.contextmanager
def two_nodes():
    """Two nodes of one core each, the second joined to the first: both
    clients, once the first hears the second."""
    with mesh.local(cpus=1) as a:
        with mesh.local(cpus=1, join=a.address, key=os.path.join(a.state_dir, "mesh.key")) as b:
            deadline = time.monotonic() + 60
            while len(a.status()["nodes"]) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            yield a, b


def submit_loop(c, n, each):
    """``submit(inc, i).result()`` ``n`` times on client ``c`` (warmed by
    one first): the median ms of each ``each`` calls."""
    c.submit(inc, -1).result()
    times = []
    for i in range(n):
        t0 = time.monotonic()
        assert c.submit(inc, i).result() == i + 1
        times.append(time.monotonic() - t0)
    return [statistics.median(times[k : k + each]) * 1e3 for k in range(0, n, each)]


def loop(n=600):
    def medians(c):
        return " ".join("%.1f" % m for m in submit_loop(c, n, 50))

    with mesh.local(cpus=2) as c:
        one = medians(c)
    with two_nodes() as (a, _):
        two = medians(a)
    print("loop: %d submit(inc, i).result(), median ms of each 50: one node %s; two nodes %s" % (n, one, two))


def long_loop(n=20_000, each=2_000):
    with mesh.local(cpus=2) as c:
        meds = submit_loop(c, n, each)
        farms = len({c.submit(inc, 0)._run.id, c.submit(inc, 1)._run.id})
    print(
        "long: %d submit(inc, i).result() in %d open farm, median ms of each %d: %s; last / first %.2f"
        % (n, farms, each, " ".join("%.2f" % m for m in meds), meds[-1] / meds[0])
    )


def numpy_calls(n=1000):
    with mesh.local(cpus=2) as c:
        c.submit(numpy_sum, 10).result()
        warm_s, got = timed(lambda: c.gather(c.map(numpy_sum, range(n), pure=False)))
        mesh._functions.WARM = False
        try:
            cold_s, got2 = timed(lambda: c.gather(c.map(numpy_sum, range(n), pure=False)))
        finally:
            mesh._functions.WARM = True
    assert got == got2
    print("numpy: %d calls: warm workers %.2f s, an interpreter a call %.2f s: %.1fx faster" % (n, warm_s, cold_s, cold_s / warm_s))


def two(n=2000):
    with mesh.local(cpus=2) as one:
        one.submit(nap, -1).result()
        one_s, _ = timed(lambda: one.gather(one.map(nap, range(n))))
    with two_nodes() as (a, b):
        a.submit(nap, -1).result()
        two_s, fs = timed(lambda: a.map(nap, range(n)))
        t0 = time.monotonic()
        a.gather(fs)
        two_s += time.monotonic() - t0
        on = {f.task.node for f in fs}
        assert b.node in on
    print("two: %d sleep(0.005) calls: 2 nodes of 1 core %.2f s (ran on %d), 1 node of 2 %.2f s: ratio %.3f (target <= 1.10)" % (n, two_s, len(on), one_s, two_s / one_s))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def hold(x):
    if x == 0:
        time.sleep(300)
    return x


def memory(n=100_000):
    with mesh.local(cpus=1) as c:
        c.submit(inc, 0).result()
        # One core, held by the first call: the others wait at the node.
        gc.collect()
        tracemalloc.start()
        before_node = rss_kib(c.proc.pid)
        fs = c.map(hold, range(n))
        while any(f._run is None for f in fs[-1:]):
            time.sleep(0.2)
        # Sent is not yet taken: the node holds the calls once its farms
        # count them (seconds after the last is sent, at 100,000), and the
        # client is done sending them (a future is sent before its batch's
        # text is written and sent; both are gone after).
        runs = {f._run.id: f._run for f in fs}.values()
        deadline = time.monotonic() + 300
        while sum(r.progress().total for r in runs) < n and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        gc.collect()
        cur, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        node_fn = rss_kib(c.proc.pid) - before_node
        for r in {f._run.id: f._run for f in fs}.values():
            r.cancel()
        del fs
    sweeps = []
    for values in (range(n), ["%040x" % (i * 2654435761) for i in range(n)]):
        with mesh.local(cpus=1) as c:
            before = rss_kib(c.proc.pid)
            folder = tempfile.mkdtemp(prefix="mesh-bench-sweep-")
            run = c.map("sleep 300 {}", values, root=folder, out=os.path.join(folder, "out"))
            time.sleep(2)
            sweeps.append(rss_kib(c.proc.pid) - before)
            run.cancel()
    print(
        "memory: %d pending futures: %.0f bytes a future at the client; at the node %.0f bytes a call, "
        "against %.0f a task of a range sweep and %.0f of a list of 40-character values"
        % (n, cur / n, node_fn * 1024 / n, sweeps[0] * 1024 / n, sweeps[1] * 1024 / n)
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "mesh"))
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    os.environ["MESH_BIN"] = os.path.abspath(a.bin)
    benches = [
        ("thin", lambda: thin(a.tasks)),
        ("first", first),
        ("loop", loop),
        ("long", long_loop),
        ("numpy", numpy_calls),
        ("two", two),
        ("memory", memory),
        ("linalg", linalg_calls),
        ("big", big),
        ("graph", graph),
    ]
    for name, f in benches:
        if a.only in (None, name):
            f()


if __name__ == "__main__":
    main()
