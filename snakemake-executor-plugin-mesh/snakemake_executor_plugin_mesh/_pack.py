"""Thin jobs packed by themselves: how many of a rule's ready jobs one task runs, from what the rule's jobs cost so far.

A task that runs one job pays for a Snakemake of its own (forked from a
warm one on the node: its arguments, the Snakefile, the job's DAG, about
0.1-0.2 s), which a job of `touch` does not cover. So the jobs of a rule
whose jobs are seen to be short go several to a task, one Snakemake for
all of them (as a group job is, but chosen here, from the jobs' times):
enough that each task runs for about ``TARGET_S``, and never so many that
a node's slot would have nothing to do while another has a queue.

A rule not seen yet sends a few jobs alone, as probes (as many as the
mesh has slots for them); the rest of its ready jobs wait here, already
counted submitted by Snakemake, until a probe ends (then the rule's cost
is known) or for ``DEFER_S`` at most. Jobs with a ``runtime`` (a time limit of their own) and group
jobs always go alone.
"""

import math
import time

#: What one Snakemake per task costs beyond its jobs, seconds (measured
#: on a 2-core machine: 0.1-0.2 s forked warm).
OVERHEAD_S = 0.15
#: A job costing less than this is thin: packed with others.
THIN_S = 1.0
#: How long a packed task runs, about.
TARGET_S = 3.0
#: The most jobs one task runs.
BATCH_MAX = 250
#: How long jobs of a rule not seen yet wait for its probes at most
#: (they take every slot meanwhile: waiting costs nothing until one ends).
DEFER_S = 30.0
#: Weight of the newest measure in a rule's running mean.
NEW_WEIGHT = 0.3


class Costs:
    """What a job of each rule costs, as the tasks that ran them say."""

    def __init__(self):
        self.per_job = {}

    def seen(self, rule, task_s, jobs):
        """A task of ``jobs`` jobs of ``rule`` ran its Snakemake for
        ``task_s`` seconds (its interpreter's start aside)."""
        if task_s is None or jobs <= 0:
            return
        c = max(0.002, (task_s - OVERHEAD_S) / jobs)
        old = self.per_job.get(rule)
        self.per_job[rule] = c if old is None else (1 - NEW_WEIGHT) * old + NEW_WEIGHT * c

    def known(self, rule):
        return rule in self.per_job

    def size(self, rule, ready, slots):
        """How many of ``ready`` jobs of ``rule`` one task runs (1: alone)."""
        c = self.per_job.get(rule)
        if c is None or c >= THIN_S or ready <= 1:
            return 1
        k = int(math.ceil(TARGET_S / c))
        # Every slot gets work: no more to a task than a fair share.
        k = min(k, int(math.ceil(ready / max(1, slots))), BATCH_MAX)
        return max(1, k)


def chunks(items, k):
    """``items`` in runs of ``k`` (the last shorter), spread evenly."""
    n = len(items)
    if n == 0:
        return []
    count = int(math.ceil(n / k))
    base, extra = divmod(n, count)
    out, at = [], 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        out.append(items[at : at + size])
        at += size
    return out


class Deferred:
    """Jobs of rules not seen yet, waiting for their probes."""

    def __init__(self):
        #: rule -> [(since, item)]
        self.by_rule = {}

    def add(self, rule, item, now=None):
        self.by_rule.setdefault(rule, []).append((time.monotonic() if now is None else now, item))

    def __len__(self):
        return sum(len(v) for v in self.by_rule.values())

    def ready(self, costs, now=None, everything=False):
        """The waiting jobs whose rule is now known, or that waited long
        enough, by rule: taken out."""
        now = time.monotonic() if now is None else now
        out = {}
        for rule in list(self.by_rule):
            items = self.by_rule[rule]
            if everything or costs.known(rule) or now - items[0][0] >= DEFER_S:
                out[rule] = [i for _, i in items]
                del self.by_rule[rule]
        return out

    def drop(self):
        items = [i for v in self.by_rule.values() for _, i in v]
        self.by_rule.clear()
        return items
