"""The control protocol: one JSON request a connection, answered by JSON lines.

Two ways to a node (docs/api.md): its control socket, ``<state>/node.sock``,
on the machine it runs on; and, from a machine that runs no node, the
``mesh`` binary as a relay (``mesh --mesh ADDR --mesh-key KEY
control-pipe``), which carries one request's lines over the mesh's own
authenticated connection. Every read has a deadline where an answer is due
at once, so a node that says nothing is an error, never a hang.
"""

import json
import os
import select
import socket
import subprocess
import time

from ._binary import describe
from ._errors import FarmClosed, MeshError, ProtocolError, UnknownFarm


class Lost(MeshError):
    """The node could not be reached, or the connection ended before its last answer."""


class NoNode(Lost):
    """No node runs with the state folder a client was given (``connect()``
    on a machine where no ``mesh node`` or ``mesh join`` is running)."""

#: The control API this package speaks (docs/api.md). A node of another
#: API refuses the package's hello, naming both. 2: a refusal says its kind;
#: 3: function calls are sent as data (``Calls``, answered ``Named`` first).
API = 3

#: How long a connection waits for a node that is starting on its state
#: folder to open its socket (as the command line waits).
START_WAIT_S = 60.0

#: How long a connection waits for a ``mesh node`` or ``mesh join`` process
#: of its state folder that has not marked itself starting yet (between its
#: exec and its first step; see node/src/launched.rs). With no such process,
#: a connection fails at once.
LAUNCH_WAIT_S = 10.0

#: How long a connection waits on a process caught in the middle of an
#: exec, which may be a node.
EXEC_WAIT_S = 1.0

#: Answers after which the node says nothing more on a connection.
_LAST = {
    "Finished",
    "Error",
    "Submitted",
    "Status",
    "Allocs",
    "Cancelled",
    "Farm",
    "List",
    "Resumed",
    "Hello",
    "Checked",
    "Invalid",
    "Tasks",
}


def kind(answer):
    """The variant of an answer: ``{"Submitted": {...}}`` is ``Submitted``."""
    if isinstance(answer, dict) and len(answer) == 1:
        return next(iter(answer))
    if isinstance(answer, str):
        return answer
    raise ProtocolError("the node sent an answer of no known shape: %r" % (answer,))


def last(answer):
    k = kind(answer)
    if k == "Log":
        return bool(answer["Log"].get("done"))
    return k in _LAST


#: The kinds of refusal (docs/api.md) this package answers with an
#: exception of their own; every other kind is a plain :class:`MeshError`.
#: ``lagged`` (a reader cut off, who may ask again) and ``unreachable`` (a
#: relay, ``mesh control-pipe``, that reached no node: :class:`Lost` where
#: a follower waits for its node to come back) are read where they are
#: acted on.
_RAISED_AS = {
    "unknown_farm": UnknownFarm,
    "closed_farm": FarmClosed,
    "other_api": ProtocolError,
}


def refusal(answer):
    """``(kind, message)`` of an ``Error`` answer, ``{"Error": {"kind":
    "unknown_farm", "message": "..."}}``: the kind to act on, the words to
    show. A node (or relay) of control API 1 said words only, ``{"Error":
    "words"}``: its kind is None, and the client acts on none of it."""
    e = answer["Error"]
    if isinstance(e, dict):
        return e.get("kind"), str(e.get("message", ""))
    return None, str(e)


def error(answer, prefix=""):
    """The exception an ``Error`` answer raises, chosen by its kind, with
    its words after ``prefix``."""
    kind, message = refusal(answer)
    return _RAISED_AS.get(kind, MeshError)(prefix + message)


class _Lines:
    """Lines read from a file descriptor, each before a deadline."""

    def __init__(self, fd, read):
        self._fd = fd
        self._read = read
        self._buf = b""
        self._eof = False

    def readline(self, deadline=None):
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl], self._buf[nl + 1 :]
                return line
            if self._eof:
                line, self._buf = self._buf, b""
                return line or None
            wait = None
            if deadline is not None:
                wait = deadline - time.monotonic()
                if wait <= 0:
                    raise TimeoutError("the node did not answer in time")
            ready, _, _ = select.select([self._fd], [], [], wait)
            if not ready:
                continue
            try:
                chunk = self._read(1 << 16)
            except ConnectionResetError:
                # The node went mid-answer: as the end of the connection.
                chunk = b""
            if not chunk:
                self._eof = True
            else:
                self._buf += chunk


class Transport:
    """How to open a connection to a node."""

    def open(self):
        raise NotImplementedError

    def describe(self):
        raise NotImplementedError


class SocketTransport(Transport):
    """The control socket of a node on this machine."""

    def __init__(self, state_dir):
        self.state_dir = os.path.abspath(os.path.expanduser(state_dir))
        self.path = os.path.join(self.state_dir, "node.sock")
        self.starting_path = os.path.join(self.state_dir, "node.starting")

    def describe(self):
        return "the node with state folder %s" % self.state_dir

    def open(self):
        # A node that is starting here (its process id in node.starting,
        # until its socket listens) is waited for, as the command line does.
        until = time.monotonic() + START_WAIT_S
        launched_until = time.monotonic() + LAUNCH_WAIT_S
        exec_until = time.monotonic() + EXEC_WAIT_S
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.path)
                return _SocketConn(s)
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                now = time.monotonic()
                if self._starting():
                    waiting = now < until
                else:
                    seen = _node_process_on(self.state_dir)
                    waiting = (seen == "node" and now < launched_until) or (
                        seen == "exec" and now < exec_until
                    )
                if waiting:
                    time.sleep(0.02)
                    continue
                raise NoNode(
                    "no mesh node is running with state folder %s: start one with "
                    "`mesh node` (or `mesh join ADDR`), or use mesh.local() for a "
                    "throwaway node" % self.state_dir
                ) from None
            except OSError as e:
                s.close()
                raise MeshError("cannot reach %s: %s" % (self.describe(), e)) from None

    def _starting(self):
        """Whether a live process is starting a node on this state folder."""
        try:
            with open(self.starting_path) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            return False
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except PermissionError:
            return True
        except OSError:
            return False
        return True


#: What /proc shows of a process in the middle of an exec (no arguments yet).
_EXEC = object()


def _node_process_on(state_dir):
    """"node" when a ``mesh node`` or ``mesh join`` process of this state
    folder lives (Linux's /proc; elsewhere, never): one that has not marked
    itself starting yet; "exec" when a process in the middle of an exec may
    be one (the parent of a vfork, as ``subprocess`` does, runs on from
    there); else None. As node/src/launched.rs, which says why."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    ours = os.path.realpath(state_dir)
    seen = None
    for pid in pids:
        if int(pid) == os.getpid():
            continue
        theirs = _node_state("/proc/" + pid)
        if theirs is None:
            continue
        if theirs is _EXEC:
            seen = "exec"
        elif theirs == "" or os.path.realpath(theirs) == ours:
            return "node"
    return seen


def _in_exec(proc_dir):
    """No arguments, and neither a kernel thread (parent 2) nor a zombie."""
    try:
        with open(proc_dir + "/stat") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 1:].split()
    if len(fields) < 2:
        return False
    pid = stat.split(" ", 1)[0]
    return fields[0] not in ("Z", "X", "x") and fields[1] not in ("0", "2") and pid != "2"


def _node_state(proc_dir):
    """The state folder of the process at ``proc_dir`` if it is a mesh node,
    '' when it is one whose folder cannot be told, else None."""
    try:
        with open(proc_dir + "/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        if not args:
            return _EXEC if _in_exec(proc_dir) else None
    except OSError:
        return None
    if not args or os.path.basename(args[0]) != "mesh":
        return None
    flag = command = None
    rest = iter(args[1:])
    for a in rest:
        if a == "--state-dir":
            flag = next(rest, None)
        elif a.startswith("--state-dir="):
            flag = a[len("--state-dir="):]
        elif not a.startswith("-") and command is None:
            command = a
    if command not in ("node", "join"):
        return None
    try:
        cwd = os.readlink(proc_dir + "/cwd")
    except OSError:
        cwd = None
    try:
        with open(proc_dir + "/environ", "rb") as f:
            env = dict(
                kv.decode(errors="replace").split("=", 1)
                for kv in f.read().split(b"\0")
                if b"=" in kv
            )
    except OSError:
        env = None
    if flag:
        if os.path.isabs(flag):
            return flag
        return os.path.join(cwd, flag) if cwd else ""
    if env is None or cwd is None:
        return ""
    # The rule its `mesh` followed, as the binary says it in its environment
    # and folder. One that cannot say is a folder not told, waited for a
    # little as one may be ours.
    try:
        return describe(env=env, cwd=cwd)["state_dir"]
    except MeshError:
        return ""


class _SocketConn:
    def __init__(self, sock):
        self._sock = sock
        self._lines = _Lines(sock.fileno(), sock.recv)

    def send(self, data):
        self._sock.sendall(data)

    def readline(self, deadline):
        return self._lines.readline(deadline)

    def why_ended(self):
        return "the node closed the connection"

    def close(self):
        try:
            self._sock.close()
        except OSError:
            pass


class PipeTransport(Transport):
    """A node of a mesh reached through the ``mesh`` binary as a relay."""

    def __init__(self, binary, addr, key):
        self.binary = binary
        self.addr = addr
        self.key = key

    def describe(self):
        return "the mesh at %s" % self.addr

    def open(self):
        args = [self.binary, "--mesh", self.addr]
        if self.key is not None:
            args += ["--mesh-key", self.key]
        args.append("control-pipe")
        env = dict(os.environ)
        for v in ("MESH_ADDR", "MESH_KEY", "MESH_LOG"):
            env.pop(v, None)
        try:
            p = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as e:
            raise MeshError("cannot run %s: %s" % (self.binary, e)) from None
        return _PipeConn(p)


class _PipeConn:
    def __init__(self, proc):
        self._p = proc
        fd = proc.stdout.fileno()
        self._lines = _Lines(fd, lambda n: os.read(fd, n))

    def send(self, data):
        try:
            self._p.stdin.write(data)
            self._p.stdin.close()
        except BrokenPipeError:
            pass

    def readline(self, deadline):
        return self._lines.readline(deadline)

    def why_ended(self):
        try:
            self._p.wait(timeout=5)
            err = self._p.stderr.read().decode("utf-8", "replace").strip()
        except subprocess.TimeoutExpired:
            err = ""
        if "unrecognized subcommand" in err:
            return (
                "%s has no control-pipe: it is older than this package; use "
                "the mesh binary of this package's version" % self._p.args[0]
            )
        return err or "the relay to the mesh ended without an answer"

    def close(self):
        if self._p.poll() is None:
            self._p.terminate()
            try:
                self._p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._p.kill()
                self._p.wait()
        for f in (self._p.stdout, self._p.stderr):
            try:
                f.close()
            except OSError:
                pass


class Exchange:
    """One request and its answers, read one by one.

    ``first_within``: seconds the node has to say its first line (None:
    no limit, for an answer that comes when work is done); later lines
    may take as long as they take.
    """

    def __init__(self, transport, request, first_within=None):
        self._transport = transport
        self._conn = transport.open()
        self._done = False
        self._first = True
        self._first_within = first_within
        try:
            self._conn.send((json.dumps(request) + "\n").encode("utf-8"))
        except OSError as e:
            self.close()
            raise MeshError("cannot send to %s: %s" % (transport.describe(), e)) from None

    def __iter__(self):
        return self

    def __next__(self):
        a = self.next_answer()
        if a is None:
            raise StopIteration
        return a

    def next_answer(self, within=None):
        """The next answer, ``None`` after the last. ``within``: seconds."""
        if self._done:
            return None
        deadline = None
        if within is not None:
            deadline = time.monotonic() + within
        elif self._first and self._first_within is not None:
            deadline = time.monotonic() + self._first_within
        try:
            line = self._conn.readline(deadline)
        except TimeoutError:
            if within is not None:
                raise
            self.close()
            raise MeshError(
                "%s said nothing within %s s" % (self._transport.describe(), self._first_within)
            ) from None
        self._first = False
        if line is None:
            why = self._conn.why_ended()
            self.close()
            raise Lost("%s: %s" % (self._transport.describe(), why))
        try:
            answer = json.loads(line)
        except ValueError:
            self.close()
            raise ProtocolError(
                "%s sent something that is not JSON: %r" % (self._transport.describe(), line[:200])
            ) from None
        if last(answer):
            self.close()
        return answer

    def close(self):
        if not self._done:
            self._done = True
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ask(transport, request, within=60):
    """The one answer to a request that is answered at once."""
    with Exchange(transport, request, first_within=within) as x:
        a = x.next_answer()
        return a
