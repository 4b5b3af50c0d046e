"""A differential test of mesh's Python functions against Dask (issue 61).

A seeded generator makes client *sessions*: short lists of steps a Dask
user's script takes (submit and map with keywords, futures as arguments,
a global changed between two submits, a file read then changed, random
numbers, exceptions, cancels, gathers, scatter, ``dask.delayed`` graphs,
a helper module beside the script, a call that writes a file, a script
run twice on one node, ``resume=True``). Sessions are written out as real
Python scripts (``session.py`` beside ``physics.py`` and their data files)
and run as a user runs them, ``python session.py``: once with Dask's
``LocalCluster(n_workers=2, threads_per_worker=1, processes=True)``, once
with mesh (only the client's lines differ). Each script prints a JSON
record per session of what it saw: values as ``repr``, exceptions as type
name and message, random numbers only as relations (two calls differ, a
value differs from the run before), and the harness lists the files its
calls wrote. The records are compared label by label.

Mesh modes (``MODES``):

- ``local``: ``mesh.local(cpus=2)`` in the script;
- ``connect``: ``mesh.connect()`` to a node started once, the script run
  twice (the files it reads changed between the runs, what it wrote
  removed: the second run must compute again);
- ``resume``: ``mesh.connect(resume=True)``, run twice: only what depends
  on the calls' arguments alone is compared, and the second run must
  reuse the values of the ``resume`` steps' calls;
- ``apart``: ``mesh.connect()`` to the first of 3 nodes, the two others in
  mount namespaces of their own with an empty tmpfs over the sessions'
  folders and the first node's state folder (root and ``unshare -m``);
- ``killed`` and ``killed_resume``: the script (``mesh.connect()``, and
  ``mesh.connect(resume=True)``) SIGKILLed 2 s into its run, then run
  again whole, as a user does: the second run's values against Dask's.

A ``node_killed`` step SIGKILLs a node mid-map: under Dask a worker
process (its nanny starts another), under mesh in mode ``apart`` one of
the two other nodes (the harness starts a node in its place after the
script); in the modes of one node there is no other node to kill, and
the map runs whole.

``python/tests/test_dask_diff.py`` runs 200 sessions in the Python suite;
``python/tests/bench_dask_diff.py`` runs many more. Sessions go several to
a script (``batch``): a Dask cluster takes seconds to start, a session a
fraction of one. A difference is reported with its seed, its session, the
step's own script (a session of that step alone, its data files written
by the script itself) and both records.
"""

import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

#: Every kind of step, in the order of the table.
KINDS = [
    "submit_kwargs",
    "map_kwargs",
    "futures_args",
    "global_change",
    "file_reread",
    "random",
    "exception",
    "cancel",
    "cancel_done",
    "gather_nested",
    "as_completed",
    "scatter",
    "delayed_get",
    "delayed_compute",
    "bag",
    "helper_import",
    "write_file",
    "rerun",
    "resume",
    "node_killed",
]

#: The mesh modes; a batch of sessions runs in one of them (in turn), or in
#: each (``every_mode``).
MODES = ["local", "connect", "resume", "apart", "killed", "killed_resume"]
#: Modes whose script runs twice against the same node.
TWICE = ("connect", "resume")
#: Modes whose script is SIGKILLed mid-way (a client killed), then run
#: again whole, as a user runs it again: its second run is compared.
KILLED = ("killed", "killed_resume")
#: Seconds into the first run of a KILLED mode's script that it is killed.
KILL_AFTER_S = 2.0
#: Modes whose second run may take values of the first (resume=True): only
#: what depends on the calls' arguments alone is compared there.
RESUMING = ("resume", "killed_resume")

#: Seconds a script waits for any one value (``result(timeout=T)``).
WAIT_S = 15
#: Seconds the script sleeps where a user would do something between two
#: calls (edit a file): Dask releases a dropped future's key on its event
#: loop, so a call resubmitted the same instant gets the old value back.
PAUSE_S = 0.1
#: Seconds a cancel's gate holds its dependents back when its flag is not
#: seen (a node apart does not see the client's folder).
GATE_S = 1.5

#: The helper module beside each script.
PHYSICS = '''\
"""A helper module beside the session's script, as a user's own."""

G = 9.81


def energy(m, v):
    return 0.5 * m * v * v


def potential(m, h):
    return m * G * h
'''

# ---------------------------------------------------------------------------
# The scripts' common part: what a session records, and how.

PRELUDE = '''\
T = %(wait)r  # seconds any one value is waited for
PAUSE_S = %(pause)r  # a user's pause between two calls (editing a file)
_OBS = {}
_META = {}


def _exc(e):
    if isinstance(e, (concurrent.futures.CancelledError, asyncio.CancelledError)):
        return ["CancelledError"]  # Dask's message is the call's key
    if isinstance(e, (TimeoutError, concurrent.futures.TimeoutError)):
        return ["TimeoutError"]
    return [type(e).__name__, str(e)]


def obs(label, thunk, random_value=False):
    """Records what ``thunk()`` gives: its repr, or its exception's type and
    message; a random value is compared only to itself in another run."""
    try:
        v = thunk()
    except Exception as e:
        _OBS[label] = ["error"] + _exc(e)
    else:
        _OBS[label] = ["random" if random_value else "value", repr(v)]


def exc_of(e):
    return None if e is None else [type(e).__name__, str(e)]


def one_of(thunk, futures):
    """What ``thunk()`` gives, or which exception it raises of those of
    ``futures`` (Dask's gather raises that of any one failed call: it
    looks at them as a set)."""
    try:
        return ["value", thunk()]
    except Exception as e:
        theirs = [exc_of(f.exception(timeout=T)) for f in futures if f.status == "error"]
        return ["raised one of the calls' exceptions" if exc_of(e) in theirs else "raised another: " + repr(exc_of(e))]


def note_reused(label, futures):
    """Whether each call's value was kept from an earlier run (mesh's
    ``future.task.reused``; Dask's futures say nothing)."""
    got = []
    for f in futures:
        t = getattr(f, "task", None)
        if t is None or not hasattr(t, "reused"):
            return
        got.append(bool(t.reused))
    _META[label] = got


def _futures_in(x, out):
    if hasattr(x, "key") and hasattr(x, "result") and hasattr(x, "done"):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for v in x:
            _futures_in(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _futures_in(v, out)
    return out


def ready(x):
    """``x`` once every future in it is done (at most T seconds)."""
    fs = _futures_in(x, [])
    if fs:
        wait(fs, timeout=T)
    return x


def until(cond, limit=None):
    deadline = time.monotonic() + (T if limit is None else limit)
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def pause():
    time.sleep(PAUSE_S)


def write(path, text):
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def step(label, fn, client):
    try:
        fn(client)
    except Exception as e:
        _OBS[label + ".raised"] = ["error"] + _exc(e)


def session_done(index, t0):
    print("@@DIFF " + json.dumps({"session": index, "obs": _OBS, "meta": _META, "seconds": round(time.monotonic() - t0, 3)}), flush=True)
    _OBS.clear()
    _META.clear()
'''

#: What docs/python.md's "What differs from Dask" says a mode does
#: otherwise, by step kind: not compared there. On nodes that do not see
#: the client's folder (apart), a file a call writes is on the node that
#: ran it, and a file of the client's folder a call reads is not there,
#: as on a Dask worker of another machine: the files written, what the
#: client reads of them, and what calls read of the client's files are
#: not compared; the paths the calls return are.
DOCUMENTED = {"apart": {"write_file", "file_reread", "rerun"}}

#: How each backend's script starts its client: (imports, with-statement).
CLIENTS = {
    "dask": (
        "from dask.distributed import Client, LocalCluster, as_completed, wait",
        "with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host=\"127.0.0.1\", dashboard_address=None) as cluster, Client(cluster) as client:",
    ),
    "local": ("import mesh\nfrom mesh import as_completed, wait", "with mesh.local(cpus=2) as client:"),
    "connect": ("import mesh\nfrom mesh import as_completed, wait", "with mesh.connect() as client:"),
    "resume": ("import mesh\nfrom mesh import as_completed, wait", "with mesh.connect(resume=True) as client:"),
    "apart": ("import mesh\nfrom mesh import as_completed, wait", "with mesh.connect() as client:"),
    "killed": ("import mesh\nfrom mesh import as_completed, wait", "with mesh.connect() as client:"),
    "killed_resume": ("import mesh\nfrom mesh import as_completed, wait", "with mesh.connect(resume=True) as client:"),
}

#: How each backend's script kills a node mid-map (``node_killed``).
KILLERS = {
    "dask": '''\
def kill_a_node(client):
    """SIGKILLs one of the cluster's worker processes (its nanny starts
    another, and the calls it ran run again)."""
    import signal
    pids = client.run(os.getpid)
    os.kill(max(pids.values()), signal.SIGKILL)
''',
    "apart": '''\
def kill_a_node(client):
    """SIGKILLs one of the nodes other than the client's (the harness says
    which in $MESH_DIFF_VICTIMS, and starts another after the script)."""
    import signal
    for pid in os.environ.get("MESH_DIFF_VICTIMS", "").split():
        try:
            os.kill(int(pid), signal.SIGKILL)
            return
        except ProcessLookupError:
            continue
''',
}
#: The modes of one node: no node but the client's own to kill.
KILLERS_NONE = '''\
def kill_a_node(client):
    """One node, the client's own: no other to kill."""
'''

# ---------------------------------------------------------------------------
# The generator.


class Step:
    """One step of a session: top-level code (functions, globals), the
    body of its function, the files it reads, the labels it records."""

    def __init__(self, kind, session, n):
        self.kind = kind
        self.session = session
        self.n = n
        #: Prefix of its names: s17_3_inc.
        self.p = "s%d_%d_" % (session, n)
        #: Its names in capitals: S17_3_SCALE.
        self.P = self.p.upper()
        self.defs = []
        self.body = []
        #: Files before the first run, and before the second: path -> text.
        self.files = {}
        self.files2 = {}
        #: Labels whose value depends on more than the calls' arguments
        #: (files, random numbers): not compared with resume=True.
        self.volatile = set()
        #: Labels of calls whose reuse across runs is checked (mesh only):
        #: must be reused with resume=True (``True``), never without.
        self.reuse = {}
        self.top_physics = False

    def label(self, what):
        return "%s.%d.%s" % (self.kind, self.n, what)

    def define(self, code):
        self.defs.append(textwrap.dedent(code).strip("\n"))

    def do(self, code):
        self.body.extend(textwrap.dedent(code).strip("\n").split("\n"))

    def obs(self, what, expr, random_value=False, volatile=False):
        label = self.label(what)
        self.body.append("obs(%r, lambda: %s%s)" % (label, expr, ", random_value=True" if random_value else ""))
        if volatile or random_value:
            self.volatile.add(label)
        return label


class Session:
    def __init__(self, seed, index, steps):
        self.seed = seed
        self.index = index
        self.steps = steps
        #: What the runs recorded: (mode, run) -> (Dask's, mesh's).
        self.records = {}

    @property
    def kinds(self):
        return sorted({s.kind for s in self.steps}, key=KINDS.index)

    @property
    def volatile(self):
        return set().union(*[s.volatile for s in self.steps])

    def files(self, run=1):
        out = {}
        for s in self.steps:
            out.update(s.files)
            if run > 1:
                out.update(s.files2)
        return out

    def alone(self, n):
        """This session with only its step ``n`` (a difference's script)."""
        return Session(self.seed, self.index, [s for s in self.steps if s.n == n])

    def __repr__(self):
        return "<session %d of seed %s: %s>" % (self.index, self.seed, ", ".join(s.kind for s in self.steps))


def _word(rng):
    return rng.choice(["run7", "alpha", "beta", "exp_c", "gamma", "x", "delta-2", "out.txt", "/tmp/r", ""])


_KW_NAMES = ["name", "out", "root", "shell", "stage"]


def _kw_value(rng, k):
    if k == "shell":
        return rng.choice([True, False, "bash"])
    return _word(rng)


def _kwargs(rng, names=_KW_NAMES, least=1):
    ks = rng.sample(names, rng.randint(least, len(names)))
    if rng.random() < 0.3:
        ks.append("tag")
    return {k: _kw_value(rng, k) for k in ks}


def _kwtext(kw):
    return "".join(", %s=%r" % kv for kv in kw.items())


def _label_fn(st):
    st.define(
        """
        def %slabel(x, y=0, *rest, name="default", out="-", root="/", shell=False, stage="none", **more):
            return (x, y, rest, name, out, root, shell, stage, sorted(more.items()))
        """
        % st.p
    )


def gen_submit_kwargs(rng, st):
    _label_fn(st)
    for i in range(rng.randint(1, 3)):
        args = [rng.randint(0, 9) for _ in range(rng.randint(1, 3))]
        kw = _kwargs(rng)
        st.do("f%d = client.submit(%slabel, %s%s)" % (i, st.p, ", ".join(map(repr, args)), _kwtext(kw)))
        st.obs("value%d" % i, "f%d.result(timeout=T)" % i)


def gen_map_kwargs(rng, st):
    _label_fn(st)
    n = rng.randint(1, 4)
    xs = [rng.randint(0, 9) for _ in range(n)]
    iters = [repr(xs)]
    if rng.random() < 0.5:
        iters.append(repr([rng.randint(0, 9) for _ in range(n)]))
    kw = _kwargs(rng)
    st.do("fs = client.map(%slabel, %s%s)" % (st.p, ", ".join(iters), _kwtext(kw)))
    st.obs("values", "client.gather(ready(fs))")
    if rng.random() < 0.5:
        # The same map with other keywords: other calls.
        kw2 = _kwargs(rng)
        st.do("gs = client.map(%slabel, %s%s)" % (st.p, ", ".join(iters), _kwtext(kw2)))
        st.obs("other", "client.gather(ready(gs))")


def gen_futures_args(rng, st):
    p = st.p
    st.define(
        """
        def %(p)sinc(x):
            return x + 1


        def %(p)stotal(*xs, **kw):
            def flat(v):
                if isinstance(v, dict):
                    return sum(flat(x) for x in v.values())
                if isinstance(v, (list, tuple)):
                    return sum(flat(x) for x in v)
                return v

            return flat(xs) + flat(kw)


        def %(p)sshape(v):
            return repr(v)
        """
        % {"p": p}
    )
    st.do("a = client.submit(%sinc, %d)" % (p, rng.randint(0, 50)))
    st.do("b = client.submit(%sinc, a)" % p)
    forms = [
        "client.submit(%(p)stotal, [a, {'k': b}], (b, %(r)d), extra={'z': [a, %(r)d]})",
        "client.submit(%(p)stotal, a, b, %(r)d)",
        "client.submit(%(p)sshape, {'x': [a, (b,)], 'y': %(r)d})",
        "client.submit(%(p)sshape, [a, [b, [a]]])",
        "client.submit(%(p)stotal, *client.map(%(p)sinc, [a, b, %(r)d]))",
        "client.submit(%(p)sinc, client.submit(%(p)stotal, [a, b]))",
    ]
    for i, form in enumerate(rng.sample(forms, rng.randint(1, 3))):
        st.do("c%d = %s" % (i, form % {"p": p, "r": rng.randint(0, 9)}))
        st.obs("c%d" % i, "c%d.result(timeout=T)" % i)
    if rng.random() < 0.5:
        st.do("m = client.map(%sinc, [a, b, %d])" % (p, rng.randint(0, 9)))
        st.obs("map", "client.gather(ready(m))")
    st.do("note_reused(%r, [a, b])" % st.label("calls"))
    st.reuse[st.label("calls")] = False


def gen_global_change(rng, st):
    p, P = st.p, st.P
    v1, v2 = rng.sample(range(2, 20), 2)
    x = rng.randint(1, 9)
    how = rng.choice(["rebind", "mutate"])
    if how == "rebind":
        st.define(
            """
            %(P)sSCALE = %(v1)d


            def %(p)sscaled(x):
                return x * %(P)sSCALE
            """
            % locals()
        )
        # A global rebound in the step's function.
        st.body.append("global %sSCALE" % P)
        change = "%sSCALE = %d" % (P, v2)
    else:
        st.define(
            """
            %(P)sCONF = {"k": %(v1)d}


            def %(p)sscaled(x):
                return x * %(P)sCONF["k"]
            """
            % locals()
        )
        change = '%sCONF["k"] = %d' % (P, v2)
    as_map = rng.random() < 0.4
    call = ("client.map(%sscaled, [%d, %d])" % (p, x, x + 1)) if as_map else ("client.submit(%sscaled, %d)" % (p, x))
    value = "client.gather(ready(%s))" if as_map else "%s.result(timeout=T)"
    st.do("f = %s" % call)
    st.obs("before", value % "f")
    if rng.random() < 0.5:
        st.do("del f\npause()")
    st.do(change)
    st.do("g = %s" % call)
    st.obs("after", value % "g")


def gen_file_reread(rng, st):
    p = st.p
    path = "data/%sin.txt" % p
    tag = rng.randint(100, 999)
    st.files[path] = "A-%d" % tag
    st.files2[path] = "A2-%d" % tag
    st.define(
        """
        def %sread(path):
            with open(path) as f:
                return f.read()
        """
        % p
    )
    st.do("f = client.submit(%sread, %r)" % (p, path))
    st.obs("first", "f.result(timeout=T)", volatile=True)
    drop = rng.random() < 0.75
    if drop:
        # Dropped: Dask forgets the value and reads the file again.
        st.do("del f")
    st.do("pause()\nwrite(%r, %r)" % (path, "B-%d" % tag))
    st.do("g = client.submit(%sread, %r)" % (p, path))
    # Held: the same call is the same future, with the old content.
    st.obs("second", "g.result(timeout=T)", volatile=True)


def gen_random(rng, st):
    p = st.p
    st.define(
        """
        def %(p)sdraw(x):
            return random.random()


        def %(p)snpdraw(x):
            return np.random.rand(3).tolist()
        """
        % {"p": p}
    )
    fn = rng.choice(["draw", "npdraw"])
    f = p + fn
    x, y = rng.sample(range(10), 2)
    checks = {
        # Dask: the same pure call is the same future, the same value.
        "same_args": "a = client.submit(%s, %d)\nb = client.submit(%s, %d)" % (f, x, f, x),
        "impure": "a = client.submit(%s, %d, pure=False)\nb = client.submit(%s, %d, pure=False)" % (f, x, f, x),
        "other_args": "a = client.submit(%s, %d)\nb = client.submit(%s, %d)" % (f, x, f, y),
        "dropped": "a = client.submit(%s, %d)\nav = a.result(timeout=T)\ndel a\npause()\nb = client.submit(%s, %d)" % (f, x, f, x),
    }
    for name in rng.sample(sorted(checks), rng.randint(1, 3)):
        st.do(checks[name])
        first = "av" if name == "dropped" else "a.result(timeout=T)"
        st.obs(name + "_equal", "%s == b.result(timeout=T)" % first, volatile=True)
    if rng.random() < 0.4:
        st.do("fs = client.map(%s, range(4))" % f)
        st.obs("map_distinct", "len({repr(v) for v in client.gather(ready(fs))})", volatile=True)


_EXCS = [
    ("ValueError", 'raise ValueError("solver diverged at step %d" % x)'),
    ("KeyError", 'return {}["k%d" % x]'),
    ("ZeroDivisionError", "return x / (x - x)"),
    ("custom", 'raise %(P)sError("bad input %d" % x)'),
    ("TypeError", "return len(x)"),
    ("AssertionError", 'assert x < 0, "x=%d" % x'),
    ("RuntimeError", 'raise RuntimeError("nope: " + str(x))'),
]


def gen_exception(rng, st):
    p, P = st.p, st.P
    kind, line = rng.choice(_EXCS)
    bad = sorted(rng.sample(range(8), rng.randint(1, 6)))
    st.define(
        """
        class %(P)sError(Exception):
            pass


        def %(p)sinc(x):
            return x + 1


        def %(p)sfail(x):
            if x in %(bad)r:
                %(line)s
            return x * 2
        """
        % {"p": p, "P": P, "bad": bad, "line": line.replace("%(P)s", P)}
    )
    st.do("f = client.submit(%sfail, %d)" % (p, bad[0]))
    st.obs("submit", "f.result(timeout=T)")
    st.obs("exception", "exc_of(f.exception(timeout=T))")
    st.obs("status", "f.status")
    if kind == "custom":
        st.obs("isinstance", "isinstance(f.exception(timeout=T), %sError)" % P)
    if rng.random() < 0.6:
        st.do("g = client.submit(%sinc, f)" % p)
        st.obs("dependent", "g.result(timeout=T)")
    if rng.random() < 0.7:
        st.do("fs = client.map(%sfail, range(8))" % p)
        st.obs("map", "[exc_of(x.exception(timeout=T)) for x in ready(fs)]")
        st.obs("gather_skip", "client.gather(fs, errors='skip')")
        st.obs("gather", "one_of(lambda: client.gather(fs), fs)")


def gen_cancel(rng, st):
    p = st.p
    flag = "flags/%sopen" % p
    st.define(
        """
        def %(p)sgate(flag, limit):
            t = time.time()
            while not os.path.exists(flag) and time.time() - t < limit:
                time.sleep(0.01)
            return "opened"


        def %(p)safter(x, k):
            return (x, k)
        """
        % {"p": p}
    )
    st.do("g = client.submit(%sgate, %r, %r)" % (p, flag, GATE_S))
    if rng.random() < 0.5:
        st.do("c = client.submit(%safter, g, 1)" % p)
        st.do("d = client.submit(%safter, c, 2)" % p)
        st.do("q = client.submit(%safter, g, 3)" % p)
    else:
        n = rng.randint(2, 4)
        j = rng.randrange(n)
        st.do("fs = client.map(%safter, [g] * %d, range(%d))" % (p, n, n))
        st.do("c = fs[%d]\nq = fs[%d]" % (j, (j + 1) % n))
        st.do("d = client.submit(%safter, c, 2)" % p)
    st.do("c.cancel()\nuntil(c.cancelled)")
    st.obs("cancelled", "c.cancelled()")
    st.obs("status", "c.status")
    st.obs("done", "c.done()")
    st.do("write(%r, 'go')" % flag)
    st.obs("gate", "g.result(timeout=T)")
    st.obs("pending", "c.result(timeout=T)")
    st.obs("dependent", "d.result(timeout=T)")
    st.obs("sibling", "q.result(timeout=T)")


def gen_cancel_done(rng, st):
    p = st.p
    st.define("def %sinc(x):\n    return x + 1" % p)
    st.do("h = client.submit(%sinc, %d)" % (p, rng.randint(0, 9)))
    st.obs("value", "h.result(timeout=T)")
    st.do("h.cancel()\nuntil(lambda: h.status != 'finished', 0.3)")
    st.obs("status", "h.status")
    st.obs("after", "h.result(timeout=T)")


def _nested(rng, names, depth=0):
    r = rng.random()
    if depth >= 2 or r < 0.35:
        return rng.choice(names) if rng.random() < 0.8 else repr(rng.choice([5, "x", None, 2.5]))
    items = [_nested(rng, names, depth + 1) for _ in range(rng.randint(1, 3))]
    if r < 0.6:
        return "[%s]" % ", ".join(items)
    if r < 0.8:
        return "(%s,)" % ", ".join(items)
    return "{%s}" % ", ".join("%r: %s" % ("k%d" % i, v) for i, v in enumerate(items))


def gen_gather_nested(rng, st):
    p = st.p
    st.define("def %sinc(x):\n    return x + 1" % p)
    n = rng.randint(2, 5)
    st.do("fs = [client.submit(%sinc, i) for i in range(%d, %d)]" % (p, 10 * st.n, 10 * st.n + n))
    names = ["fs[%d]" % i for i in range(n)]
    for i in range(rng.randint(1, 3)):
        st.obs("gather%d" % i, "client.gather(ready(%s))" % _nested(rng, names))
    st.obs("one", "client.gather(fs[0])")


def gen_as_completed(rng, st):
    p = st.p
    st.define("def %sinc(x):\n    return x + 1" % p)
    n = rng.randint(2, 6)
    st.do("fs = ready(client.map(%sinc, range(%d)))" % (p, n))
    st.obs("sorted", "sorted(f.result() for f in as_completed(fs))")
    st.obs("with_results", "sorted(v for _, v in as_completed(fs, with_results=True))")
    st.obs("wait", "(len(wait(fs, timeout=T).done), len(wait(fs, timeout=T).not_done))")
    if rng.random() < 0.5:
        st.do(
            """
            ac = as_completed([ready(client.submit(%sinc, 100))])
            got = []
            for f in ac:
                got.append(f.result())
                if len(got) == 1:
                    ac.add(ready(client.submit(%sinc, 200)))
            """
            % (p, p)
        )
        st.obs("added", "got")


def gen_scatter(rng, st):
    p = st.p
    st.define(
        """
        def %(p)sinc(x):
            return x + 1


        def %(p)stotal(xs):
            if isinstance(xs, dict):
                return sum(xs.values())
            return int(sum(xs))
        """
        % {"p": p}
    )
    n = rng.randint(3, 9)
    broadcast = ", broadcast=True" if rng.random() < 0.3 else ""
    form = rng.choice(["array", "list", "dict", "text"])
    if form == "array":
        st.do("x = client.scatter(np.arange(%d)%s)" % (n, broadcast))
        st.obs("sum", "client.submit(%stotal, x).result(timeout=T)" % p)
        st.obs("back", "x.result(timeout=T)")
    elif form == "list":
        st.do("xs = client.scatter(list(range(%d))%s)" % (n, broadcast))
        st.obs("type", "type(xs).__name__")
        st.obs("map", "client.gather(ready(client.map(%sinc, xs)))" % p)
        st.obs("sum", "client.submit(%stotal, xs).result(timeout=T)" % p)
    elif form == "dict":
        st.do("d = client.scatter({'a': %d, 'b': %d}%s)" % (n, n + 1, broadcast))
        st.obs("keys", "sorted(d)")
        st.obs("sum", "client.submit(%stotal, d).result(timeout=T)" % p)
    else:
        st.do("s = client.scatter(%r%s)" % ("text " * n, broadcast))
        st.obs("len", "client.submit(len, s).result(timeout=T)")
        st.obs("back", "s.result(timeout=T)")


def _graph(rng, st):
    p = st.p
    st.define(
        """
        def %(p)sinc(x):
            return x + 1


        def %(p)sadd(x, y):
            return x + y
        """
        % {"p": p}
    )
    n = rng.randint(2, 8)
    st.do(
        """
        a = dask.delayed(%(p)sinc)(%(r)d)
        b = dask.delayed(%(p)sadd)(a, %(s)d)
        xs = [dask.delayed(%(p)sinc)(i) for i in range(%(n)d)]
        t = dask.delayed(sum)(xs + [b])
        """
        % {"p": p, "r": rng.randint(0, 9), "s": rng.randint(0, 9), "n": n}
    )


def gen_delayed_get(rng, st):
    _graph(rng, st)
    st.obs("compute", "dask.compute(t, b, scheduler=client.get)")
    st.obs("method", "t.compute(scheduler=client.get)")
    if rng.random() < 0.5:
        st.obs("many", "dask.compute(*xs, scheduler=client.get)")


def gen_delayed_compute(rng, st):
    _graph(rng, st)
    st.obs("future", "client.compute(t).result(timeout=T)")
    st.obs("list", "client.gather(ready(client.compute([a, b])))")
    if rng.random() < 0.5:
        st.obs("persist", "dask.compute(client.persist(t), scheduler=client.get)")


def gen_bag(rng, st):
    p = st.p
    st.define(
        """
        def %(p)sinc(x):
            return x + 1


        def %(p)seven(x):
            return x %% 2 == 0
        """
        % {"p": p}
    )
    n = rng.randint(3, 12)
    st.do("bag = db.from_sequence(list(range(%d)), npartitions=%d).map(%sinc).filter(%seven)" % (n, rng.randint(1, 3), p, p))
    st.obs("sum", "bag.sum().compute(scheduler=client.get)")
    st.obs("items", "bag.compute(scheduler=client.get)")


def gen_helper_import(rng, st):
    p = st.p
    v = rng.randint(1, 5)
    how = rng.choice(["inner", "top", "top_used"])
    ms = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
    if how == "inner":
        # Imported inside the function, where it runs.
        st.define(
            """
            def %(p)skinetic(m):
                from physics import energy

                return energy(m, %(v)d)
            """
            % locals()
        )
        st.do("fs = client.map(%skinetic, %r)" % (p, ms))
    elif how == "top":
        # The module's own function, given to map.
        st.top_physics = True
        st.do("fs = client.map(physics.potential, %r, %r)" % (ms, [v] * len(ms)))
    else:
        # A function of the script using the module imported at its top.
        st.top_physics = True
        st.define(
            """
            def %(p)sboth(m):
                return physics.energy(m, %(v)d) + physics.potential(m, 1)
            """
            % locals()
        )
        st.do("fs = client.map(%sboth, %r)" % (p, ms))
    st.obs("values", "client.gather(ready(fs))")


def gen_write_file(rng, st):
    p = st.p
    st.define(
        """
        def %(p)swrite(i, text):
            os.makedirs("written", exist_ok=True)
            path = os.path.join("written", "%(p)s%%d.txt" %% i)
            with open(path, "w") as f:
                f.write(text)
            return path
        """
        % {"p": p}
    )
    n = rng.randint(1, 3)
    texts = ["%s line %d\n" % (_word(rng), rng.randint(0, 99)) for _ in range(n)]
    st.do("fs = client.map(%swrite, range(%d), %r)" % (p, n, texts))
    st.obs("paths", "client.gather(ready(fs))")
    st.obs("read", "[open(path).read() for path in client.gather(fs)]", volatile=True)


def gen_rerun(rng, st):
    p = st.p
    path = "rerun/%sin.txt" % p
    tag = rng.randint(100, 999)
    st.files[path] = "run1-%d" % tag
    st.files2[path] = "run2-%d" % tag
    st.define(
        """
        def %(p)sread(path):
            with open(path) as f:
                return f.read()


        def %(p)sdraw(x):
            return random.random()


        def %(p)snow():
            return time.time()
        """
        % {"p": p}
    )
    st.do("f = client.submit(%sread, %r)" % (p, path))
    st.obs("read", "f.result(timeout=T)", volatile=True)
    st.do("r = client.submit(%sdraw, %d)" % (p, rng.randint(0, 9)))
    st.obs("draw", "r.result(timeout=T)", random_value=True)
    st.do("w = client.submit(%snow)" % p)
    st.obs("now", "w.result(timeout=T)", random_value=True)
    st.do("note_reused(%r, [f, r, w])" % st.label("calls"))
    st.reuse[st.label("calls")] = False


def gen_resume(rng, st):
    p = st.p
    st.define(
        """
        def %(p)ssquare(x):
            return x * x


        def %(p)stotal(xs):
            return sum(xs)
        """
        % {"p": p}
    )
    n = rng.randint(2, 6)
    st.do("fs = client.map(%ssquare, range(%d, %d))" % (p, st.session, st.session + n))
    st.obs("values", "client.gather(ready(fs))")
    st.do("c = client.submit(%stotal, fs)" % p)
    st.obs("total", "c.result(timeout=T)")
    st.do("note_reused(%r, fs + [c])" % st.label("calls"))
    st.reuse[st.label("calls")] = True


def gen_node_killed(rng, st):
    p = st.p
    k = rng.randint(1, 99)
    st.define(
        """
        def %(p)sslow(x):
            time.sleep(0.25)
            return x * x + %(k)d
        """
        % {"p": p, "k": k}
    )
    n = rng.randint(6, 10)
    st.do("fs = client.map(%sslow, range(%d))" % (p, n))
    st.do("until(lambda: sum(f.done() for f in fs) >= 2)")
    st.do("kill_a_node(client)")
    st.obs("values", "client.gather(fs)")
    st.do("t = client.submit(sum, fs)")
    st.obs("total", "t.result(timeout=T)")


GENERATORS = {k: globals()["gen_" + k] for k in KINDS}


def generate(seed, index, kinds=None):
    """Session ``index`` of ``seed``: 2 to 5 steps of the ``kinds`` enabled."""
    kinds = list(kinds or KINDS)
    rng = random.Random("%s-%d" % (seed, index))
    steps = []
    for n in range(1, rng.randint(2, 5) + 1):
        st = Step(rng.choice(kinds), index, n)
        GENERATORS[st.kind](rng, st)
        steps.append(st)
    return Session(seed, index, steps)


# ---------------------------------------------------------------------------
# Scripts.


def render(sessions, backend, inline_files=False):
    """The script of ``sessions`` for a backend (``dask`` or a mesh mode).

    ``inline_files``: the script writes its data files and helper module
    itself (a reproduction, one file): the first run's content, and the
    second's when run again (and removes what the first wrote)."""
    imports, with_client = CLIENTS[backend]
    seeds = sorted({str(s.seed) for s in sessions})
    out = [
        '"""Session%s %s of seed %s of the differential test against Dask (python/tests/dask_diff.py), with %s."""'
        % ("s" if len(sessions) > 1 else "", ", ".join(str(s.index) for s in sessions), ", ".join(seeds), backend),
        "import asyncio",
        "import concurrent.futures",
        "import json",
        "import os",
        "import random",
        "import sys",
        "import time",
        "",
        "import dask",
        "import dask.bag as db",
        "import numpy as np",
        "",
        imports,
    ]
    if inline_files:
        out += ["", "# This script's files: the first run's, and the second's when run again.", "FILES = %r" % _files_of(sessions)]
        if any(st.kind == "helper_import" for s in sessions for st in s.steps):
            out += ["if not os.path.exists('physics.py'):", "    with open('physics.py', 'w') as f:", "        f.write(%r)" % PHYSICS]
        out += [
            "_again = os.path.exists('.ran-once')",
            "if __name__ == '__main__':",
            "    for _path, (_first, _second) in FILES.items():",
            "        os.makedirs(os.path.dirname(_path) or '.', exist_ok=True)",
            "        with open(_path, 'w') as f:",
            "            f.write(_second if _again else _first)",
            "    if _again:",
            "        import shutil",
            "        shutil.rmtree('written', ignore_errors=True)",
            "    open('.ran-once', 'w').close()",
        ]
    if any(st.top_physics for s in sessions for st in s.steps):
        out += ["", "import physics"]
    out += ["", PRELUDE % {"wait": WAIT_S, "pause": PAUSE_S}]
    if any(st.kind == "node_killed" for s in sessions for st in s.steps):
        out += ["", KILLERS.get(backend, KILLERS_NONE)]
    for s in sessions:
        for st in s.steps:
            out += ["", "# session %d, step %d: %s" % (s.index, st.n, st.kind)]
            for d in st.defs:
                out += ["", d, ""]
            out += ["", "def session_%d_step_%d(client):" % (s.index, st.n)]
            out += ["    " + line if line else "" for line in st.body] or ["    pass"]
            out.append("")
        out += ["", "def session_%d(client):" % s.index, "    t0 = time.monotonic()"]
        for st in s.steps:
            out.append("    step(%r, session_%d_step_%d, client)" % ("%s.%d" % (st.kind, st.n), s.index, st.n))
        out += ["    session_done(%d, t0)" % s.index, ""]
    out += [
        "",
        "SESSIONS = [%s]" % ", ".join("session_%d" % s.index for s in sessions),
        "",
        "if __name__ == \"__main__\":",
        "    " + with_client,
    ]
    if backend == "apart" and any(st.kind == "helper_import" for s in sessions for st in s.steps):
        # On nodes that do not see the script's folder, as on a Dask
        # cluster of other machines: the helper module is shipped.
        out.append("        client.upload_file('physics.py')")
    out += [
        "        for session in SESSIONS:",
        "            session(client)",
        "",
    ]
    text = "\n".join(out)
    # Blank lines runs of more than two, from the pieces' own.
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    return text


def _files_of(sessions):
    first = {}
    for s in sessions:
        first.update(s.files(1))
    second = {}
    for s in sessions:
        second.update(s.files(2))
    return {k: (first[k], second.get(k, first[k])) for k in sorted(first)}


def lay_out(folder, sessions, backend):
    """A folder as a user has it: the script, the helper module, the data."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "session.py"), "w") as f:
        f.write(render(sessions, backend))
    with open(os.path.join(folder, "physics.py"), "w") as f:
        f.write(PHYSICS)
    put_files(folder, sessions, 1)


def put_files(folder, sessions, run):
    """The data files of run ``run``; before a second run, what the first
    wrote is removed (as a user clears the outputs before running again)."""
    if run > 1:
        shutil.rmtree(os.path.join(folder, "written"), ignore_errors=True)
        shutil.rmtree(os.path.join(folder, "flags"), ignore_errors=True)
    for s in sessions:
        for path, text in s.files(run).items():
            full = os.path.join(folder, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)


def written(folder):
    """The files the calls wrote: name -> content."""
    out = {}
    d = os.path.join(folder, "written")
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            try:
                with open(os.path.join(d, name), errors="replace") as f:
                    out[name] = f.read()
            except OSError as e:
                out[name] = "<%s>" % e
    return out


# ---------------------------------------------------------------------------
# Running a script.


class ScriptRun:
    """What one run of a script gave: its records by session, the files its
    calls wrote, how it ended."""

    def __init__(self, records, files, rc, stderr, seconds, killed):
        self.records = records
        self.files = files
        self.rc = rc
        self.stderr = stderr
        self.seconds = seconds
        self.killed = killed
        #: Dask's record read from the cache (see cache_dir), not run.
        self.cached = False

    def why_missing(self):
        if self.killed:
            return "the script was killed after %.0f s (no record of this session): %s" % (self.seconds, _tail(self.stderr, 600))
        return "the script ended with code %s before this session's record: %s" % (self.rc, _tail(self.stderr, 600))


def _tail(text, n):
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def script_env(extra=None):
    env = dict(os.environ)
    for v in ("MESH_ADDR", "MESH_KEY", "MESH_STATE_DIR"):
        env.pop(v, None)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # The same on both sides: numpy's threads one per call (2 cores here).
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[v] = "1"
    env["DASK_LOGGING__DISTRIBUTED"] = "error"
    env.update(extra or {})
    return env


def run_script(folder, env, timeout):
    """``python session.py`` in ``folder``, in a process group of its own
    (its Dask workers, its mesh.local node), all of which is gone after."""
    t0 = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "session.py"],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    killed = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = True
        _kill_group(p.pid)
        out, err = p.communicate()
    finally:
        # What the script left running (a worker it did not stop).
        _kill_group(p.pid)
    records = {}
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith("@@DIFF "):
            try:
                r = json.loads(line[len("@@DIFF ") :])
            except ValueError:
                continue
            records[r["session"]] = r
    return ScriptRun(records, written(folder), p.returncode, err.decode("utf-8", "replace"), time.monotonic() - t0, killed)


def cache_dir():
    """Where Dask's records are kept by their script's hash: a session's
    script gives Dask's same record every time (``--self-check`` says so),
    so a second run of the test runs mesh's scripts only.
    ``$MESH_DIFF_CACHE`` (``off``: none), else the cargo target folder's
    ``dask-diff-cache``."""
    d = os.environ.get("MESH_DIFF_CACHE")
    if d == "off":
        return None
    if d:
        return d
    return os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"), "dask-diff-cache")


def _reference_key(folder, sessions, run):
    import hashlib

    import dask
    import distributed
    import numpy

    h = hashlib.sha256()
    with open(os.path.join(folder, "session.py"), "rb") as f:
        h.update(f.read())
    h.update(PHYSICS.encode())
    h.update(json.dumps([run, sorted(_files_of(sessions).items()), dask.__version__, distributed.__version__, numpy.__version__, sys.version]).encode())
    return h.hexdigest()


def dask_run(folder, sessions, run, env, timeout):
    """The Dask script's run ``run``: from the cache where it ran before."""
    cache = cache_dir()
    path = None
    if cache:
        path = os.path.join(cache, _reference_key(folder, sessions, run) + ".json")
        try:
            with open(path) as f:
                c = json.load(f)
            r = ScriptRun({int(k): v for k, v in c["records"].items()}, c["files"], c["rc"], c["stderr"], 0.0, False)
            r.cached = True
            return r
        except (OSError, ValueError, KeyError):
            pass
    r = run_script(folder, env, timeout)
    if path and r.rc == 0 and not r.killed and len(r.records) == len(sessions):
        os.makedirs(cache, exist_ok=True)
        tmp = "%s.%d.part" % (path, os.getpid())
        with open(tmp, "w") as f:
            json.dump({"records": r.records, "files": r.files, "rc": r.rc, "stderr": _tail(r.stderr, 2000)}, f)
        os.replace(tmp, path)
    return r


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------------------
# Comparing.


class Difference:
    def __init__(self, mode, session, kind, label, dask, mesh, run=1, note=None):
        self.mode = mode
        self.session = session
        self.kind = kind
        self.label = label
        self.dask = dask
        self.mesh = mesh
        self.run = run
        self.note = note

    def n(self):
        """The step the label is of: its number, else the first step of its
        kind (None: none)."""
        parts = self.label.split(".")
        if len(parts) > 1 and parts[1].isdigit():
            return int(parts[1])
        return next((st.n for st in self.session.steps if st.kind == self.kind), None)

    def words(self, width=None):
        run = " (run %d)" % self.run if self.run > 1 else ""
        if self.note:
            text = "%s%s: %s" % (self.label, run, self.note)
        else:
            text = "%s%s: dask %s, mesh %s" % (self.label, run, _short(self.dask), _short(self.mesh))
        if width and len(text) > width:
            text = text[: width - 3] + "..."
        return text


def _short(v, n=160):
    s = "<none>" if v is None else json.dumps(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _kind_of(label):
    return label.split(".", 1)[0]


def compare(mode, session, dask_runs, mesh_runs):
    """The differences of one session: its records (and files written) of
    each run, mesh's against Dask's, and across the runs."""
    diffs = []
    documented = {st for st in session.steps if st.kind in DOCUMENTED.get(mode, ())}
    volatile = session.volatile if mode in RESUMING else set().union(*[st.volatile for st in documented])
    recs = []
    for run, (d, m) in enumerate(zip(dask_runs, mesh_runs), 1):
        dr = d.records.get(session.index)
        mr = m.records.get(session.index)
        recs.append((dr, mr))
        session.records[(mode, run)] = (dr, mr)
        if dr is None:
            # Not Dask's to judge: the harness says so (see check_reference).
            diffs.append(Difference(mode, session, "(dask)", "(dask)", None, None, run, "Dask gave no record: " + d.why_missing()))
            continue
        if mr is None:
            why = m.why_missing()
            for k in session.kinds:
                diffs.append(Difference(mode, session, k, k, None, None, run, why))
            continue
        do, mo = dr["obs"], mr["obs"]
        labels = sorted(set(do) | set(mo), key=lambda l: (not l.endswith(".raised"), l))
        for label in labels:
            if label in volatile:
                continue
            dv, mv = do.get(label), mo.get(label)
            if dv is not None and mv is not None and dv[0] == mv[0] == "random":
                continue
            if dv != mv:
                diffs.append(Difference(mode, session, _kind_of(label), label, dv, mv, run))
        if mode not in RESUMING and "write_file" not in DOCUMENTED.get(mode, ()) and any(st.kind == "write_file" for st in session.steps):
            mine = "s%d_" % session.index
            df = {k: v for k, v in d.files.items() if k.startswith(mine)}
            mf = {k: v for k, v in m.files.items() if k.startswith(mine)}
            if df != mf:
                diffs.append(Difference(mode, session, "write_file", "write_file.files", df, mf, run))
    if mode == "killed" and recs and recs[0][1] is not None:
        # The run after a killed one: nothing from the killed run's calls.
        for st in session.steps:
            for label in st.reuse:
                got = recs[0][1].get("meta", {}).get(label)
                if got and any(got):
                    diffs.append(Difference(mode, session, st.kind, label, None, got, 1, "without resume=True, %d of %d calls came from the killed run (reused: %s)" % (got.count(True), len(got), got)))
    if len(recs) == 2 and all(r is not None for pair in recs for r in pair):
        (d1, m1), (d2, m2) = recs
        # Random values: the second run's against the first's.
        for label, dv in d2["obs"].items():
            if dv[0] != "random" or mode == "resume":
                continue
            a, b = d1["obs"].get(label), m1["obs"].get(label)
            mv = m2["obs"].get(label)
            if a is None or b is None or mv is None or b[0] != "random" or mv[0] != "random":
                continue
            dsame, msame = a == dv, b == mv
            if dsame != msame:
                diffs.append(
                    Difference(
                        mode, session, _kind_of(label), label + "@run2", None, None, 2,
                        "Dask's second run gave %s value, mesh's %s (%s, then %s)" % (
                            "the same" if dsame else "another", "the same" if msame else "another", b[1], mv[1]),
                    )
                )
        # Values kept across runs: only asked for (resume=True).
        for st in session.steps:
            for label, want in st.reuse.items():
                got = m2.get("meta", {}).get(label)
                if got is None:
                    continue
                if mode == "resume" and want and not all(got):
                    diffs.append(Difference(mode, session, st.kind, label + "@run2", None, got, 2, "resume=True ran again %d of %d calls of the run before (reused: %s)" % (got.count(False), len(got), got)))
                if mode == "connect" and any(got):
                    diffs.append(Difference(mode, session, st.kind, label + "@run2", None, got, 2, "without resume=True, %d of %d calls came from the run before (reused: %s)" % (got.count(True), len(got), got)))
    return diffs


class Tally:
    """Per mode and step kind: sessions compared, equal, and differences."""

    def __init__(self):
        self.rows = collections.OrderedDict()
        self.diffs = []
        self.seconds = collections.Counter()
        self.sessions = collections.Counter()

    def add(self, mode, session, diffs):
        self.sessions[mode] += 1
        self.diffs.extend(diffs)
        by_kind = collections.defaultdict(list)
        for d in diffs:
            by_kind[d.kind].append(d)
        for k in session.kinds:
            row = self.rows.setdefault((mode, k), {"compared": 0, "equal": 0, "differ": 0, "first": None})
            row["compared"] += 1
            if by_kind.get(k):
                row["differ"] += 1
                if row["first"] is None:
                    row["first"] = by_kind[k][0]
            else:
                row["equal"] += 1
        for k in by_kind:
            if k not in session.kinds:
                # A label of no step (the reference's own failure).
                row = self.rows.setdefault((mode, k), {"compared": 0, "equal": 0, "differ": 0, "first": None})
                row["differ"] += 1
                row["first"] = row["first"] or by_kind[k][0]

    def merge(self, other):
        for key, r in other.rows.items():
            row = self.rows.setdefault(key, {"compared": 0, "equal": 0, "differ": 0, "first": None})
            for f in ("compared", "equal", "differ"):
                row[f] += r[f]
            row["first"] = row["first"] or r["first"]
        self.diffs.extend(other.diffs)
        self.seconds.update(other.seconds)
        self.sessions.update(other.sessions)

    def table(self, width=150):
        lines = []
        modes = [m for m in MODES if any(k[0] == m for k in self.rows)]
        for mode in modes:
            lines.append("")
            lines.append("mode %s: %d sessions, %.0f s" % (mode, self.sessions[mode], self.seconds[mode]))
            lines.append("  %-16s %8s %6s %7s  %s" % ("step kind", "compared", "equal", "differ", "first difference (session: label: what)"))
            for k in KINDS + sorted({k for m, k in self.rows if k not in KINDS}):
                r = self.rows.get((mode, k))
                if r is None:
                    continue
                first = ""
                if r["first"] is not None:
                    first = "s%d: %s" % (r["first"].session.index, r["first"].words())
                    first = first if len(first) <= width - 45 else first[: width - 48] + "..."
                lines.append("  %-16s %8d %6d %7d  %s" % (k, r["compared"], r["equal"], r["differ"], first))
        return "\n".join(lines)

    def firsts(self):
        return [(key, r["first"]) for key, r in self.rows.items() if r["first"] is not None]


def reproduction(d, batch=None):
    """A difference's own script: its session with only the step it is of,
    which writes its own files; with how to run it (and, given the batch
    size, how to run the whole script it was found in: a difference that
    depends on what ran before shows there only)."""
    n = d.n()
    s = d.session.alone(n) if n is not None and any(st.n == n for st in d.session.steps) else d.session
    backend = d.mode
    how = {
        "local": "python session.py",
        "connect": "a node running (mesh node &), then: python session.py; python session.py",
        "resume": "a node running (mesh node &), then: python session.py; python session.py",
        "apart": "mesh.connect() to the first of 3 nodes, two of which do not see this folder; python session.py",
        "killed": "a node running (mesh node &), then: timeout -s KILL %s python session.py; python session.py" % KILL_AFTER_S,
        "killed_resume": "a node running (mesh node &), then: timeout -s KILL %s python session.py; python session.py" % KILL_AFTER_S,
    }[backend]
    head = "# seed %s, session %d, mode %s: %s\n# run, in an empty folder, with PYTHONPATH=%s MESH_BIN=<the mesh binary>: %s\n# (the Dask script differs in its client's lines: %s)\n" % (
        d.session.seed, d.session.index, d.mode, d.words(), os.path.join(REPO, "python"), how, CLIENTS["dask"][1])
    if batch:
        first = d.session.index // batch * batch
        head += "# found in the script of sessions %d-%d: MESH_DIFF_SEED=%s MESH_DIFF_BATCH=%d MESH_DIFF_ONLY=%d-%d runs it again\n" % (
            first, first + batch - 1, d.session.seed, batch, first, first + batch - 1)
    return s, head + render([s], backend, inline_files=True)


# ---------------------------------------------------------------------------
# The meshes the modes run against.


class Meshes:
    """The nodes of the connect, resume and apart modes: started at the
    first need, stopped by :meth:`stop`."""

    def __init__(self, root):
        self.root = root
        self.connect_node = None
        self.apart_nodes = None
        self.apart_root = os.path.join(root, "apart")
        os.makedirs(self.apart_root, exist_ok=True)

    def state_dir(self, mode):
        import nodes

        if mode in ("connect", "resume") + KILLED:
            if self.connect_node is None:
                self.connect_node = nodes.start(cpus=2)
            return self.connect_node.state_dir
        if mode == "apart":
            if self.apart_nodes is None:
                if not nodes.apart_possible():
                    raise Unavailable("mode apart needs root and `unshare -m` (nodes in mount namespaces of their own, which do not see the client's folder)")
                first = nodes.start(cpus=1)
                got = [first]
                try:
                    for _ in range(2):
                        got.append(nodes.start(cpus=1, join=first, hide=[first.state_dir, self.apart_root]))
                    if not nodes.wait_until(lambda: len(first.status()["nodes"]) == 3):
                        raise RuntimeError("3 nodes apart did not form one mesh: %s" % first.status()["nodes"])
                except BaseException:
                    for n in got:
                        n.stop()
                    raise
                self.apart_nodes = got
            return self.apart_nodes[0].state_dir
        return None

    def victims(self, mode):
        """The pids of the nodes a ``node_killed`` step may kill: in mode
        apart, the two that are not the client's."""
        if mode != "apart" or not self.apart_nodes:
            return ""
        return " ".join(str(n.proc.pid) for n in self.apart_nodes[1:])

    def heal(self, mode):
        """Starts a node in place of each the script killed."""
        import nodes

        if mode != "apart" or not self.apart_nodes:
            return 0
        first = self.apart_nodes[0]
        started = 0
        for i, n in enumerate(self.apart_nodes):
            if i == 0 or n.proc.poll() is None:
                continue
            started += 1
            try:
                n.stop()
            except Exception:
                pass
            self.apart_nodes[i] = nodes.start(cpus=1, join=first, hide=[first.state_dir, self.apart_root])
        if not nodes.wait_until(lambda: len(first.status()["nodes"]) == 3):
            raise RuntimeError("the node started in place of a killed one did not join: %s" % first.status()["nodes"])
        return started

    def folder(self, mode, name):
        return os.path.join(self.apart_root if mode == "apart" else self.root, name)

    def stop(self):
        for n in ([self.connect_node] if self.connect_node else []) + (self.apart_nodes or []):
            try:
                n.stop()
            except Exception:
                pass
        self.connect_node = None
        self.apart_nodes = None


class Unavailable(Exception):
    """A mode that cannot run here (skipped, saying why)."""


# ---------------------------------------------------------------------------
# The whole: sessions in batches, each batch in a mode.


def settings_from_env(sessions=200, seed=61):
    """The test's settings: MESH_DIFF_SESSIONS, MESH_DIFF_SEED,
    MESH_DIFF_KINDS (comma-separated, default all), MESH_DIFF_MODES,
    MESH_DIFF_BATCH (sessions per script), MESH_DIFF_ONLY (session
    indices), MESH_DIFF_KEEP (a folder to keep the scripts in)."""
    e = os.environ
    kinds = [k.strip() for k in e.get("MESH_DIFF_KINDS", "").split(",") if k.strip()] or list(KINDS)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError("MESH_DIFF_KINDS: no step kind %s (kinds: %s)" % (", ".join(bad), ", ".join(KINDS)))
    modes = [m.strip() for m in e.get("MESH_DIFF_MODES", "").split(",") if m.strip()] or list(MODES)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError("MESH_DIFF_MODES: no mode %s (modes: %s)" % (", ".join(bad), ", ".join(MODES)))
    only = parse_only(e.get("MESH_DIFF_ONLY", ""))
    return {
        "sessions": int(e.get("MESH_DIFF_SESSIONS", sessions)),
        "seed": e.get("MESH_DIFF_SEED", str(seed)),
        "kinds": kinds,
        "modes": modes,
        "batch": int(e.get("MESH_DIFF_BATCH", 25)),
        "only": only,
        "keep": e.get("MESH_DIFF_KEEP") or None,
    }


def parse_only(text):
    """Session indices: ``17,42`` or ``25-49`` (both ends in), or both."""
    out = []
    for part in text.replace(",", " ").split():
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return sorted(set(out))


def mode_of(index, batch, modes):
    """The mode session ``index`` runs in: batches of ``batch`` in turn."""
    return modes[(index // batch) % len(modes)]


def batches(seed, count, kinds, modes, batch, only=(), every_mode=False):
    """``[(mode, [Session])]``: each script's sessions and its mode."""
    indices = list(only) if only else list(range(count))
    by = collections.OrderedDict()
    for i in indices:
        for m in modes if every_mode else [mode_of(i, batch, modes)]:
            by.setdefault((m, i // batch), []).append(i)
    out = []
    for (m, _), idx in by.items():
        out.append((m, [generate(seed, i, kinds) for i in idx]))
    return out


def script_timeout(sessions):
    return 120 + 12 * len(sessions)


def run_batch(meshes, mode, sessions, name, log=None, self_check=False):
    """Runs one batch's script with Dask and in ``mode``, compares; a Tally."""
    log = log or (lambda s: None)
    tally = Tally()
    t0 = time.monotonic()
    state = meshes.state_dir(mode)
    twice = mode in TWICE
    dfolder = meshes.folder("local", "%s-dask" % name)
    mfolder = meshes.folder(mode, "%s-%s" % (name, mode))
    lay_out(dfolder, sessions, "dask")
    lay_out(mfolder, sessions, "dask" if self_check else mode)
    denv = script_env()
    extra = {"MESH_STATE_DIR": state} if state else {}
    extra["MESH_DIFF_VICTIMS"] = meshes.victims(mode)
    menv = script_env(extra)
    timeout = script_timeout(sessions)
    druns, mruns = [], []
    if mode in KILLED:
        # A client killed mid-way, its script run again whole (the same
        # files): the second run against Dask's one.
        first = run_script(mfolder, menv, KILL_AFTER_S)
        # The inputs as they were: the script edits some of its own files
        # (file_reread), and Dask's run started from them.
        shutil.rmtree(os.path.join(mfolder, "flags"), ignore_errors=True)
        put_files(mfolder, sessions, 1)
        druns.append(dask_run(dfolder, sessions, 1, denv, timeout))
        mruns.append(run_script(mfolder, menv, timeout))
        d, m = druns[-1], mruns[-1]
        log("  %s: %s killed after %.1f s (%d records), run again %.1f s (rc %s, %d records); dask %s" % (
            name, mode, first.seconds, len(first.records), m.seconds, m.rc, len(m.records), "cached" if d.cached else "%.1f s" % d.seconds))
        for s in sessions:
            tally.add(mode, s, compare(mode, s, druns, mruns))
        tally.seconds[mode] += time.monotonic() - t0
        return tally
    # Dask's second run is needed for what changes between runs; with
    # resume=True only what does not is compared, against its first.
    for run in range(1, 3 if twice else 2):
        if run > 1:
            put_files(dfolder, sessions, run)
            put_files(mfolder, sessions, run)
        if run == 1 or mode != "resume":
            druns.append(dask_run(dfolder, sessions, run, denv, timeout))
        else:
            druns.append(druns[0])
        mruns.append(run_script(mfolder, menv, timeout))
        healed = meshes.heal(mode)
        d, m = druns[-1], mruns[-1]
        log("  %s run %d: dask %s (rc %s, %d records), %s %.1f s (rc %s, %d records)%s" % (
            name, run, "cached" if d.cached else "%.1f s" % d.seconds, d.rc, len(d.records), mode, m.seconds, m.rc, len(m.records),
            ", %d killed node(s) started again" % healed if healed else ""))
    for s in sessions:
        tally.add(mode, s, compare(mode, s, druns, mruns))
    tally.seconds[mode] += time.monotonic() - t0
    return tally


def run_all(settings, meshes, log=None, every_mode=False, self_check=False, skip=None, modes=None):
    """Every batch of ``settings`` (those of ``modes`` only, where given); a
    Tally. A mode that cannot run here is left out and said (``skip(mode,
    why)``)."""
    log = log or (lambda s: None)
    tally = Tally()
    unavailable = {}
    plan = batches(settings["seed"], settings["sessions"], settings["kinds"], settings["modes"], settings["batch"], settings["only"], every_mode)
    for b, (mode, sessions) in enumerate(plan):
        if mode in unavailable or modes is not None and mode not in modes:
            continue
        try:
            meshes.state_dir(mode)
        except Unavailable as e:
            unavailable[mode] = str(e)
            if skip:
                skip(mode, str(e))
            continue
        log("batch %d/%d: %d sessions (%d-%d) in mode %s" % (b + 1, len(plan), len(sessions), sessions[0].index, sessions[-1].index, mode))
        tally.merge(run_batch(meshes, mode, sessions, "b%03d" % b, log=log, self_check=self_check))
    return tally, unavailable


def report(tally, settings, repro=True):
    """The table, then each kind's first difference with its script."""
    out = ["differential test against Dask: seed %s, %d sessions, %d per script, kinds %s" % (
        settings["seed"], sum(tally.sessions.values()), settings["batch"],
        "all" if settings["kinds"] == KINDS else ",".join(settings["kinds"]))]
    out.append(tally.table())
    if repro and tally.diffs:
        out.append("")
        out.append("first difference of each mode and kind, with its step's own script:")
        for (mode, kind), d in tally.firsts():
            s, script = reproduction(d, settings["batch"])
            rec = [x for x in tally.diffs if x.session is d.session and x.mode == mode]
            out.append("")
            out.append("=" * 100)
            out.append("[%s / %s] seed %s session %d (%s): %s" % (mode, kind, d.session.seed, d.session.index, ", ".join(st.kind for st in d.session.steps), d.words()))
            for x in rec[:12]:
                out.append("    " + x.words(300))
            if len(rec) > 12:
                out.append("    ... and %d more" % (len(rec) - 12))
            dr, mr = d.session.records.get((mode, d.run), (None, None))
            out.append("  Dask's record (run %d): %s" % (d.run, _short(dr and dr["obs"], 3000)))
            out.append("  mesh's record (run %d): %s" % (d.run, _short(mr and dict(mr["obs"], **({"(meta)": mr["meta"]} if mr.get("meta") else {})), 3000)))
            out.append("-" * 100)
            out.append(script.rstrip())
    return "\n".join(out)


def check_reference(tally):
    """Differences where Dask itself gave no record: the harness's fault."""
    return [d for d in tally.diffs if d.kind == "(dask)"]
