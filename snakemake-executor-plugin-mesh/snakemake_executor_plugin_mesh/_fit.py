"""What a job asks of the mesh, fitted to what its nodes (and allocation queues) have, as Snakemake fits a job to ``--cores`` and ``--resources``.

Snakemake run with ``--cores 2`` runs a rule of ``threads: 8`` with 2
threads; one asking a resource that ``--resources`` does not name runs
as if it asked none; one asking more memory or GPUs than exist cannot
run at all. A mesh is the machine here: its largest node (or the nodes an
allocation queue would bring) bounds a job's cores, a custom resource no
node offers is ignored (said once), and a ``mem_mb`` or ``gpu`` ask that
no node meets fails the job at once, naming the ask and the largest node.
"""

import re

#: Resources Snakemake keeps for itself: never a task's.
SNAKEMAKE_OWN = {
    "_cores",
    "_nodes",
    "_job_count",
    "tmpdir",
    "runtime",
    "walltime",
    "disk_mb",
    "disk_mib",
    "disk",
    "mem_mib",
    "mem",
    "mem_mb",
    "threads",
    "gpu_model",
    "gpu_manufacturer",
}

#: Asks a job cannot do without: a node must have them, or the job fails.
HARD = {"mem", "gpu"}

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 1000**4,
}
_AMOUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def amount(name, text):
    """A node's quantity as ``mesh status`` writes it (``mem=7.5GiB``,
    ``cpu=2``): a float, ``mem`` in bytes; None when unreadable."""
    m = _AMOUNT.match(str(text))
    if not m:
        return None
    unit = m.group(2).lower()
    if name != "mem":
        return float(m.group(1)) if not unit else None
    if unit not in _UNITS:
        return None
    return float(m.group(1)) * _UNITS[unit]


def resources_of(text):
    """``cpu=2,mem=7.5GiB,token=1`` as a dict of floats."""
    out = {}
    for part in str(text or "").split(","):
        name, _, value = part.strip().partition("=")
        if not name:
            continue
        v = amount(name.strip(), value)
        if v is not None:
            out[name.strip()] = v
    return out


def words_of(name, value):
    """An amount as people read it: ``mem`` in GB or MB, the rest as numbers."""
    if name == "mem":
        if value >= 1000**3:
            return "%.1f GB" % (value / 1000**3)
        return "%d MB" % round(value / 1000**2)
    if float(value).is_integer():
        return "%d" % value
    return "%g" % value


class Capacity:
    """What the mesh can offer a task: each node's total resources (and a
    node of each allocation queue, which `mesh alloc` may bring)."""

    def __init__(self, nodes, queues=()):
        #: [(label, {resource: amount})]
        self.nodes = list(nodes)
        self.queues = list(queues)

    @classmethod
    def of_status(cls, status, allocs=None):
        nodes = []
        for n in status.get("nodes", []):
            total = resources_of((n.get("resources") or {}).get("total", ""))
            label = n.get("id", "?")
            nodes.append((label[:12] + ("..." if len(label) > 12 else ""), total))
        queues = []
        for q in (allocs or {}).get("queues", []) if isinstance(allocs, dict) else []:
            d = q.get("def", q) if isinstance(q, dict) else {}
            if not isinstance(d, dict) or "cores" not in d:
                continue
            r = {"cpu": float(d.get("cores") or 0)}
            if d.get("mem_bytes") is not None:
                r["mem"] = float(d["mem_bytes"])
            else:
                # A queue whose jobs' memory is not said: whatever a job asks.
                r["mem"] = float("inf")
            r["gpu"] = float(d.get("gpus") or 0)
            queues.append(("queue %s" % d.get("name", "?"), r))
        return cls(nodes, queues)

    @property
    def known(self):
        return bool(self.nodes or self.queues)

    def all(self):
        return self.nodes + self.queues

    def most(self, name):
        """The most of ``name`` any node (or queue) has, and that node; (0, None) when none has it."""
        best, who = 0.0, None
        for label, r in self.all():
            v = r.get(name, 0.0)
            if v > best:
                best, who = v, label
        return best, who

    def slots(self, res):
        """How many tasks asking ``res`` the nodes run at once (at least 1)."""
        n = 0
        for _, r in self.nodes:
            fits = None
            for name, want in res.items():
                if not isinstance(want, (int, float)) or want <= 0:
                    continue
                have = r.get(name)
                if have is None:
                    continue
                k = int(have // want)
                fits = k if fits is None else min(fits, k)
            n += fits if fits is not None else 1
        return max(1, n)

    def offered(self, name):
        return any(name in r for _, r in self.all())

    def largest(self):
        """The node with the most cores, in words: ``cpu=2, mem=7.5 GB``."""
        best = None
        for label, r in self.all():
            if best is None or r.get("cpu", 0) > best[1].get("cpu", 0):
                best = (label, r)
        if best is None:
            return "no node"
        label, r = best
        parts = ["%s=%s" % (k, words_of(k, v)) for k, v in sorted(r.items()) if v != float("inf")]
        return "%s (%s)" % (label, ", ".join(parts))


class Unfit(Exception):
    """A job no node of the mesh can hold: the words say what it asked and what the largest node has."""


def asks(job):
    """A job's asks as Snakemake computed them: (threads, {name: amount}),
    ``mem`` in bytes (from ``mem_mb``), numeric resources only."""
    threads = max(1, int(job.threads or 1))
    r = dict(job.resources.items()) if job.resources else {}
    out = {}
    mem = r.get("mem_mb")
    if isinstance(mem, (int, float)) and not isinstance(mem, bool) and mem > 0:
        out["mem"] = float(mem) * 1000**2
    for name, value in r.items():
        if name in SNAKEMAKE_OWN or name.startswith("_"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            continue
        out[name.lower()] = float(value)
    return threads, out


def fit(job, cap, warn):
    """The task's resources for ``job`` and the cores its Snakemake runs
    it with: (resources, cores). ``warn(name, words)``: said once per
    name by the caller. Raises :class:`Unfit` when a ``mem`` or ``gpu``
    ask is more than any node (or queue) has."""
    threads, wanted = asks(job)
    cores = threads
    if cap.known:
        most_cpu, _ = cap.most("cpu")
        if most_cpu >= 1 and threads > most_cpu:
            # As --cores does: the job runs with the cores there are.
            cores = int(most_cpu)
    res = {"cpu": cores}
    for name, value in wanted.items():
        if not cap.known:
            res[name] = value
            continue
        if name in HARD:
            most, who = cap.most(name)
            if value > most:
                have = "no node has any" if who is None else "%s on the node with the most (%s)" % (words_of(name, most), who)
                raise Unfit(
                    "it asks %s=%s, more than any node of the mesh has: %s; the largest node: %s"
                    % ("mem_mb" if name == "mem" else name, _asked(name, value), have, cap.largest())
                )
            res[name] = value
            continue
        if not cap.offered(name):
            warn(
                name,
                "resource %s (asked by rule %s) is offered by no node of the mesh: ignored, as Snakemake "
                "ignores a resource that --resources does not name (give nodes it with `mesh node --resources %s=N`)"
                % (name, _rule_of(job), name),
            )
            continue
        most, _ = cap.most(name)
        # As Snakemake caps an ask at what --resources gives.
        res[name] = min(value, most)
    return res, cores


def _asked(name, value):
    if name == "mem":
        return "%d" % round(value / 1000**2)
    return words_of(name, value)


def _rule_of(job):
    try:
        if job.is_group():
            return "group %s" % job.name
        return job.rule.name
    except Exception:
        return "?"


def mesh_amount(name, value):
    """An amount as a farm file's resources take it."""
    if name == "mem":
        return "%dMB" % max(1, round(value / 1000**2))
    if float(value).is_integer():
        return int(value)
    return round(float(value), 3)
