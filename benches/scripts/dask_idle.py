"""The anchor for `--bench idle`: what an idle Dask LocalCluster costs per worker on this machine.

Starts `LocalCluster(n_workers=N, threads_per_worker=1, processes=True)`
for each N in the arguments (default 20 100), lets it settle for 10 s,
then measures the CPU of the whole process tree (scheduler, nannies and
workers) over 20 s from /proc, and prints it per worker in ms/s, with
RSS per worker. Needs `pip install dask distributed`.

    python3 benches/scripts/dask_idle.py 20 100
"""

import os
import sys
import time

from dask.distributed import LocalCluster

TICK = os.sysconf("SC_CLK_TCK")


def tree(root):
    """The pids of `root` and every process below it."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(pid))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def summed(pids, name, value):
    """The sum over `pids` of `value` of each one's /proc/PID/`name` text
    (a process gone meanwhile counts nothing)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/{name}") as f:
                total += value(f.read())
        except OSError:
            pass
    return total


def cpu_ticks(pids):
    def ticks(stat):
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    return summed(pids, "stat", ticks)


def rss_kb(pids):
    def rss(status):
        return sum(
            int(line.split()[1])
            for line in status.splitlines()
            if line.startswith("VmRSS:")
        )

    return summed(pids, "status", rss)


def measure(n, settle=10.0, span=20.0):
    with LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        cluster.wait_for_workers(n)
        time.sleep(settle)
        pids = tree(os.getpid())
        t0, c0 = time.monotonic(), cpu_ticks(pids)
        time.sleep(span)
        t1, c1 = time.monotonic(), cpu_ticks(pids)
        ms_per_s = (c1 - c0) / TICK * 1000 / (t1 - t0) / n
        rss = rss_kb(pids) / 1024 / n
        print(
            f"dask LocalCluster, {n} workers: idle CPU {ms_per_s:.1f} ms/s per worker "
            f"(scheduler and nannies included), RSS {rss:.0f} MB per worker",
            flush=True,
        )


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [20, 100]:
        measure(n)
