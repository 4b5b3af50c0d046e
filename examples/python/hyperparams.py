#!/usr/bin/env python3
"""A hyperparameter sweep that reads each result as it lands and prints the best so far.

Every learning rate times every depth (a product sweep), a folder per run,
train.py staged into it, metrics.json collected home; the loop below sees
each run once, as it ends, whichever node ran it.

    python3 examples/python/hyperparams.py     # a node running here, or a throwaway one
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # run from the repository, or pip install ./python

import mesh  # noqa: E402

farm = mesh.Farm("hyperparams", root=HERE)
farm.stage(
    "train",
    command=["python3", "train.py", "--lr", "{lr}", "--depth", "{depth}"],
    sweep={"lr": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2], "depth": range(2, 11, 2)},
    workdir="runs/{stage}/{index}",
    inputs=["train.py"],
    outputs=["metrics.json"],
    resources={"cpu": 1},
)

try:
    client = mesh.connect(mesh=os.environ.get("MESH_ADDR"))
except mesh.MeshError:
    client = mesh.local()

with client:
    run = client.submit(farm)
    best = None
    for t in run.as_completed():
        if not t.ok:
            print("%-10s failed: %s" % (t.task, t.reason))
            continue
        with open(t.output) as f:
            m = json.load(f)
        if best is None or m["loss"] < best["loss"]:
            best = m
            mark = "  <- best so far"
        else:
            mark = ""
        print("%-10s lr=%-7g depth=%-3d loss %.4f%s" % (t.task, m["lr"], m["depth"], m["loss"], mark))
    print("best: lr=%g depth=%d, loss %.4f (%d runs)" % (best["lr"], best["depth"], best["loss"], run.total))
