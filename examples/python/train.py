#!/usr/bin/env python3
"""Stands in for a training run: a validation loss for a learning rate and a depth, after a while, into metrics.json."""

import argparse
import json
import math
import random
import time

ap = argparse.ArgumentParser()
ap.add_argument("--lr", type=float, required=True)
ap.add_argument("--depth", type=int, required=True)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

rng = random.Random(hash((a.lr, a.depth, a.seed)))
time.sleep(rng.uniform(0.05, 0.4))  # training takes longer for some settings than others
loss = (math.log10(a.lr) + 2.5) ** 2 + (a.depth - 6) ** 2 / 10 + rng.gauss(0, 0.02)
print("lr=%g depth=%d: validation loss %.4f" % (a.lr, a.depth, loss))
with open("metrics.json", "w") as f:
    json.dump({"lr": a.lr, "depth": a.depth, "loss": loss}, f)
