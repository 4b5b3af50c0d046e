"""Python functions on the mesh: Dask's futures, each call a task of a farm of calls.

``client.submit(f, x)`` pickles the call with cloudpickle (a future among
its arguments as its key, a dependency) and queues it; a thread of the
client sends what is queued, a few milliseconds' worth at a time, as data
(a ``Calls`` request: each call's key, function, arguments, dependencies,
resources, retries), which the node adds to the client's open farm as
stages (per function and depth of dependency), each call a task named by
its key that waits for exactly the calls it was given futures of. Each
task runs ``_worker.py`` on its call in a Python of the client's version,
and its value is its output, ``result-KEY.pkl``, brought home as any
output; a task's view of ``{out}`` holds exactly its dependencies' values.
A call whose function and arguments pickle to the same bytes has the same
key and the same content key; as in Dask, a value is shared only while a
future of its key is held: each batch is sent with ``rerun``, so nothing
kept by an earlier run or another client is reused, unless the client
asked for it (``resume=True``).
"""

import base64
import collections
import concurrent.futures as cf
import hashlib
import io
import json
import linecache
import os
import pickle
import re
import sys
import threading
import time
import types
import uuid
import warnings
import weakref
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING

from . import _worker
from ._errors import FarmClosed, MeshError
from ._run import Run, _in_words

#: Pickled arguments up to this size ride in the request (base64) instead of a file.
INLINE_MAX = 768
#: The farm name of every batch of calls: a key kept by an earlier farm of
#: this name is reused (see docs/python.md).
FARM_NAME = "python"
#: Calls run in warm workers (a stage's ``python``); False starts an
#: interpreter per call (a stage's ``command``), for benchmarks.
WARM = True
#: The major.minor written in each call: the node's Python must be the same.
PYTHON_VERSION = "%d.%d" % sys.version_info[:2]

_NAME = re.compile(r"[^A-Za-z0-9_]+")


def _cloudpickle():
    try:
        import cloudpickle
    except ImportError:
        raise MeshError("Python functions on the mesh need cloudpickle: pip install cloudpickle") from None
    return cloudpickle


class RemoteTraceback(Exception):
    """The traceback of an exception raised where the call ran: the
    ``__cause__`` of the exception re-raised at the client."""

    def __init__(self, tb):
        super().__init__(tb)
        self.tb = tb

    def __str__(self):
        return self.tb


class _Unread:
    """A value not unpickled yet: its bytes, which rode with the task's
    report, or where it is in the home's folder."""

    __slots__ = ("path", "data")

    def __init__(self, path, data=None):
        self.path = path
        self.data = data

    def bytes(self):
        if self.data is not None:
            return self.data
        with open(self.path, "rb") as f:
            return f.read()

    def load(self):
        """The value: a file's is unpickled as it is read, with no copy of
        its bytes in memory first."""
        if self.data is not None:
            return pickle.loads(self.data)
        with open(self.path, "rb") as f:
            return pickle.load(f)


#: Locks a value is read under (once for its future, however many threads
#: ask): a future takes one by its id, where a lock each was bytes of
#: every pending future.
_READING = [threading.Lock() for _ in range(16)]


class Future(cf.Future):
    """The value of a function call on the mesh, as a Dask future.

    It is a :class:`concurrent.futures.Future` too, so
    ``concurrent.futures.wait`` and ``as_completed`` take it.
    """

    def __init__(self, fns, key, deps):
        # concurrent.futures.Future's state, but for its condition: all
        # the futures of a client share one (``result`` waits until its
        # own future is done), where one each was half the bytes of a
        # pending future.
        self._condition = fns.settled
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []
        #: The call's key: ``name-hash`` of its pickled function and arguments.
        self.key = key
        self._fns = fns
        self._deps = deps
        for d in deps:
            # The calls given `d`, while their futures live: a cancel takes
            # them with it. Made for the first (setdefault: one set, however
            # many threads submit at once); most futures are given to no
            # call, and an empty WeakSet each was a fourth of a pending
            # future's bytes.
            s = d.__dict__.get("_dependents")
            if s is None:
                s = d.__dict__.setdefault("_dependents", weakref.WeakSet())
            s.add(self)
        self._body = None
        self._fn = None
        self._args = None
        self._opts = None
        #: The farm it was sent to (set by the sender; see ``_run``).
        self._sent = None
        #: Scattered data: its file under the client's folder, an input
        #: of each call given this future.
        self._scattered = None
        self._value = None
        self.task_name = None
        self.task = None

    @property
    def _run(self):
        """The :class:`Run` of the farm this call is in: once ``submit`` or
        ``map`` has returned, it waits for the call to be sent (None for a
        call that never was: given a future that failed, or scattered)."""
        fns = self._fns
        with fns.cv:
            while self._sent is None and self._scattered is None and not self.done() and (self.key in fns.queue or self.key in fns.sending):
                fns.cv.wait(0.5)
            return self._sent

    @property
    def status(self):
        """``"pending"``, ``"finished"``, ``"error"`` or ``"cancelled"``, as Dask says."""
        with self._condition:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                return "cancelled"
            if self._state != FINISHED:
                return "pending"
            return "error" if self._exception is not None else "finished"

    def _wait(self, timeout):
        """Until this future is done or ``timeout`` seconds passed: the
        condition it waits on is told of every future of its client."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self._state not in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return
                self._condition.wait(left)

    def exception(self, timeout=None):
        """The exception the call raised, None when it returned: as
        ``concurrent.futures.Future.exception``."""
        self._wait(timeout)
        return super().exception(0)

    def result(self, timeout=None):
        """The function's value; its exception raised here, with the remote
        traceback as the cause. ``timeout``: seconds, then ``TimeoutError``."""
        self._wait(timeout)
        v = super().result(0)
        if isinstance(v, _Unread):
            with _READING[id(self) % len(_READING)]:
                if isinstance(self._result, _Unread):
                    self._result = self._result.load()
                v = self._result
        return v

    def cancel(self):
        """Cancels this call, as Dask's ``cancel``: a call that waits is
        dropped, a running one killed; one that ended is forgotten (its
        value is released, ``result()`` raises ``CancelledError``, and the
        same call submitted again runs again). The calls given it, and
        those given them, are cancelled with it, as Dask's scheduler cancels
        a key's dependents: whether or not they ended, none keeps a value
        computed from one that is gone. True once cancelled."""
        for f in reversed(self._with_dependents()):
            f._cancel_one()
        return True

    def _with_dependents(self):
        """This call, then the live calls given it, then those given them,
        each once."""
        out, seen = [self], {id(self)}
        for d in out:
            for g in list(d.__dict__.get("_dependents", ())):
                if id(g) not in seen:
                    seen.add(id(g))
                    out.append(g)
        return out

    def _cancel_one(self):
        with self._condition:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED):
                return
            ended = self._state == FINISHED
            self._state = CANCELLED_AND_NOTIFIED
            self._result = self._exception = self._value = None
            self._condition.notify_all()
            if not ended:
                for w in self._waiters:
                    w.add_cancelled(self)
        self._fns._cancelled(self, ended)
        if not ended:
            self._invoke_callbacks()

    @property
    def usage(self):
        """What the call used, as the node that ran it measured it: its
        task's :class:`Usage` (CPU, peak memory above what its warm worker
        held before it, bytes read and written). ``None`` until it ended,
        and for a call that did not run (its value reused from an earlier
        farm, or scattered)."""
        t = self.task
        return t.usage if t is not None else None

    def logs(self):
        """``(stdout, stderr)`` as bytes of the task that ran the call."""
        self.exception()
        if self.task is None:
            raise MeshError("%s did not run as a task" % self.key)
        return self.task.logs()

    def __repr__(self):
        return "<mesh.Future: %s, key: %s>" % (self.status, self.key)

    def _settle(self, value=None, exc=None):
        with self._condition:
            if self._state in (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED):
                return
        if exc is not None:
            self.set_exception(exc)
        else:
            self.set_result(value)


def _settle_from(f, t):
    """``f`` ended as its task ``t`` did: done, its value where the task's
    output is; failed, the exception the call raised."""
    f.task = t
    if t.state == "done":
        data = t.values.get(_worker.result_name(f.key))
        f._value = _Unread(t.output, data)
        f._settle(f._value)
    else:
        # One that never ran (skipped, cancelled, stopped, fitting no node)
        # raises what a future it was given raised, as in Dask.
        f._settle(exc=(_dep_failure(f) if t.attempt == 0 else None) or _remote_error(t))


def _dep_failure(f):
    """What ``f`` raises for a future it was given that failed (its
    exception) or was cancelled; None while none did."""
    for d in f._deps:
        if d.status == "error":
            return d.exception(0)
        if d.status == "cancelled":
            return cf.CancelledError("%s was cancelled, and %s needs its value" % (d.key, f.key))
    return None


def _put_file(path, data):
    """``data`` at ``path``, whole or not at all (a task of an earlier batch
    may be reading it)."""
    tmp = "%s.%d.part" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _futures_in(v, out):
    """Futures anywhere in ``v`` (lists, tuples, sets, dicts), for ``gather``."""
    if isinstance(v, Future):
        out.append(v)
    elif isinstance(v, (list, tuple, set, frozenset)):
        for x in v:
            _futures_in(x, out)
    elif isinstance(v, dict):
        for x in v.values():
            _futures_in(x, out)
    return out


def _replace(v, values):
    if isinstance(v, Future):
        return values[v.key]
    if isinstance(v, (list, tuple, set, frozenset)):
        return type(v)(_replace(x, values) for x in v)
    if isinstance(v, dict):
        return {k: _replace(x, values) for k, x in v.items()}
    return v


_ARGS_PICKLER = None


def _args_pickler():
    """A cloudpickler that writes each future among a call's arguments as
    its key (a persistent id), noting it in its ``deps``; made once (a
    class made per call was a sixth of a thin call's time here)."""
    global _ARGS_PICKLER
    if _ARGS_PICKLER is None:
        cp = _cloudpickle()

        class ArgsPickler(cp.CloudPickler):
            fns = None
            deps = None

            def persistent_id(self, obj):
                if isinstance(obj, Future):
                    if obj._fns is not self.fns:
                        raise MeshError("future %s is of another client" % obj.key)
                    self.deps[obj.key] = obj
                    return (_worker.FUTURE, obj.key)
                return None

        _ARGS_PICKLER = ArgsPickler
    return _ARGS_PICKLER


def _name_of(fn):
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return _NAME.sub("_", name).strip("_") or "call"


def _import_paths():
    """Where the client's own modules are: its script's folder (what
    Python put first on its path) and its current folder. A call runs
    with them on its path where the node sees them, as a Dask worker
    started beside the script has them."""
    here = os.getcwd()
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    script = os.path.dirname(os.path.abspath(main)) if main else here
    paths = []
    for p in (os.path.abspath(script), here):
        if p not in paths:
            paths.append(p)
    return paths


def _installed_paths():
    import sysconfig

    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def _by_value(cp, fn):
    """A function of the user's own module (a file beside the script, not
    installed) goes by value, as one of ``__main__`` does: a node need not
    have that file, nor the script's folder on its path."""
    m = sys.modules.get(getattr(fn, "__module__", None) or "")
    f = getattr(m, "__file__", None)
    if m is None or f is None or m.__name__ == "__main__" or m.__name__.startswith("mesh."):
        return
    if not os.path.realpath(f).startswith(_installed_paths()):
        try:
            cp.register_pickle_by_value(m)
        except (ValueError, AttributeError):
            pass


# Where the code of each function sent came from, by name: cloudpickle
# 3.1.3 and later send code as "<dynamic-code>" (and a node need not have
# the file anyway), so a remote traceback's lines are found here, where
# they were written. name -> {(file, first line, last line)}.
_SOURCES = {}
_DYNAMIC_FRAME = re.compile(r'^(\s*File )"<dynamic-code>"(, line (\d+), in (\S+))$')


def _note_sources(fn):
    """Remembers where ``fn``'s code (and its file's functions it may call,
    sent with it by value) was written."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    todo = [code]
    for v in list(getattr(fn, "__globals__", {}).values()):
        c = getattr(v, "__code__", None)
        if c is not None and c.co_filename == code.co_filename:
            todo.append(c)
    seen = set()
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        lines = [n for _, _, n in c.co_lines() if n is not None] if hasattr(c, "co_lines") else []
        last = max(lines, default=None)
        _SOURCES.setdefault(c.co_name, set()).add((c.co_filename, c.co_firstlineno, last))
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))


def _with_sources(tb):
    """A remote traceback with each "<dynamic-code>" frame of a function
    sent from here named by its file, and its line of source under it."""
    out = []
    lines = tb.split("\n")
    for i, line in enumerate(lines):
        m = _DYNAMIC_FRAME.match(line)
        if not m:
            out.append(line)
            continue
        n, name = int(m.group(3)), m.group(4)
        found = sorted(f for f, first, last in _SOURCES.get(name, ()) if first <= n and (last is None or n <= last))
        if not found:
            out.append(line)
            continue
        out.append('%s"%s"%s' % (m.group(1), found[0], m.group(2)))
        source = linecache.getline(found[0], n).strip()
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if source and not following.startswith(m.group(1).replace("File ", "  ")):
            out.append("%s  %s" % (m.group(1).replace("File ", ""), source))
    return "\n".join(out)


def _remote_error(task):
    """The exception a failed call raised, from its task's stderr."""
    if task.attempt == 0 and task.reason:
        # It never ran (no node can hold it): there is no log, only why.
        return MeshError("%s did not run: %s" % (task.params.get("id") or task.task, task.reason.replace("unplaceable: ", "", 1)))
    try:
        _, err = task.logs()
    except MeshError as e:
        return MeshError("%s failed (%s); its log could not be read: %s" % (task.task, task.reason, e))
    text = err.decode("utf-8", "replace")
    head, sep, mark = text.rpartition(_worker.EXCEPTION_MARK)
    if sep and mark.strip():
        try:
            exc = pickle.loads(base64.b64decode(mark.strip()))
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            tb = _with_sources(head.split("\n", 1)[1] if "\n" in head else head)
            exc.__cause__ = RemoteTraceback(tb.rstrip())
            if hasattr(exc, "add_note"):
                exc.add_note("raised on node %s, task %s of farm %s:\n%s" % (task.node, task.task, task.run.id, tb.rstrip()))
            return exc
    return MeshError("%s failed: %s\n%s" % (task.task, task.reason, text.strip()))


class Functions:
    """A client's calls: queued, sent in batches, and followed to their values."""

    def __init__(self, client, root, python, resume=False):
        self.client = client
        self.root = root
        self.python = python
        self.cv = threading.Condition()
        #: The condition every future of this client is settled under.
        self.settled = threading.Condition()
        #: Resources and retries asked, each once (a tuple a call was
        #: bytes of each pending future).
        self.opts_seen = {}
        self.queue = collections.OrderedDict()
        self.by_key = weakref.WeakValueDictionary()
        self.closed = False
        #: Values kept by earlier runs are reused, and a dead client's
        #: calls followed (``resume=True``); by default never, as Dask.
        self.resume = resume
        #: Farms of dead clients looked for (at the first batch).
        self.looked_for_dead = False
        #: Calls of a dead client's farm still to end, by key (resume).
        self.adoptable = {}
        #: Files given to ``upload_file``: name -> hash, in order.
        self.uploads = collections.OrderedDict()
        self.sender = None
        #: Maps making their calls: the sender waits for them to finish.
        self.holding = 0
        #: The worker script is in `root` (this client's own folder).
        self.worker_put = False
        #: Functions whose module and sources were looked at, by id (with
        #: the function, so the id stays its).
        self.fn_seen = {}
        #: Functions written to `root/fns`, by hash.
        self.fns_put = set()
        # The stages of the open farm whose calls the node has named, and
        # the ends of its tasks told before their names were read.
        self.named_stages, self.early = set(), {}
        self.farms_opened = 0
        #: The client's open farm (one grows by a batch at a time: a
        #: growth costs the node what it adds, however many came before),
        #: and its calls by key, which one thread follows.
        self.open_run = None
        self.open_calls = weakref.WeakValueDictionary()
        #: Keys of the batch being sent.
        self.sending = set()
        #: The open farm was closed other than by this client (see
        #: ``Run.closed_by_home``): set by the sender alone, per batch.
        self.open_gone = False

    # ----- calls -----

    def call(self, fn, args, kwargs, key=None, pure=True, resources=None, retries=None, priority=0, pickled=None, cwd=None):
        if not callable(fn):
            raise TypeError("submit takes a function, not %r" % (fn,))
        pickled = pickled or self.pickled_function(fn)
        fn_hash = pickled[0]
        buf = io.BytesIO()
        p = _args_pickler()(buf, protocol=pickle.HIGHEST_PROTOCOL)
        p.fns, p.deps = self, {}
        deps = p.deps
        try:
            p.dump((tuple(args), dict(kwargs), cwd or os.getcwd()))
        except Exception as e:
            raise TypeError("cannot send %s to the mesh: an argument does not pickle: %s: %s" % (_name_of(fn), type(e).__name__, e)) from e
        body = buf.getvalue()
        if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
            raise ValueError("retries is how many failures are allowed, a whole number >= 0, not %r" % (retries,))
        opts = (tuple(sorted((resources or {}).items())), retries)
        opts = self.opts_seen.setdefault(opts, opts)
        if key is None:
            if pure:
                h = hashlib.blake2b(fn_hash.encode(), digest_size=16)
                h.update(body)
                h.update(repr(opts).encode())
                key = "%s-%s" % (_name_of(fn), h.hexdigest())
            else:
                key = "%s-%s" % (_name_of(fn), uuid.uuid4().hex)
        elif not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", key) or ".." in key:
            raise ValueError("a key is letters, digits, `_`, `.` and `-`, not %r" % (key,))
        with self.cv:
            if self.closed:
                raise MeshError("client closed")
            # A key names one call: the same call again (pure), or a key
            # given twice, is the same future, as in Dask.
            old = self.by_key.get(key)
            if old is not None and old.status != "cancelled":
                return old
            f = Future(self, key, tuple(deps.values()))
            f._body = body
            f._fn = pickled
            f._opts = opts
            self.by_key[key] = f
            self.queue[key] = f
            self._start_sender()
            self.cv.notify_all()
        return f

    def pickled_function(self, fn):
        """The function's pickle as it is now (the globals and closures it
        captures: a global changed since the last submit is the new
        value, as Dask sends it) and its hash, which the call's key
        covers; a map pickles once for all its calls. First, the client's
        Python and the folders a call imports from (see ``_worker``)."""
        cp = _cloudpickle()
        seen = self.fn_seen.get(id(fn))
        if seen is None or seen is not fn:
            _by_value(cp, fn)
            _note_sources(fn)
            if len(self.fn_seen) >= 64:
                self.fn_seen.clear()
            self.fn_seen[id(fn)] = fn
        try:
            body = cp.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError("cannot send %s to the mesh: the function does not pickle: %s: %s" % (_name_of(fn), type(e).__name__, e)) from e
        meta = json.dumps({"path": _import_paths()}).encode()
        data = _worker.MAGIC + PYTHON_VERSION.encode() + b"\n" + meta + b"\n" + body
        return hashlib.blake2b(data, digest_size=16).hexdigest(), data

    def scatter(self, data, hash=True):
        """A future of ``data``, done at once: its pickle is a file of the
        client's folder, an input of each call given the future (so moved
        to a node once, by hash, however many calls there use it)."""
        cp = _cloudpickle()
        try:
            body = cp.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError("cannot scatter %s: it does not pickle: %s: %s" % (type(data).__name__, type(e).__name__, e)) from e
        name = _NAME.sub("_", type(data).__name__).strip("_") or "data"
        token = hashlib.blake2b(body, digest_size=16).hexdigest() if hash else uuid.uuid4().hex
        key = "%s-%s" % (name, token)
        with self.cv:
            if self.closed:
                raise MeshError("client closed")
            old = self.by_key.get(key)
            if old is not None and old._scattered is not None:
                return old
        d = os.path.join(self.root, "scatter")
        os.makedirs(d, exist_ok=True)
        rel = "scatter/%s.pkl" % key
        if not os.path.exists(os.path.join(self.root, rel)):
            _put_file(os.path.join(self.root, rel), body)
        f = Future(self, key, ())
        f._scattered = rel
        f._settle(data)
        with self.cv:
            self.by_key[key] = f
        return f

    def upload_file(self, path):
        """Ships ``path`` (a ``.py``, ``.zip`` or ``.egg``) with every call
        sent from now on: an input of its stage, brought to each node
        that runs one (once, by hash), where the call imports from it; a
        module uploaded again is imported anew."""
        name = os.path.basename(os.fspath(path))
        if not name.endswith((".py", ".zip", ".egg")):
            raise ValueError("upload_file takes a .py, .zip or .egg file, not %r" % name)
        with open(path, "rb") as f:
            data = f.read()
        d = os.path.join(self.root, "uploads")
        os.makedirs(d, exist_ok=True)
        _put_file(os.path.join(d, name), data)
        with self.cv:
            self.uploads.pop(name, None)
            self.uploads[name] = hashlib.blake2b(data, digest_size=16).hexdigest()

    def hold(self):
        """``with fns.hold():`` the calls made in it go in one batch."""
        fns = self

        class Hold:
            def __enter__(self):
                with fns.cv:
                    fns.holding += 1

            def __exit__(self, *exc):
                with fns.cv:
                    fns.holding -= 1
                    fns.cv.notify_all()

        return Hold()

    def _cancelled(self, f, ended=False):
        with self.cv:
            queued = self.queue.pop(f.key, None) is not None
            run = f._sent
            # Released: the same call again is a new one.
            if self.by_key.get(f.key) is f:
                del self.by_key[f.key]
            self.cv.notify_all()
        if queued or run is None or ended:
            return
        # Killed where it runs, or dropped where it waits; the calls given
        # its future are skipped by the node, and raise CancelledError here.
        try:
            run.cancel_task(f.task_name)
        except MeshError:
            pass

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()
            sender = self.sender
        if sender is not None and sender is not threading.current_thread():
            sender.join(timeout=30)
        self._close_open()

    def _close_open(self):
        """Closes the open farm: it ends once its calls do (nothing is
        cancelled), and its follower with it."""
        with self.cv:
            run, self.open_run = self.open_run, None
        if run is not None:
            try:
                run.close()
            except MeshError:
                pass

    def _in_open(self, d):
        """Whether future ``d`` was sent to the open farm the next batch
        grows (not to one the next batch leaves for a new one)."""
        return d._sent is not None and d._sent is self.open_run and not self.open_gone

    # ----- sending -----

    def _start_sender(self):
        if self.sender is None or not self.sender.is_alive():
            self.sender = threading.Thread(target=self._send_loop, name="mesh-send", daemon=True)
            self.sender.start()

    def _send_loop(self):
        while True:
            with self.cv:
                while not self.closed and (self.holding or not self._ready_any()):
                    self.cv.wait(1.0)
                if self.closed and not self.queue:
                    return
            # No waiting for more: a lone submit wants its value soon; calls
            # made while a batch is sent go in the next (a loop of submits),
            # and a map's in one (see `holding`).
            with self.cv:
                # Read here only, so the batch taken and the batch sent
                # agree on which farm its calls' futures are in.
                self.open_gone = self.open_run is not None and self.open_run.closed_by_home
                batch, failed = self._take()
                self.sending = {f.key for f in batch}
            for f, exc in failed:
                f._settle(exc=exc)
            try:
                if batch:
                    batch = self._adopt(batch)
                if batch:
                    self._send(batch)
            except FarmClosed:
                # Closed as this batch was sent (`mesh close`, another
                # client), before its hold heard it: none of its calls was
                # added. Left as a hold's news would leave it, and the batch
                # taken again, first, for a new farm: what it waits for in
                # the closed one still runs there, and its values come along.
                with self.cv:
                    if self.open_run is not None:
                        self.open_run.closed_by_home = True
                    rest = dict(self.queue)
                    self.queue.clear()
                    self.queue.update((f.key, f) for f in batch)
                    self.queue.update(rest)
            except BaseException as e:
                for f in batch:
                    f._settle(exc=e)
            finally:
                with self.cv:
                    self.sending = set()
                    self.cv.notify_all()
            # Nor here (see `_follow`).
            batch = failed = None
            if self.closed:
                return

    def _ready_any(self):
        return any(self._state_of_deps(f, ()) != "wait" for f in self.queue.values())

    def _state_of_deps(self, f, batch_keys):
        for d in f._deps:
            if d.key in batch_keys:
                continue
            s = d.status
            if s == "pending" and self._in_open(d):
                # Sent to the farm this batch grows: a dependency there.
                continue
            if s == "pending":
                return "wait"
            if s in ("error", "cancelled"):
                return "fail"
        return "go"

    def _take(self):
        batch, failed, keys = [], [], set()
        for key in list(self.queue):
            f = self.queue[key]
            s = self._state_of_deps(f, keys)
            if s == "wait":
                continue
            del self.queue[key]
            if s == "fail":
                failed.append((f, _dep_failure(f)))
                continue
            batch.append(f)
            keys.add(key)
        return batch, failed

    # ----- farms of clients that died -----

    def _adopt(self, batch):
        """At the first batch, the farms of Python calls that clients which
        are gone left running on this node (closed, not over). With
        ``resume``, a call of the batch still to end in one of them is
        followed there, not sent again (what ended is reused by content
        key as the batch is sent); without, each such farm is said once.
        The calls of ``batch`` left to send."""
        if self.looked_for_dead:
            return batch
        self.looked_for_dead = True
        try:
            dead = [
                i
                for i in self.client.farms()
                if i.name == FARM_NAME and not i.finished and not (i.open and i.held) and i.home == self.client.node and i.total > i.ended
            ]
        except MeshError:
            return batch
        for info in dead:
            left = info.total - info.ended
            if not self.resume:
                warnings.warn(
                    "farm %s of a Python client that is gone still runs %d call%s on this node: `mesh cancel %s` "
                    "stops it; mesh.connect(resume=True) takes its calls over instead of running them again"
                    % (info.id, left, "" if left == 1 else "s", info.id),
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            run = Run(self.client, info.id, total=info.total)
            try:
                tasks = run.tasks(state="unfinished")
            except MeshError:
                continue
            for t in tasks:
                key = t.params.get("id")
                if key:
                    self.adoptable[key] = (run, t.task)
        if not self.adoptable:
            return batch
        rest, followed = [], {}
        for f in batch:
            got = self.adoptable.pop(f.key, None)
            if got is None:
                rest.append(f)
                continue
            run, task = got
            with self.cv:
                f._sent, f.task_name = run, task
            followed.setdefault(run.id, (run, weakref.WeakValueDictionary()))[1][task] = f
        for run, by_task in followed.values():
            threading.Thread(target=self._follow, args=(run, by_task), name="mesh-follow", daemon=True).start()
        return rest

    def _send(self, batch):
        calls = os.path.join(self.root, "calls")
        os.makedirs(calls, exist_ok=True)
        os.makedirs(os.path.join(self.root, "fns"), exist_ok=True)
        self._put_worker()
        if self.open_run is not None and self.open_gone:
            self._close_open()
            self.open_gone = False
        # The batch as data (docs/api.md#calls): each call's key, function,
        # arguments, dependencies, resources and retries; the node groups
        # them into stages of the open farm.
        place, wire = {}, []
        for i, f in enumerate(batch):
            # Futures of this batch and of the open farm are its tasks:
            # dependencies, their values moving node to node; scattered
            # data is an input, moved once per node; others' values ride
            # in a file sent with the call.
            deps, after, earlier = [], [], []
            for d in f._deps:
                if d.key in place:
                    deps.append(place[d.key])
                elif d._scattered is not None:
                    continue
                elif self._in_open(d):
                    after.append(d.task_name)
                else:
                    earlier.append(d)
            place[f.key] = i
            fn_hash, fn_bytes = f._fn
            if fn_hash not in self.fns_put:
                _put_file(os.path.join(self.root, "fns", fn_hash + ".pkl"), fn_bytes)
                self.fns_put.add(fn_hash)
            c = {"key": f.key, "function": "fns/%s.pkl" % fn_hash}
            # Arguments ride in the request where they are small (a file
            # made per call was most of a thin call's cost here).
            if len(f._body) <= INLINE_MAX:
                c["args"] = base64.b64encode(f._body).decode()
            else:
                with open(os.path.join(calls, f.key + ".pkl"), "wb") as w:
                    w.write(f._body)
            if earlier:
                vals = {}
                for d in earlier:
                    vals[d.key] = d._value.bytes()
                with open(os.path.join(calls, f.key + ".vals"), "wb") as w:
                    pickle.dump(vals, w)
                c["vals"] = True
            if deps:
                c["deps"] = deps
            if after:
                c["after"] = after
            scattered = sorted({d._scattered for d in f._deps if d._scattered is not None})
            if scattered:
                c["inputs"] = scattered
            res, retries = f._opts
            if res:
                c["resources"] = dict(res)
            if retries is not None:
                c["retries"] = retries
            wire.append(c)
        with self.cv:
            uploads = list(self.uploads.items())
        run = {
            # Run by a warm worker of that Python on each node (or the
            # node's --python, or python3 where it has no such path).
            "python": self.python or sys.executable,
            "warm": WARM,
            "worker": "mesh_worker.py",
            "inputs": ["uploads/%s" % u for u, _ in uploads],
            "args_file": "calls/{id}.pkl",
            "vals_file": "calls/{id}.vals",
            "result": _worker.result_name("{id}"),
        }
        if uploads:
            # What the worker imports anew when it changed (the files'
            # contents are in the key already, as inputs).
            run["env"] = [[_worker.UPLOADS_ENV, ";".join("%s=%s" % u for u in uploads)]]
        self._send_calls(batch, run, wire)
        for f in batch:
            # Sent: a pending future keeps its key, not its call (until
            # then, a batch a closed farm refused is made again from it).
            f._body = None
            f._fn = None

    def _send_calls(self, batch, run_as, wire):
        """``batch`` sent as ``wire`` (its calls as data): a new open farm,
        or a growth of the open one."""
        with self.cv:
            run = self.open_run
            calls = self.open_calls if run is not None else weakref.WeakValueDictionary()
        # As Dask: nothing an earlier run or another client made is taken,
        # unless asked for (resume=True).
        req = {"run": run_as, "calls": wire, "rerun": not self.resume}
        if run is None:
            # A folder of outputs per farm: the node names a farm's stages by
            # place (`c0`, `c1`...), as the next farm of this client does,
            # and a farm closed under the client (`mesh close`) still runs
            # its calls.
            self.farms_opened += 1
            out = os.path.join(self.root, "out", str(self.farms_opened))
            req["new"] = {"name": FARM_NAME, "root": self.root, "out": out}
            with self.cv:
                # Stage names are the farm's own: a new farm's start anew.
                self.named_stages, self.early = set(), {}
        else:
            req["farm"] = run.id

        named_now = []

        def named(tasks):
            # By task, not key: a key sent again after its future was
            # dropped is another task, and the first's end is not its value.
            early = []
            with self.cv:
                named_now.extend(tasks)
                for f, task in zip(batch, tasks):
                    f.task_name = task
                    calls[task] = f
                    if run is not None:
                        f._sent = run
                    self.named_stages.add(task.split("/", 1)[0])
                    t = self.early.pop(task, None)
                    if t is not None and t.params.get("id", f.key) == f.key:
                        early.append((f, t))
            for f, t in early:
                _settle_from(f, t)

        try:
            # A closed farm raises FarmClosed: the sender opens another.
            v, _ = self.client._farm_submitted(None, {"Calls": req}, warn=False, named=named)
        except BaseException:
            # Refused after they were named: those stages were not added,
            # and the next batch's are named alike.
            with self.cv:
                for task in named_now:
                    calls.pop(task, None)
                self.named_stages.difference_update(t.split("/", 1)[0] for t in named_now)
            raise
        if run is None:
            run = Run(self.client, v["farm"], total=v["tasks"])
            # Closed by its home should this process die without closing it.
            run.hold()
            with self.cv:
                # Before the follower can settle any of them.
                for f in batch:
                    f._sent = run
                self.open_run, self.open_calls = run, calls
            # One thread: the node tells a call that will not run as it
            # tells one that ended.
            t = threading.Thread(target=self._follow, args=(run, calls), name="mesh-follow", daemon=True)
            t.start()
        else:
            run.total = v["tasks"]

    def of_farm(self, run):
        """Futures of the calls of a farm submitted earlier, by key: done
        ones with their values, failed ones with their exceptions, the rest
        followed as they end."""
        got, waiting = {}, {}
        for t in run.tasks():
            key = t.params.get("id")
            if not key:
                continue
            f = Future(self, key, ())
            f._sent, f.task_name = run, t.task
            if t.state in ("done", "failed"):
                _settle_from(f, t)
            else:
                waiting[t.task] = f
            got[key] = f
            with self.cv:
                if self.by_key.get(key) is None:
                    self.by_key[key] = f
        if waiting:
            threading.Thread(target=self._follow, args=(run, waiting), name="mesh-follow", daemon=True).start()
        return got

    def _put_worker(self):
        """The worker script beside the calls, once: tasks of an earlier
        batch run it from there while this one is sent, so it is never
        rewritten in place (a run reading it half written would do nothing)."""
        if self.worker_put:
            return
        with open(_worker.__file__, "rb") as f:
            _put_file(os.path.join(self.root, "mesh_worker.py"), f.read())
        self.worker_put = True

    def _follow(self, run, by_task):
        """Settles each future of ``by_task`` (task name -> future; weak:
        a future dropped is not waited for) as its task ends."""
        try:
            for t in run.as_completed(progress=False):
                f = by_task.get(t.task)
                if f is None:
                    with self.cv:
                        f = by_task.get(t.task)
                        if f is None and run is self.open_run and t.task.split("/", 1)[0] not in self.named_stages:
                            # Ended before the node's answer naming it was
                            # read: settled once it is (see `_send_calls`).
                            self.early[t.task] = t
                if f is not None and t.params.get("id", f.key) == f.key:
                    _settle_from(f, t)
                # Held no longer than the user holds it: a key is shared
                # only while a future of it is held.
                f = None
                with self.cv:
                    self.cv.notify_all()
            with self.cv:
                left = [f for f in list(by_task.values()) if not f.done()]
            if left:
                p = run.progress()
                why = "; ".join(p.stopped_words or p.unplaceable or p.failures) or "its farm %s ended without running it" % run.id
                for f in left:
                    f._settle(exc=_dep_failure(f) or MeshError("%s did not run: %s" % (f.key, why)))
        except BaseException as e:
            with self.cv:
                left = list(by_task.values())
            for f in left:
                f._settle(exc=MeshError("following farm %s: %s" % (run.id, e)))
        finally:
            with self.cv:
                self.cv.notify_all()


def gather(futures, errors="raise"):
    """The values of ``futures`` (a future, or lists, tuples and dicts of
    them), in the same shape. ``errors="raise"``: the first exception is
    raised; ``"skip"``: failed ones are left out (of lists)."""
    fs = _futures_in(futures, [])
    values = {}
    for f in fs:
        try:
            values[f.key] = f.result()
        except BaseException:
            if errors == "raise":
                raise
            if errors != "skip":
                raise ValueError("errors is 'raise' or 'skip', not %r" % (errors,)) from None
    if errors == "skip" and isinstance(futures, (list, tuple)):
        futures = type(futures)(x for x in futures if not isinstance(x, Future) or x.key in values)
    return _replace(futures, values)


class as_completed:
    """Futures as they end (with ``with_results=True``: ``(future,
    value)`` pairs), as Dask's; ``.add(future)`` adds one while iterating."""

    def __init__(self, futures=(), with_results=False, raise_errors=True):
        self._cv = threading.Condition()
        self._ended = collections.deque()
        self._pending = set()
        self._with_results = with_results
        self._raise = raise_errors
        for f in futures:
            self.add(f)

    def add(self, future):
        with self._cv:
            self._pending.add(future)
        future.add_done_callback(self._ended_one)

    def update(self, futures):
        for f in futures:
            self.add(f)

    def _ended_one(self, f):
        with self._cv:
            if f in self._pending:
                self._pending.discard(f)
                self._ended.append(f)
                self._cv.notify_all()

    def count(self):
        with self._cv:
            return len(self._pending) + len(self._ended)

    def is_empty(self):
        return self.count() == 0

    def __iter__(self):
        return self

    def __next__(self):
        with self._cv:
            while not self._ended:
                if not self._pending:
                    raise StopIteration
                self._cv.wait()
            f = self._ended.popleft()
        if self._with_results:
            try:
                return f, f.result()
            except BaseException as e:
                if self._raise:
                    raise
                return f, e
        return f


DoneAndNotDone = collections.namedtuple("DoneAndNotDone", "done not_done")


def wait(futures, timeout=None, return_when="ALL_COMPLETED"):
    """Waits as Dask's ``wait``: ``(done, not_done)`` sets; ``return_when``
    is ``"ALL_COMPLETED"``, ``"FIRST_COMPLETED"`` or ``"FIRST_EXCEPTION"``.
    ``timeout``: seconds, then ``TimeoutError`` (as Dask, unlike
    ``concurrent.futures.wait``)."""
    if isinstance(futures, Future):
        futures = [futures]
    r = cf.wait(list(futures), timeout=timeout, return_when=return_when)
    if return_when == "ALL_COMPLETED" and r.not_done:
        raise TimeoutError("%d of %d futures not done within %s s" % (len(r.not_done), len(r.done) + len(r.not_done), timeout))
    return DoneAndNotDone(r.done, r.not_done)


def progress(futures, file=None):
    """Shows how many of ``futures`` are done until all are (a tqdm bar
    where tqdm is installed, else a line on stderr), and when their farms
    end as their homes estimate it; returns them."""
    fs = list(futures.values() if isinstance(futures, dict) else futures)
    file = file or sys.stderr
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    bar = tqdm(total=len(fs), unit="task", file=file) if tqdm else None
    n = 0
    asked = 0.0
    ends = None
    pending = set(fs)
    for f in cf.as_completed(fs):
        n += 1
        pending.discard(f)
        if time.monotonic() - asked >= _ETA_EVERY_S:
            asked = time.monotonic()
            ends = _ends_at(pending)
        when = "" if ends is None else ", ends in about %s" % _in_words(ends - time.time())
        if bar is not None:
            bar.update(1)
            if ends is not None:
                bar.set_postfix({"ends in": _in_words(ends - time.time())}, refresh=False)
        else:
            file.write("\r%d/%d done%s" % (n, len(fs), when))
            file.flush()
    if bar is not None:
        bar.close()
    else:
        file.write("\n")
    return futures


#: How often :func:`progress` asks the farms of its futures when they end.
_ETA_EVERY_S = 2.0


def _ends_at(pending):
    """The latest p50 end (Unix seconds) of the farms that ``pending``
    futures are calls of, as their homes estimate it; None where none has."""
    runs = {}
    for f in pending:
        run = getattr(f, "_sent", None)
        if run is not None:
            runs[run.id] = run
    latest = None
    for run in runs.values():
        try:
            at = run.progress().ends_at
        except Exception:
            # An estimate is a nicety: a farm the node no longer has, or a
            # node between two answers, leaves the bar as it was.
            continue
        if at is not None and (latest is None or at[0] > latest):
            latest = at[0]
    return latest


class Executor(cf.Executor):
    """A :class:`concurrent.futures.Executor` over a client's calls:
    ``submit`` and ``map`` as the standard library's, each call a task
    with ``defaults`` (``resources=``, ``retries=``, ``pure=``)."""

    def __init__(self, client, **defaults):
        self._client = client
        self._defaults = defaults
        self._shutdown = False
        self._futures = set()

    def submit(self, fn, /, *args, **kwargs):
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        f = self._client._functions().call(fn, args, kwargs, **self._defaults)
        self._futures.add(f)
        return f

    def map(self, fn, *iterables, timeout=None, chunksize=1):
        with self._client._functions().hold():
            fs = [self.submit(fn, *a) for a in zip(*iterables)]
        deadline = None if timeout is None else time.monotonic() + timeout

        def results():
            try:
                for f in fs:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    yield f.result(left)
            finally:
                for f in fs:
                    f.cancel()

        return results()

    def shutdown(self, wait=True, *, cancel_futures=False):
        self._shutdown = True
        if cancel_futures:
            for f in self._futures:
                f.cancel()
        if wait:
            cf.wait(list(self._futures))
