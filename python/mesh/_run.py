"""A submitted farm (:class:`Run`), its tasks (:class:`Task`) and its progress."""

import base64
import os
import sys
import threading
import time

from . import _proto
from ._errors import FarmFailed, MeshError, TaskFailed


def _say(words):
    """A line on stderr, for what a user waiting on a farm should know now."""
    try:
        print(words, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _stamp(ms):
    return None if ms is None else ms / 1000.0


class Usage:
    """What a task's run used, as the node that ran it measured it.

    ``cpu`` (seconds of CPU, user and system, its child processes
    included), ``peak_memory`` (the most resident memory its processes
    held at once, in bytes; 0 where it ended before a look; for a call
    in a warm worker, what it held above what the worker held before it),
    ``read_bytes`` and ``written_bytes`` (through its read and write
    calls), ``oom`` (killed for want of memory: past its ``mem`` ask, or
    by the kernel).
    """

    __slots__ = ("cpu", "peak_memory", "read_bytes", "written_bytes", "oom")

    def __init__(self, u):
        self.cpu = u.get("cpu_ms", 0) / 1000.0
        self.peak_memory = u.get("peak_rss", 0)
        self.read_bytes = u.get("read_bytes", 0)
        self.written_bytes = u.get("written_bytes", 0)
        self.oom = bool(u.get("oom", False))

    def __repr__(self):
        mib = 1 << 20
        oom = ", out of memory" if self.oom else ""
        return "Usage(cpu=%.2fs, peak_memory=%.1fMiB, read=%.1fMiB, written=%.1fMiB%s)" % (
            self.cpu,
            self.peak_memory / mib,
            self.read_bytes / mib,
            self.written_bytes / mib,
            oom,
        )


class Task:
    """A task of a run, as the farm's home knows it.

    ``task`` (``"solve/3"``), ``stage``, ``index``, ``params`` (its sweep
    values, by variable), ``state`` (``"done"``, ``"failed"``, or
    ``"unfinished"`` in :meth:`Run.tasks`), ``exit_code``, ``signal``,
    ``reason`` (why it failed), ``node`` (the peer id that ran it),
    ``attempt``, ``start`` and ``end`` (Unix seconds, where the node the
    client talks to ran it; ``None`` otherwise), ``at`` (when the home had
    it), ``outputs`` (absolute paths on the home), ``values`` (the outputs
    whose bytes rode with its report instead of being files: a function
    call's small value; bytes by output name), ``usage`` (a :class:`Usage`:
    its CPU, peak memory and bytes, where its node measured them; ``None``
    for a result reused from an earlier farm).
    """

    __slots__ = (
        "run",
        "task",
        "stage",
        "index",
        "params",
        "state",
        "exit_code",
        "signal",
        "reason",
        "node",
        "attempt",
        "start",
        "end",
        "at",
        "outputs",
        "values",
        "usage",
    )

    def __init__(self, run, ev):
        self.run = run
        self.task = ev["task"]
        self.stage = ev["stage"]
        self.index = ev["index"]
        self.params = dict(ev.get("params") or {})
        self.state = ev["state"]
        self.exit_code = ev.get("exit_code")
        self.signal = ev.get("signal")
        self.reason = ev.get("reason")
        self.node = ev.get("node")
        self.attempt = ev.get("attempt", 0)
        self.start = _stamp(ev.get("start_ms"))
        self.end = _stamp(ev.get("end_ms"))
        self.at = _stamp(ev.get("at_ms"))
        self.outputs = list(ev.get("outputs") or [])
        self.values = {k: base64.b64decode(v) for k, v in (ev.get("values") or {}).items()}
        self.usage = Usage(ev["usage"]) if ev.get("usage") else None

    @property
    def ok(self):
        return self.state == "done"

    @property
    def output(self):
        """The first output's path (``None`` when it made none)."""
        return self.outputs[0] if self.outputs else None

    @property
    def duration(self):
        """Seconds it ran, where known."""
        if self.start is None or self.end is None:
            return None
        return self.end - self.start

    def result(self):
        """Its outputs' paths; :class:`TaskFailed` when it did not succeed."""
        if self.state != "done":
            raise TaskFailed(self)
        return self.outputs

    @property
    def reused(self):
        """Done from the start: an earlier farm's result of the same
        content key, put in this farm's folder instead of run again."""
        return self.state == "done" and self.attempt == 0

    def logs(self, attempt=None):
        """``(stdout, stderr)`` as bytes, from the node that ran it. A
        reused task did not run in this farm: its logs are those of the run
        that made its outputs, where its home wrote that down; else
        :class:`MeshError` says where its outputs came from, rather than
        an empty log."""
        out, err = [], []
        req = {
            "Logs": {
                "farm": self.run.id,
                "task": self.task,
                "attempt": attempt,
                "follow": False,
            }
        }
        with self.run.client._exchange(req) as x:
            for a in x:
                k = _proto.kind(a)
                if k == "Error":
                    if self.reused and attempt is None:
                        raise MeshError(
                            "logs of %s: it did not run in farm %s; its result was reused from an "
                            "earlier farm with the same content key (its outputs: %s), and that "
                            "run's logs could not be read: %s" % (self.task, self.run.id, self.outputs, _proto.refusal(a)[1])
                        )
                    raise _proto.error(a, "logs of %s: " % self.task)
                if k != "Log":
                    raise MeshError("logs of %s: unexpected answer %s" % (self.task, k))
                out.append(bytes(a["Log"]["stdout"]))
                err.append(bytes(a["Log"]["stderr"]))
        return b"".join(out), b"".join(err)

    def stdout(self, attempt=None):
        """What it wrote to stdout (text; see :meth:`logs` for bytes)."""
        return self.logs(attempt)[0].decode("utf-8", "replace")

    def stderr(self, attempt=None):
        """What it wrote to stderr (text)."""
        return self.logs(attempt)[1].decode("utf-8", "replace")

    def __repr__(self):
        extra = ""
        if self.state == "failed":
            extra = ": %s" % self.reason
        return "<mesh.Task %s %s%s>" % (self.task, self.state, extra)


class Progress:
    """Where a farm stands: counts over its tasks, and per stage.

    ``total``, ``done`` (``cached`` of them reused from earlier farms),
    ``running`` (started on nodes), ``failed``, ``skipped``, ``cancelled``,
    ``stopped``, ``queued`` (``queued_on_nodes`` of them sent ahead to a
    node, not started there yet); ``finished``; ``stages`` (name -> counts dict);
    ``failures`` (the first, in words); ``out`` (its outputs' folder on the
    home) and ``home`` (the home's peer id); ``eta`` (see :attr:`ends_at`).
    """

    def __init__(self, view):
        self.view = view
        self.id = view["id"]
        self.name = view.get("name")
        c = view.get("counts", {})
        self.total = c.get("total", 0)
        self.done = c.get("done", 0)
        self.cached = c.get("cached", 0)
        self.running = c.get("running", 0)
        #: Of ``queued``, the tasks sent ahead to a node and not started
        #: there yet (a node is handed a few more than it runs at once).
        self.queued_on_nodes = c.get("queued_on_nodes", 0)
        self.failed = c.get("failed", 0)
        self.skipped = c.get("skipped", 0)
        self.cancelled = c.get("cancelled", 0)
        self.stopped = c.get("stopped", 0)
        self.finished = bool(view.get("finished"))
        #: Stages may still be added (an open farm: a client's calls).
        self.open = bool(view.get("open"))
        #: A client holds it open now (said by its home, in ``farms()``):
        #: an open farm no client holds is a dead client's.
        self.held = bool(view.get("held"))
        self.stages = {name: counts for name, counts in view.get("stages", [])}
        self.failures = list(view.get("failures", []))
        self.stopped_words = list(view.get("stopped", []))
        self.unplaceable = list(view.get("unplaceable", []))
        self.out = view.get("out")
        self.home = view.get("home")
        #: The home's estimate of the farm's end, a quick simulation of what
        #: is left (``p50_ms``, ``p90_ms`` from ``at_ms``, Unix ms;
        #: ``guessed``: stages none of whose tasks has finished), or None
        #: until a task has finished.
        self.eta = view.get("eta") if not self.finished else None

    @property
    def ends_at(self):
        """When the farm ends, as Unix seconds ``(p50, p90)``: half the
        simulated runs of what is left ended by the first, nine in ten by
        the second. None while there is no estimate."""
        e = self.eta
        if not e:
            return None
        return ((e["at_ms"] + e["p50_ms"]) / 1000.0, (e["at_ms"] + e["p90_ms"]) / 1000.0)

    @property
    def eta_s(self):
        """Seconds from now until the farm ends (the p50 of
        :attr:`ends_at`); None while there is no estimate."""
        at = self.ends_at
        return None if at is None else max(0.0, at[0] - time.time())

    @property
    def queued(self):
        return max(
            0,
            self.total - self.done - self.running - self.failed - self.skipped - self.cancelled - self.stopped,
        )

    @property
    def ended(self):
        """Tasks that are over: done, failed, skipped or cancelled."""
        return self.done + self.failed + self.skipped + self.cancelled

    @property
    def ok(self):
        return self.finished and self.done == self.total

    def __repr__(self):
        left = self.eta_s
        return "<mesh.Progress %s: %d/%d done, %d running, %d failed%s%s>" % (
            self.id,
            self.done,
            self.total,
            self.running,
            self.failed,
            ", finished" if self.finished else "",
            "" if left is None else ", ends in about " + _in_words(left),
        )


class FarmInfo(Progress):
    """A farm as :func:`mesh.farms` lists it, in short."""

    def __repr__(self):
        return "<mesh.FarmInfo %s: %s, %d/%d done, home %s>" % (
            self.id,
            "finished" if self.finished else "running",
            self.done,
            self.total,
            self.home,
        )


def _in_words(seconds):
    """``2m 05s``, ``1h 10m``: how long, as a bar has room for."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return "%dh %02dm" % (s // 3600, s % 3600 // 60)
    if s >= 60:
        return "%dm %02ds" % (s // 60, s % 60)
    return "%ds" % s


class _Bar:
    """A tqdm bar where tqdm is installed and someone sees it, else nothing."""

    def __init__(self, show, total, desc):
        self._bar = None
        if show is None:
            show = sys.stderr.isatty() or "ipykernel" in sys.modules
        if not show:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=desc, unit="task")

    def to(self, n, failed=None, ends_at=None):
        if self._bar is not None:
            self._bar.update(n - self._bar.n)
            post = {}
            if failed:
                post["failed"] = failed
            if ends_at is not None:
                post["ends in"] = _in_words(ends_at[0] - time.time())
            if post:
                self._bar.set_postfix(post, refresh=False)

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None


#: How long a hold (see :meth:`Run.hold`) keeps trying to reach a node
#: that went away.
HOLD_RECONNECT_S = 300


class Run:
    """A farm submitted to a node: follow it, wait for it, cancel it."""

    def __init__(self, client, farm_id, total=None, warnings=()):
        self.client = client
        #: The farm's id (``name-1a2b3c4d``), as ``mesh status`` shows it.
        self.id = farm_id
        self.total = total
        self.warnings = list(warnings)
        #: An open farm closed other than by this client (:meth:`hold` heard
        #: it): a client sends what comes next to another.
        self.closed_by_home = False

    def __repr__(self):
        return "<mesh.Run %s>" % self.id

    def as_completed(self, progress=None, timeout=None, reconnect=60):
        """Each task once, as it ends for good (done with its outputs home,
        or failed), in the order they end; the last when the farm is over.

        ``progress``: a tqdm bar (default: where tqdm is installed and
        stderr is a terminal or a notebook). ``timeout``: seconds to wait
        for the next task before :class:`TimeoutError` (default: as long
        as the tasks take). ``reconnect``: seconds to keep trying when the
        node goes away (restarted on its state folder, it carries on with
        the farm), said at once on stderr; the tasks it says again are
        not yielded twice.
        """
        bar = _Bar(progress, self.total, self.id)
        said = set()
        failed = 0
        lost_at = None
        try:
            while True:
                try:
                    # No deadline on a task's end: a call may run for hours.
                    with self.client._exchange({"Events": {"farm": self.id}}, first_within=None) as x:
                        while True:
                            a = x.next_answer(within=timeout)
                            if lost_at is not None:
                                _say("mesh: %s is back; following farm %s again" % (self.client._t.describe(), self.id))
                            lost_at = None
                            k = _proto.kind(a)
                            if k == "Task":
                                t = Task(self, a["Task"])
                                if t.task in said:
                                    continue
                                said.add(t.task)
                                if t.state == "failed":
                                    failed += 1
                                bar.to(len(said), failed)
                                yield t
                            elif k == "Finished":
                                return
                            elif k == "Error":
                                kind, words = _proto.refusal(a)
                                if kind == "lagged":
                                    # Asked again, the node says every task from
                                    # the start; those said already are skipped.
                                    break
                                if kind == "unreachable":
                                    raise _proto.Lost(words)
                                raise _proto.error(a)
                except _proto.Lost as e:
                    if self.client._stopping:
                        # mesh.local() closing: its node goes on purpose.
                        raise MeshError("client closed") from None
                    now = time.monotonic()
                    if lost_at is None:
                        lost_at = now
                        _say("mesh: %s went away; waiting up to %d s for it to come back" % (self.client._t.describe(), reconnect))
                    if now - lost_at >= reconnect:
                        raise _proto.Lost("%s is gone: no answer for %d s (%s)" % (self.client._t.describe(), reconnect, e)) from None
                    time.sleep(0.5)
        finally:
            bar.close()

    def __iter__(self):
        return self.as_completed()

    def wait(self, timeout=None, raise_on_error=True, progress=None):
        """Waits for the farm to end; its final :class:`Progress`.

        ``timeout``: seconds, then :class:`TimeoutError` (the farm goes on).
        ``raise_on_error``: :class:`FarmFailed` when not every task succeeded.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        final = None
        try:
            with self.client._exchange({"Wait": {"farm": self.id}}, first_within=None) as x:
                while True:
                    within = None
                    if deadline is not None:
                        within = max(0.0, deadline - time.monotonic())
                    try:
                        a = x.next_answer(within=within)
                    except TimeoutError:
                        raise TimeoutError("%s did not end within %s s" % (self.id, timeout)) from None
                    if a is None:
                        raise MeshError("%s: the node stopped following the farm" % self.id)
                    k = _proto.kind(a)
                    if k == "Progress":
                        p = Progress(a["Progress"])
                        if bar is None:
                            bar = _Bar(progress, p.total, self.id)
                        bar.to(p.ended, p.failed, p.ends_at)
                    elif k == "Finished":
                        final = Progress(a["Finished"])
                        if bar is not None:
                            bar.to(final.ended, final.failed)
                        break
                    elif k == "Error":
                        raise _proto.error(a)
        finally:
            if bar is not None:
                bar.close()
        if raise_on_error and not final.ok:
            raise FarmFailed(final)
        return final

    def gather(self, timeout=None):
        """Waits for the farm, then every task in order (stage, index)."""
        self.wait(timeout=timeout, raise_on_error=False, progress=False)
        return self.tasks()

    def cancel(self):
        """Stops the farm: nothing new starts and running tasks are killed."""
        self.client._ask({"Cancel": {"farm": self.id}}, "Cancelled")

    def grow(self, farm, warn=True, rerun=False):
        """Adds the stages of ``farm`` (a :class:`Farm` in this farm's
        folder) to this open farm while it runs; they may depend on its
        stages by name. Returns once they are durable, as a submit does.
        A task whose result the node keeps is done from the start, unless
        ``rerun``."""
        req = {"Grow": {"farm": self.id, "toml": farm.to_toml(binary=self.client._binary), "file": farm.file, "rerun": rerun}}
        v, warnings = self.client._farm_submitted(farm, req, warn)
        self.total = v["tasks"]
        self.warnings.extend(warnings)

    def hold(self, cancel=False):
        """Holds this open farm open while this process lives (a thread
        keeps a connection to its home): once the last client holding it
        is gone, killed or ended without :meth:`close`, the home closes it
        and it ends once its tasks do, as ``mesh close`` would; with
        ``cancel``, the home cancels it instead (its running tasks are
        killed, none starts after), for work that must not outlive this
        process."""
        t = threading.Thread(target=self._hold, args=(cancel,), name="mesh-hold", daemon=True)
        t.start()

    def _hold(self, cancel):
        lost_at = None
        while True:
            try:
                with self.client._exchange({"Hold": {"farm": self.id, "cancel": cancel}}) as x:
                    while True:
                        a = x.next_answer()
                        lost_at = None
                        k = _proto.kind(a)
                        kind, words = _proto.refusal(a) if k == "Error" else (None, None)
                        if kind == "unreachable":
                            raise _proto.Lost(words)
                        for node in (a.get("Held") or {}).get("gone", ()) if k == "Held" else ():
                            _say("mesh: node %s left the mesh; any task of %s it was running runs again on another node" % (node, self.id))
                        if k != "Held" or not a["Held"]["open"]:
                            # Closed, or not held here (anymore): nothing
                            # more to hold.
                            if k == "Held" or kind == "closed_farm":
                                self.closed_by_home = True
                            return
            except (_proto.Lost, MeshError):
                # The node went away (restarted on its state folder, it
                # carries on with the farm): held again once it is back.
                now = time.monotonic()
                lost_at = lost_at or now
                if now - lost_at >= HOLD_RECONNECT_S:
                    return
                time.sleep(0.5)

    def close(self):
        """No more stages come to this open farm: it ends once its tasks do."""
        req = {"Grow": {"farm": self.id, "toml": "", "file": "", "close": True}}
        self.client._farm_submitted(None, req, warn=False)

    def cancel_task(self, task):
        """Stops one task (``"solve/3"``): it does not start, or is killed;
        the tasks that depend on it are skipped. The rest go on."""
        self.client._ask({"CancelTask": {"farm": self.id, "task": task}}, "Cancelled")

    def progress(self):
        """Where the farm stands now (:class:`Progress`)."""
        return Progress(self.client._ask({"Farm": {"farm": self.id}}, "Farm"))

    def tasks(self, state=None, limit=None):
        """Its tasks, in order: all, or those ``"done"``, ``"failed"`` or
        ``"unfinished"`` (not ended yet, or never to run: skipped,
        cancelled, stopped); at most ``limit``."""
        req = {"Tasks": {"farm": self.id, "state": state, "limit": limit}}
        return [Task(self, ev) for ev in self.client._ask(req, "Tasks")]

    def resume(self, out=None):
        """Makes the node the client talks to the farm's home (its old home is
        gone for good, or the outputs are wanted elsewhere): every output
        is brought to ``out`` there. Nothing finished runs again."""
        if out is not None:
            out = os.path.abspath(os.fspath(out))
            os.makedirs(out, exist_ok=True)
        v = self.client._ask({"Resume": {"farm": self.id, "out": out}}, "Resumed")
        self.id = v["farm"]
        self.total = v["total"]
        return self

    def logs(self, task, attempt=None):
        """``(stdout, stderr)`` of a task by its id (``"solve/3"``)."""
        ev = {"task": task, "stage": task.rsplit("/", 1)[0], "index": 0, "state": "unfinished"}
        return Task(self, ev).logs(attempt)
