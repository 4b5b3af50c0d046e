#!/usr/bin/env python3
"""Seed 003's Dask snippets, with mesh in place of Dask.

    python3 seed003.py
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))  # or pip install ./python
import mesh  # noqa: E402

# Dask: cluster = LocalCluster(n_workers=4); client = Client(cluster)
with mesh.local(cpus=4) as client:
    # Submit a task to the local cluster
    future = client.submit(lambda x: x + 1, 10)

    # Get the result once the task is complete
    result = future.result()
    print("lambda:", result)

    def slow_increment(x):
        return x + 1

    futures = client.submit(slow_increment, 5000)
    print("slow_increment:", futures.result())

    # The graph grows as it runs: futures as arguments are dependencies.
    a = client.map(slow_increment, range(10))
    total = client.submit(sum, a)
    mesh.progress(a + [total], file=sys.stdout)
    print("sum:", total.result())
