"""The Dask baseline for `--bench traces`: a WfCommons trace's tasks as sleeps with their exact dependencies, on a LocalCluster of the given slots.

Each task sleeps its recorded runtime times TIME_SCALE (rounded to the
microsecond, as `mesh import` writes it) and is submitted with
`client.submit` and its parents' futures, in an order where parents come
first. The cluster is one worker process with SLOTS threads; it is started
and warmed up before the clock starts, which runs from the first submit
to the last result. Prints one JSON line:
{"makespan_s": ..., "tasks": ..., "slots": ...}. Needs
`pip install distributed` (e.g. in a venv: `python3 -m venv /tmp/daskvenv
&& /tmp/daskvenv/bin/pip install distributed`).

    python3 benches/scripts/dask_trace.py TRACE.json TIME_SCALE SLOTS
"""

import json
import sys
import time

from dask.distributed import Client, LocalCluster, wait


def sleep(secs, *parents):
    time.sleep(secs)


def graph(path):
    """Task ids in an order where parents come first, their parents, their runtimes."""
    with open(path) as f:
        w = json.load(f)["workflow"]
    spec = w["specification"]["tasks"]
    runtime = {t["id"]: t.get("runtimeInSeconds", 0.0) for t in w.get("execution", {}).get("tasks", [])}
    parents = {t["id"]: set(t.get("parents", [])) for t in spec}
    for t in spec:
        for c in t.get("children", []):
            parents[c].add(t["id"])
    children = {t: [] for t in parents}
    for t, ps in parents.items():
        for p in ps:
            children[p].append(t)
    waiting = {t: len(ps) for t, ps in parents.items()}
    ready = [t["id"] for t in spec if waiting[t["id"]] == 0]
    order = []
    while ready:
        t = ready.pop(0)
        order.append(t)
        for c in children[t]:
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.append(c)
    return order, parents, runtime


def main():
    path, scale, slots = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    order, parents, runtime = graph(path)
    with LocalCluster(
        n_workers=1, threads_per_worker=slots, processes=True, dashboard_address=None
    ) as cluster, Client(cluster) as client:
        client.submit(sleep, 0, pure=False).result()
        start = time.perf_counter()
        futures = {}
        for t in order:
            secs = round(runtime.get(t, 0.0) * scale, 6)
            futures[t] = client.submit(sleep, secs, *[futures[p] for p in parents[t]], key=t, pure=False)
        wait(list(futures.values()))
        took = time.perf_counter() - start
    print(json.dumps({"makespan_s": took, "tasks": len(order), "slots": slots}))


if __name__ == "__main__":
    main()
