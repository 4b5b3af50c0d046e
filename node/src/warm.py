"""A warm Python worker of a mesh node: runs scripts one after another in this interpreter.

The node starts it as `python warm.py` and writes one request a line on
its stdin: {"argv": [script, args...], "cwd", "env", "out", "err",
"riding"}. It runs
the script as `python script args...` would (as `__main__`, with argv and
its folder on sys.path, stdin empty, stdout and stderr the task's log
files, in `cwd` with `env` added to the node's environment), so modules it
imported stay imported for the next, and answers one line: {"code": N},
the exit code a process would have had, and {"handed": {name: base64}},
the outputs the script handed back with `mesh_warm.hand` instead of
writing them (at most `hand` bytes each; the node keeps them only when
the task succeeded), and {"made": [name]}, the outputs it wrote only to
be outputs (`mesh_warm.made`), which the node moves instead of copying.
A script finds its dependencies' outputs that rode with the log in
`mesh_warm.riding` (bytes by their path under `{out}`), not as files.
A script that sets `mesh_warm.again` to a function is run again by a
call of it with the next argv (see `run_script`).

Each run is measured (unless the node's environment says
`MESH_MEASURE=0`), the worker's own use before it apart: {"used":
[cpu_ms, peak, read, written]}, its CPU time (user and system, and that
of the children it waited for), the most resident memory it held above
what the worker held when it began, and the bytes of its read and write
calls; and {"worker": [cpu_ms, read, written, rss]}, the worker's totals
after it, what the node subtracts from a dead worker's counts when a run
kills its worker. The processes a run starts are looked at by the node.
"""

import base64
import builtins
import json
import os
import resource
import sys
import time
import traceback

#: Scripts compiled, by the file they were read from (its device, inode,
#: size and modification time: a file rewritten is another): a script run
#: again is not read and compiled again (compiling was two thirds of a
#: thin task's time here).
_CODE = {}
_CODE_MAX = 64
#: A script changed less than this long ago is read again each run.
_RACY_S = 2.0


def run_script(path):
    """Runs the script at ``path`` as ``__main__``, as ``python path`` would.

    A script may say how it is run again: what it sets as
    ``mesh_warm.again`` is kept with its compiled code, and a later run of
    the same code calls it with the new ``sys.argv`` in the module the
    first run made (its imports and definitions as they were) instead of
    running the file again. The Python calls' worker does: making its
    module anew was a tenth of a thin call's time here."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    kept = _CODE.get(key)
    # A file changed within a timestamp's grain of its last change may
    # look unchanged (a coarse clock, an edit in place of the same size):
    # read again while recent, as git does for its "racy" files.
    racy = time.time() - st.st_mtime < _RACY_S
    text = None
    if kept is None or racy:
        with open(path, "rb") as f:
            text = f.read()
    if kept is None or (text is not None and text != kept[0]):
        code = compile(text, path, "exec", dont_inherit=True)
        if len(_CODE) >= _CODE_MAX:
            _CODE.clear()
        # [text, code, the module of its first run, its again]
        kept = [text, code, None, None]
        _CODE[key] = kept
    saved = sys.modules.get("__main__")
    warm = sys.modules.get("mesh_warm")
    try:
        if kept[3] is not None:
            sys.modules["__main__"] = kept[2]
            kept[3](sys.argv)
            return
        main = type(sys)("__main__")
        main.__file__ = path
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        if warm is not None:
            warm.again = None
        try:
            exec(kept[1], main.__dict__)
        finally:
            again = getattr(warm, "again", None)
            if callable(again):
                kept[2], kept[3] = main, again
    finally:
        sys.modules["__main__"] = saved


class Hand:
    """What a script may hand back instead of writing a file: the module
    ``mesh_warm`` a script run here finds in ``sys.modules``."""

    def __init__(self):
        self.max = 0
        self.handed = {}
        self.made = []

    def hand(self, name, data):
        """Takes ``data`` as the task's output ``name`` if it is small
        enough to ride with the task's report; False when the script must
        write it as a file."""
        if self.max <= 0 or len(data) > self.max:
            return False
        self.handed[name] = bytes(data)
        return True

    def made_file(self, name):
        """Says that the output ``name`` was written for the node alone:
        it may be moved where outputs go, not copied (a Python call's big
        value, which nothing else reads)."""
        self.made.append(name)


class Env:
    """The node's environment, and what one request adds to it. What the
    last request added stays set after its run: the next request's values
    are mostly the same (a farm's tasks differ in two or three keys), so
    only the keys that differ are set or put back, and the whole
    environment is put back only when a script changed more than its
    ``PWD`` (setting a key costs a C call and a re-encoding: setting and
    undoing thirteen per task was a fifth of a thin call's time here).
    Nothing runs between two requests but the worker itself."""

    def __init__(self):
        self.base = dict(os.environ)
        # CPython's own encoded copy, compared whole at C speed.
        self.raw = getattr(os.environ, "_data", None)
        if not isinstance(self.raw, dict):
            self.raw = None
        #: What the last request added, as given.
        self.on = {}
        #: The encoded environment its run began with.
        self.entered = None

    def _put_back(self, k):
        if k in self.base:
            os.environ[k] = self.base[k]
        else:
            os.environ.pop(k, None)

    def enter(self, env):
        for k, v in env.items():
            if self.on.get(k) != v:
                os.environ[k] = v
        for k in self.on:
            if k not in env:
                self._put_back(k)
        self.on = dict(env)
        self.entered = dict(self.raw) if self.raw is not None else None

    def leave(self):
        if self.entered is None:
            # No encoded copy to compare (not CPython): all of it put back.
            self.on = {}
            os.environ.clear()
            os.environ.update(self.base)
            return
        # A script may set PWD where it changes folder (the calls' worker does).
        pwd = self.entered.get(b"PWD")
        if self.raw.get(b"PWD") != pwd:
            if pwd is None:
                os.environ.pop("PWD", None)
            else:
                os.environ["PWD"] = os.fsdecode(pwd)
        if self.raw != self.entered:
            os.environ.clear()
            os.environ.update(self.base)
            self.on = {}


class Meter:
    """What one run uses, read from the kernel's counts before and after it.

    CPU and bytes are exact: ``getrusage`` of the worker and of the
    children it waited for, ``rchar`` and ``wchar`` of ``/proc/self/io``
    (which count waited children too). Memory: the worker's high-water
    mark is reset to what it holds as the run begins (``5`` written to
    ``/proc/self/clear_refs``, Linux 4.0 and later), and read after it,
    so the run's peak is the mark less what was held before. The mark is
    read only when the run took a page fault: a run that faulted no page
    in cannot have held more than it began with, and reading
    ``/proc/self/status`` cost more than all the rest.

    The counts a run starts from are read as the worker waits for its
    request, not once it has it (the node waits for no part of them), and
    as few as will do: the children's CPU and the bytes are those the last
    run ended with, and what the worker read and wrote itself since (its
    logs copied, its answer), as nothing else runs between.
    """

    def __init__(self):
        self.on = os.environ.get("MESH_MEASURE") != "0"
        self.page = os.sysconf("SC_PAGE_SIZE")
        # Kept open: opening them was most of measuring's cost. Where one
        # cannot be opened or read, its figures are 0.
        self.io, self.statm, self.status, self.clear = (self._open(n, m) for n, m in (("io", os.O_RDONLY), ("statm", os.O_RDONLY), ("status", os.O_RDONLY), ("clear_refs", os.O_WRONLY)))
        self.before = None
        #: The children's CPU and [rchar, wchar] as the last run ended,
        #: kept up to date until the next starts; None: read them anew.
        self.children = None
        self.after = None
        #: Bytes read for the request: the worker's, not the run's.
        self.request = 0
        self.totals = [0, 0, 0, 0]

    @staticmethod
    def _open(name, mode):
        try:
            return os.open("/proc/self/" + name, mode)
        except OSError:
            return -1

    def _io(self, own):
        """``[rchar, wchar]``; ``own``: with the bytes of this read of
        them (the kernel counts a read once done: the next count says it)."""
        try:
            text = os.pread(self.io, 64, 0)
            io = text.split(None, 4)
            return [int(io[1]) + (len(text) if own else 0), int(io[3])]
        except (OSError, ValueError, IndexError):
            return [0, 0]

    def start(self, getrusage=resource.getrusage):
        if not self.on:
            return
        children, after = self.children, self.after
        self.children = self.after = None
        self.request = 0
        # What is read and written here is the worker's too: counted in
        # the counts the run starts from.
        own = [0, 0]
        try:
            text = os.pread(self.statm, 64, 0)
            own[0] += len(text)
            held = int(text.split(None, 2)[1]) * self.page
        except (OSError, ValueError, IndexError):
            held = 0
        try:
            own[1] += os.write(self.clear, b"5")
            mark = None
        except OSError:
            # Not reset: the mark is the worker's own since it started,
            # the run's only if it rises past it.
            mark = self._marks(own)[0]
        s = getrusage(resource.RUSAGE_SELF)
        if children is None:
            c = getrusage(resource.RUSAGE_CHILDREN)
            children = c.ru_utime + c.ru_stime
        read, wrote = (after[0] + own[0], after[1] + own[1]) if after else self._io(True)
        self.before = (s.ru_utime + s.ru_stime + children, s.ru_minflt + s.ru_majflt, read, wrote, held, mark)

    def _marks(self, own=None):
        """The worker's high-water mark and resident memory now, in bytes;
        ``own``: the bytes of this read are added to its first."""
        try:
            st = os.pread(self.status, 4096, 0)
        except OSError:
            st = b""
        if own is not None:
            own[0] += len(st)
        out = []
        for key in (b"VmHWM:", b"VmRSS:"):
            i = st.find(key)
            out.append(int(st[i + len(key) : st.index(b"kB", i)]) * 1024 if i >= 0 else 0)
        return out

    def end(self, getrusage=resource.getrusage, pread=os.pread):
        """What the run used, as the answer's "used"; None when off."""
        if self.before is None:
            return None
        cpu0, faults0, read0, wrote0, held, mark = self.before
        self.before = None
        s = getrusage(resource.RUSAGE_SELF)
        c = getrusage(resource.RUSAGE_CHILDREN)
        try:
            text = pread(self.io, 64, 0)
            io = text.split(None, 4)
            read, wrote = int(io[1]), int(io[3])
            self.after = [read + len(text), wrote]
        except (OSError, ValueError, IndexError):
            read, wrote = read0, wrote0
        self.children = c.ru_utime + c.ru_stime
        peak, rss = 0, held
        if s.ru_minflt + s.ru_majflt != faults0:
            hwm, rss = self._marks(self.after)
            peak = max(0, (hwm if mark is None or hwm > mark else rss) - held)
        cpu = s.ru_utime + s.ru_stime + self.children
        self.totals = [round(cpu * 1000), read, wrote, rss]
        return [max(0, round((cpu - cpu0) * 1000)), peak, max(0, read - read0 - self.request), max(0, wrote - wrote0)]

    def wrote(self, read, written):
        """The worker read and wrote these bytes itself after a run (its
        logs, its answer): the next run's counts start past them. None
        where it is not known how many: read anew."""
        if read is None or written is None:
            self.after = None
            return
        self.totals[1] += read
        self.totals[2] += written
        if self.after is not None:
            self.after[0] += read
            self.after[1] += written


def scratch():
    """A file of this worker's, unnamed: what a task writes goes there
    first, and becomes its log only if there is any (most thin tasks say
    nothing, and a file made per task was much of their cost)."""
    import tempfile

    return tempfile.TemporaryFile(prefix="mesh-warm-")


def keep(f, fd, path):
    """The task's output on ``fd`` (its scratch ``f``) as its log at
    ``path``, if any; how many bytes there were (0: none)."""
    size = os.lseek(fd, 0, os.SEEK_CUR)
    if size == 0:
        return 0
    os.lseek(fd, 0, os.SEEK_SET)
    # The log's folder is made by the first log written in it, as the
    # node makes it for a task of its own (most thin tasks write none).
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as dst:
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            dst.write(chunk)
    return size


def measure(step):
    """A step of measuring, whose failure (a count unreadable, a
    descriptor of the worker's a script closed) costs the run its figures,
    never its end."""
    try:
        return step()
    except Exception:
        return None


def main():
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    env = Env()
    base_path = list(sys.path[1:])
    home = os.getcwd()
    logs = (scratch(), scratch())
    written = [0, 0]
    hand = Hand()
    meter = Meter()
    warm = type(sys)("mesh_warm")
    warm.hand = hand.hand
    warm.made = hand.made_file
    #: What a script keeps between its runs in this worker (the Python
    #: calls' worker keeps the functions it unpickled).
    warm.cache = {}
    # Read as the worker waits for each request (see Meter).
    measure(meter.start)
    for line in requests:
        meter.request = len(line)
        req = json.loads(line)
        hand.max = req.get("hand", 0)
        hand.handed = {}
        hand.made = []
        warm.riding = {k: base64.b64decode(v) for k, v in req.get("riding", {}).items()}
        for i, (f, fd) in enumerate(zip(logs, (1, 2))):
            if written[i]:
                os.ftruncate(f.fileno(), 0)
                os.lseek(f.fileno(), 0, os.SEEK_SET)
            os.dup2(f.fileno(), fd)
        code = 0
        try:
            os.chdir(req["cwd"])
            env.enter(req["env"])
            argv = req["argv"]
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0]))] + base_path
            sys.modules["mesh_warm"] = warm
            run_script(argv[0])
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        used = measure(meter.end)
        for i, (f, fd, path) in enumerate(zip(logs, (1, 2), (req["out"], req["err"]))):
            try:
                written[i] = keep(f, fd, path)
                meter.wrote(written[i], written[i])
            except OSError:
                # A log that cannot be written (a full disk): the task's
                # end stands; its words are lost with it.
                written[i] = True
                meter.wrote(None, None)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.chdir(home)
        env.leave()
        answer = {"code": code}
        # Whatever the code: the node keeps them when its stage counts it
        # a success.
        if hand.handed:
            answer["handed"] = {k: base64.b64encode(v).decode() for k, v in hand.handed.items()}
        if hand.made:
            answer["made"] = hand.made
        if used is not None:
            answer["used"] = used
            answer["worker"] = meter.totals
        meter.wrote(0, answers.write(json.dumps(answer).encode() + b"\n"))
        measure(meter.start)


if __name__ == "__main__":
    main()
