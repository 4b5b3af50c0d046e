#!/usr/bin/env python3
"""Seeds 000/001: Python experiments that each hold a TOKEN (a licence, a
GPU share, a database connection), as Dask's `resources={"TOKEN": 1}`.

The node offers 2 TOKENs on 4 cores: at most 2 experiments run at once.

    python3 tokens.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))  # or pip install ./python
import mesh  # noqa: E402


def experiment(alpha, seed):
    """Stands in for a training run: holds its TOKEN for a while, returns a score."""
    start = time.time()
    time.sleep(0.3)
    score = round(1.0 / (1.0 + abs(alpha - 0.3)) + seed * 1e-3, 4)
    return {"alpha": alpha, "seed": seed, "score": score, "start": start, "end": time.time()}


with mesh.local(cpus=4, resources={"TOKEN": 2}) as client:
    alphas = [0.1, 0.2, 0.3, 0.4, 0.5]
    futures = [client.submit(experiment, a, s, resources={"TOKEN": 1}) for a in alphas for s in range(2)]
    results = []
    for f in mesh.as_completed(futures):
        r = f.result()
        results.append(r)
        print("alpha=%.1f seed=%d score=%.4f" % (r["alpha"], r["seed"], r["score"]))
    spans = [(r["start"], r["end"]) for r in results]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    best = max(results, key=lambda r: r["score"])
    print("at most %d at once; best alpha=%.1f" % (most, best["alpha"]))
