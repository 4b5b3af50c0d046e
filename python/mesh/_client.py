"""Clients of a node: on this machine, through a mesh, or a throwaway one."""

import collections
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from . import _proto
from ._binary import describe, mesh_binary
from ._errors import FarmError, MeshError, ProtocolError
from ._farm import Farm
from ._run import Run, FarmInfo

#: Seconds a node has to answer the hello, and any request answered at once.
ANSWER_WITHIN_S = 30


def default_state_dir(binary=None):
    """The state folder the ``mesh`` command uses here, as it says
    (``mesh describe --json``): ``$MESH_STATE_DIR``, else the user's data
    folder's ``mesh``. ``binary``: as :func:`mesh_binary` finds it."""
    return describe(binary)["state_dir"]


class Client:
    """A connection to a node (see :func:`connect`)."""

    def __init__(self, transport, within=ANSWER_WITHIN_S, python=None, resume=False, binary=None):
        self._t = transport
        self._within = within
        #: The ``mesh`` program whose farm text this client writes (the
        #: order of a stage's fields); None: :func:`mesh_binary`'s.
        self._binary = binary
        self.node = None
        self.version = None
        #: The Python that runs this client's functions on the nodes
        #: (default: this interpreter's path where a node has it, else
        #: ``python3``).
        self.python = _checked_python(python)
        #: Values of earlier runs are reused and a dead client's calls
        #: adopted (see :func:`connect`); by default, as in Dask, never.
        self.resume = bool(resume)
        #: The client stops its own node (``mesh.local()`` closing): a
        #: follower that loses it says nothing of its going.
        self._stopping = False
        self._fns = None
        self._fns_lock = threading.Lock()
        self._closed = False
        self._hello()

    def _hello(self):
        a = _proto.ask(self._t, {"Hello": {"api": _proto.API}}, within=self._within)
        k = _proto.kind(a)
        if k == "Hello":
            self.node = a["Hello"]["node"]
            self.version = a["Hello"]["version"]
            return
        if k == "Error":
            kind, e = _proto.refusal(a)
            if kind is None:
                # Words with no kind: a node of control API 1, which says
                # so of a hello of another version, or older still, which
                # cannot read a hello at all (`bad request: unknown variant
                # Hello`). Either is older than this package.
                raise ProtocolError(
                    "%s is older than the control API %d this package speaks: use a mesh "
                    "of this package's version (%s)" % (self._t.describe(), _proto.API, e)
                )
            raise _proto.error(a)
        raise ProtocolError("%s answered the hello with %s" % (self._t.describe(), k))

    # ----- requests -----

    def _ask(self, request, expect):
        a = _proto.ask(self._t, request, within=self._within)
        return self._expect(a, expect)

    def _expect(self, a, expect):
        k = _proto.kind(a)
        if k == expect:
            return a[k]
        if k == "Error":
            raise _proto.error(a)
        raise ProtocolError("expected %s from the node, got %s" % (expect, k))

    def _exchange(self, request, first_within=ANSWER_WITHIN_S):
        return _proto.Exchange(self._t, request, first_within=first_within)

    def _farm_request(self, farm, check=False, rerun=None, open=False):
        req = {
            "toml": farm.to_toml(binary=self._binary),
            "file": farm.file,
            "out": farm.out,
            "cwd": os.getcwd(),
            "check": check,
            "open": open,
        }
        if rerun is not None:
            req["rerun"] = [rerun] if isinstance(rerun, str) else list(rerun)
        return {"SubmitFarm": req}

    def _farm_answer(self, farm, request, named=None):
        """The answer to a request that submits or grows a farm, with the
        warnings before it; ``named`` (a ``Calls`` request's) is given each
        call's task as soon as the node says them."""
        warnings = []
        # Reading a big params file and hashing inputs take their time
        # before the node answers: no deadline on the first line.
        with self._exchange(request, first_within=None) as x:
            for a in x:
                k = _proto.kind(a)
                if k == "Warning":
                    warnings.append(a["Warning"])
                    continue
                if k == "Named" and named is not None:
                    named(a["Named"]["tasks"])
                    continue
                if k == "Invalid":
                    i = a["Invalid"]
                    raise FarmError(
                        i["message"],
                        file=i.get("file"),
                        line=i.get("line"),
                        column=i.get("column"),
                        field=i.get("field"),
                        text=None if farm is None or farm._text is not None else farm.to_toml(binary=self._binary),
                    )
                if k == "Error":
                    if _proto.refusal(a)[0] == "closed_farm":
                        raise _proto.error(a, "the node refused the stages: ")
                    raise _proto.error(a, "the node refused the farm: ")
                return k, a[k], warnings
        raise MeshError("the node closed the connection before answering")

    def check(self, farm):
        """Has the node check a farm, as ``mesh check`` does; runs nothing.

        Returns ``{"name", "out", "tasks", "stages", "warnings"}``; a mistake
        raises :class:`FarmError`.
        """
        k, v, warnings = self._farm_answer(farm, self._farm_request(farm, check=True))
        if k != "Checked":
            raise ProtocolError("expected Checked from the node, got %s" % k)
        v = dict(v)
        v["stages"] = dict(v["stages"])
        v["warnings"] = warnings
        return v

    def submit(self, fn, *args, key=None, pure=True, resources=None, retries=None, priority=0, **kwargs):
        """Runs ``fn(*args, **kwargs)`` on the mesh: its :class:`Future`, as
        Dask's ``client.submit``. Futures among the arguments (in lists,
        tuples and dicts too) are its dependencies: it runs once they are
        done, with their values. ``key``: the call's name (default: the
        function's name and a hash of the call); ``pure``: the same call
        gives the same future, and its value is reused from an earlier
        farm where one is kept; ``resources``: what the task holds
        (``{"gpu": 1}``); ``retries``: failures allowed.

        Given a :class:`Farm` or a farm file's path, submits the farm
        (``rerun=``, ``warn=``) and returns its :class:`Run`.
        """
        if isinstance(fn, (Farm, str, os.PathLike)):
            if args:
                raise TypeError("submit(farm) takes no more arguments")
            return self._submit_farm(fn, **kwargs)
        return self._functions().call(fn, args, kwargs, key=key, pure=pure, resources=resources, retries=retries, priority=priority)

    def _functions(self):
        with self._fns_lock:
            if self._closed:
                raise MeshError("client closed")
            if self._fns is None:
                from ._functions import Functions

                state = getattr(self._t, "state_dir", None)
                if state is None:
                    raise MeshError(
                        "Python functions need a node on this machine (mesh.connect() or mesh.local()): "
                        "their calls and values are files of its farms' folder"
                    )
                root = os.path.join(state, "functions", uuid.uuid4().hex[:16])
                os.makedirs(root, exist_ok=True)
                self._fns = Functions(self, root, self.python, resume=self.resume)
            return self._fns

    def futures(self, farm):
        """The futures of a farm of Python calls submitted earlier, by any
        client (its id, as ``future._run.id`` or ``mesh status`` shows it):
        a dict by key, done ones with their values, the rest resolving as
        they end. A script that died gets its results back this way, or by
        submitting the same calls again (``pure=True``)."""
        return self._functions().of_farm(self.run(farm))

    def gather(self, futures, errors="raise"):
        """The values of futures (one, or lists, tuples and dicts of them,
        in the same shape), as Dask's ``client.gather``."""
        from ._functions import gather

        return gather(futures, errors=errors)

    def scatter(self, data, broadcast=False, hash=True, direct=None, workers=None):
        """Futures of data, as Dask's ``client.scatter``: one future for
        one object, a list (or dict) of futures for a list (or dict) of
        them. Each is done at once; a call given it reads the data on the
        node it runs on, where it is brought once (by hash), however many
        calls there use it. ``broadcast``, ``direct`` and ``workers`` are
        taken for Dask's sake: data goes where calls need it."""
        fns = self._functions()
        if isinstance(data, dict):
            return {k: fns.scatter(v, hash=hash) for k, v in data.items()}
        if isinstance(data, (list, tuple, set, frozenset)):
            fs = [fns.scatter(v, hash=hash) for v in data]
            return tuple(fs) if isinstance(data, tuple) else fs
        return fns.scatter(data, hash=hash)

    def upload_file(self, filename, load=True):
        """Ships a ``.py``, ``.zip`` or ``.egg`` to the nodes, as Dask's
        ``client.upload_file``: every call sent from now on, on any node
        (one that joins later too), can import it; one uploaded again is
        imported anew. ``load`` is taken for Dask's sake: a node imports
        it when a call does."""
        self._functions().upload_file(filename)

    def get(self, dsk, keys, resources=None, retries=None, sync=True, **kwargs):
        """Runs a Dask graph, each task a call, and returns the values of
        ``keys`` (a key, or lists of keys) in the same shape: Dask's
        scheduler ``get``, so ``dask.compute(x, scheduler=client.get)``
        and ``x.compute(scheduler=client.get)`` run on the mesh."""
        from . import _graphs
        from ._functions import gather

        got = _graphs.futures_of(self, dsk, resources=resources, retries=retries)
        out = _graphs.nested(keys, got)
        return gather(out) if sync else out

    def compute(self, collections, sync=False, optimize_graph=True, resources=None, retries=None, **kwargs):
        """Futures of Dask collections' results (``dask.delayed``, a
        ``dask.bag``...), as Dask's ``client.compute``: one for one
        collection, a list for a list. ``sync=True``: their values."""
        from . import _graphs

        single = not isinstance(collections, (list, tuple))
        cs = [collections] if single else list(collections)
        out = [_graphs.computed(self, c, optimize_graph, resources, retries) for c in cs]
        if sync:
            out = [f.result() for f in out]
        return out[0] if single else out

    def persist(self, collections, optimize_graph=True, resources=None, retries=None, **kwargs):
        """Dask collections whose tasks are calls under way, as Dask's
        ``client.persist``: the same collections, each key's future in
        its graph, for a later ``compute`` or graph to build on."""
        from . import _graphs

        single = not isinstance(collections, (list, tuple))
        cs = [collections] if single else list(collections)
        out = _graphs.persisted(self, cs, optimize_graph, resources, retries)
        return out[0] if single else out

    def get_executor(self, **defaults):
        """A :class:`concurrent.futures.Executor` whose calls run on the
        mesh, each with ``defaults`` (``resources=``, ``retries=``, ...)."""
        from ._functions import Executor

        return Executor(self, **defaults)

    def _submit_farm(self, farm, rerun=None, warn=True, open=False):
        """Submits a :class:`Farm` (or a farm file's path); returns its :class:`Run`.

        The node checks it first: a mistake raises :class:`FarmError` and
        nothing runs. ``rerun``: stages (or ``True`` for all) run again even
        where earlier results could be reused. ``open``: the farm takes
        more stages while it runs (:meth:`Run.grow`), and ends once closed
        (:meth:`Run.close`).
        """
        if isinstance(farm, (str, os.PathLike)):
            farm = Farm.from_toml(farm)
        if rerun is True:
            rerun = []
        v, warnings = self._farm_submitted(farm, self._farm_request(farm, rerun=rerun, open=open), warn)
        return Run(self, v["farm"], total=v["tasks"], warnings=warnings)

    def _farm_submitted(self, farm, request, warn, named=None):
        """A request that submits or grows a farm (``farm``: its stages,
        ``None`` for a close or calls): its ``Submitted`` answer and the
        warnings before it, said on stderr with ``warn``."""
        k, v, warnings = self._farm_answer(farm, request, named)
        if k != "Submitted":
            raise ProtocolError("expected Submitted from the node, got %s" % k)
        if warn:
            for w in warnings:
                print("warning: %s" % w, file=sys.stderr)
        return v, warnings

    def map(self, command, *iterables, **options):
        """One call or task per element of the iterables (zipped, as Python's ``map``).

        Given a function, ``map(fn, *iterables, key=None, pure=True,
        resources=None, retries=None, priority=0, batch_size=None,
        **kwargs)`` is a list of :class:`Future`, one per element, as
        Dask's ``client.map``: ``key`` may be a list of keys, and every
        other keyword goes to the function, as Dask passes it.

        Given a command, it is one farm, ``map(command, *iterables,
        name=None, out=None, root=None, shell=False, stage="map",
        **stage_options)``: ``command`` is a command line, split as a shell
        would (no shell runs it unless ``shell=True``), or a list of
        arguments; ``{0}``, ``{1}``... stand for the element of each
        iterable, and ``{}`` for the next one (for the only one, with one
        iterable), in the command and in ``workdir``, ``inputs``,
        ``outputs`` and ``env``; the farm file's placeholders, ``{index}``,
        ``{out}``, work too. Any other keyword is a stage option
        (``resources=``, ``workdir=``, ``inputs=``, ``outputs=``, ``env=``,
        ``retries=``, ...). ``name``, ``out`` and ``root`` are the farm's
        (see :class:`Farm`); the stage is ``map``. Returns the :class:`Run`.
        """
        if callable(command):
            return self._map_function(command, iterables, **options)
        return self._map_command(command, iterables, **options)

    def _map_command(self, command, iterables, name=None, out=None, root=None, shell=False, stage="map", **stage_options):
        if not iterables:
            raise ValueError("map needs at least one iterable of values")
        lists = [list(it) if not isinstance(it, range) else it for it in iterables]
        n = len(lists[0])
        for i, l in enumerate(lists[1:], 1):
            if len(l) != n:
                raise ValueError("map's iterables differ in length: 0 has %d values, %d has %d" % (n, i, len(l)))
        if n == 0:
            raise ValueError("map of nothing: the iterables are empty")
        names = ["arg%d" % i for i in range(len(lists))]
        if shell:
            if not isinstance(command, str):
                raise TypeError("with shell=True the command is one line")
            fields = {"shell": _positional(command, names)}
        else:
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            fields = {"command": [_positional(os.fspath(a) if isinstance(a, os.PathLike) else str(a), names) for a in argv]}
        # `{0}` in a workdir or an output names the same value as in the command.
        for k in ("workdir", "inputs", "outputs", "env"):
            if k in stage_options:
                stage_options[k] = _positional_in(stage_options[k], names)
        sweep = dict(zip(names, lists))
        extra_sweep = stage_options.pop("sweep", None)
        if extra_sweep:
            sweep.update(extra_sweep)
        farm = Farm(name or _map_name(fields), out=out, root=root)
        farm.stage(stage, sweep=sweep, sweep_mode="zip" if len(sweep) > 1 else None, **fields, **stage_options)
        return self.submit(farm)

    def _map_function(self, fn, iterables, key=None, pure=True, resources=None, retries=None, priority=0, batch_size=None, **kwargs):
        # Only Dask's own keywords are the map's: everything else is the
        # function's (`name=`, `out=`... included), as Dask passes them.
        if not iterables:
            raise ValueError("map needs at least one iterable of values")
        calls = list(zip(*[list(it) for it in iterables]))
        if isinstance(key, (list, tuple)):
            if len(key) != len(calls):
                raise ValueError("map has %d keys for %d calls" % (len(key), len(calls)))
            keys = list(key)
        elif isinstance(key, str):
            keys = ["%s-%d" % (key, i) for i in range(len(calls))]
        else:
            keys = [None] * len(calls)
        fns = self._functions()
        # One pickle of the function for the whole map (its globals as
        # they are now), one batch for its calls.
        pickled = fns.pickled_function(fn)
        cwd = os.getcwd()
        with fns.hold():
            fs = [
                fns.call(fn, a, kwargs, key=k, pure=pure, resources=resources, retries=retries, priority=priority, pickled=pickled, cwd=cwd)
                for a, k in zip(calls, keys)
            ]
        return fs

    def run(self, farm):
        """The :class:`Run` of a farm submitted earlier (its id, id prefix or name)."""
        v = self._ask({"Farm": {"farm": farm}}, "Farm")
        return Run(self, v["id"], total=v["counts"]["total"])

    def farms(self):
        """Every farm of the mesh this node or its coordinator knows, in short."""
        return [FarmInfo(v) for v in self._ask("List", "List")]

    def status(self):
        """The mesh as ``mesh status --json`` shows it (a dict)."""
        return self._ask("Status", "Status")

    def allocs(self):
        """The mesh's allocation queues (``mesh alloc list``): the book the
        node keeps a copy of, as a dict (``queues``, each with its ``def``:
        cores, memory, GPUs, limits)."""
        return self._ask("Allocs", "Allocs")

    def close(self):
        """Stops sending calls; nothing else stays open between requests.
        What was sent runs on; a call made after raises ``MeshError``."""
        with self._fns_lock:
            self._closed = True
            fns = self._fns
        if fns is not None:
            fns.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<mesh.Client %s, node %s>" % (self._t.describe(), self.node)


_PLACE = re.compile(r"\{\{|\}\}|\{(\d*)\}")


def _positional(text, names):
    """``{}`` and ``{N}`` as the sweep variables ``{argN}``; every other brace as written.

    ``{}`` counts on as in ``str.format``, except that with one iterable
    each ``{}`` is its element."""
    auto = iter(range(len(names))) if len(names) > 1 else iter(lambda: 0, None)

    def sub(m):
        if m.group(0) in ("{{", "}}"):
            return m.group(0)
        i = int(m.group(1)) if m.group(1) else next(auto, len(names))
        if i >= len(names):
            raise ValueError("%r names value %d, but map has %d iterables" % (text, i, len(names)))
        return "{%s}" % names[i]

    return _PLACE.sub(sub, text)


def _positional_in(v, names):
    if isinstance(v, str):
        return _positional(v, names)
    if isinstance(v, (list, tuple)):
        return [_positional_in(x, names) for x in v]
    if isinstance(v, dict):
        return {k: _positional_in(x, names) for k, x in v.items()}
    return v


def _map_name(fields):
    words = fields.get("command") or shlex.split(fields.get("shell", "map"))
    prog = os.path.basename(words[0]) if words else "map"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", prog).strip(".-") or "map"
    return name


def connect(state_dir=None, mesh=None, key=None, binary=None, within=ANSWER_WITHIN_S, python=None, resume=False):
    """A :class:`Client` of a node.

    ``connect()``: the node on this machine (``state_dir``, default the
    one ``mesh`` uses). ``connect(mesh="/ip4/10.0.0.5/tcp/7070", key=PATH)``:
    a node of a mesh, from a machine that runs none, through the ``mesh``
    binary as a relay (``binary``, ``$MESH_BIN`` or on PATH); ``key``: the
    mesh secret (default: mesh.key in the state folder). ``python``: the
    Python that runs this client's functions on the nodes.

    ``resume``: as Dask, a client never gets a value computed by another
    client or an earlier run. With ``resume=True`` it does: a call whose
    function and arguments pickle to the same bytes as one the node kept
    the value of is done at once from it, and a call still running in the
    farm of a client that died is followed there instead of run twice. It
    assumes the functions depend only on their arguments (no file, clock,
    random state or global read that the call's bytes do not show).
    """
    mesh = mesh or None
    if mesh is not None:
        if key is None:
            key = os.environ.get("MESH_KEY") or os.path.join(state_dir or default_state_dir(binary), "mesh.key")
        t = _proto.PipeTransport(mesh_binary(binary), mesh, os.path.abspath(os.path.expanduser(key)))
    else:
        t = _proto.SocketTransport(state_dir or default_state_dir(binary))
    return Client(t, within=within, python=python, resume=resume, binary=binary)


def _checked_python(python):
    """``python=`` as given, once this machine is seen to have it: a path
    that is a file, or a name on PATH. A Python that is not here is refused
    at once rather than left for the nodes to replace."""
    if python is None:
        return None
    p = os.fspath(python)
    found = os.path.isfile(p) if os.sep in p else shutil.which(p) is not None
    if not found or (os.sep in p and not os.access(p, os.X_OK)):
        raise MeshError("python=%r: no such interpreter on this machine" % p)
    return p


def farms(**connect_args):
    """Every farm of the mesh, as :meth:`Client.farms` (``connect()`` first)."""
    return connect(**connect_args).farms()


class LocalNode(Client):
    """A throwaway node (see :func:`local`); stopped by :meth:`stop`."""

    def __init__(self, proc, state_dir, tmp, address, lines, reader, python=None, resume=False, binary=None):
        self.proc = proc
        self._reader = reader
        self.state_dir = state_dir
        self.address = address
        self._tmp = tmp
        self._log = lines
        super().__init__(_proto.SocketTransport(state_dir), python=python, resume=resume, binary=binary)

    @property
    def log(self):
        """What the node has printed."""
        return list(self._log)

    def stop(self):
        """Stops the node (its tasks with it) and removes its state folder."""
        self._stopping = True
        if self._fns is not None:
            self._fns.close()
        p = self.proc
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._reader.join(timeout=5)
        p.stdout.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def close(self):
        self.stop()


def _die_with_parent():
    """In the child, before exec: on Linux, a SIGTERM when this process dies,
    so a node of a Python killed outright does not outlive it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except Exception:
            pass


def local(cpus=None, resources=None, state_dir=None, binary=None, listen="/ip4/127.0.0.1/tcp/0", join=None, key=None, args=(), start_within=60, python=None, resume=False):
    """Starts a node on this machine for a notebook or a test; a :class:`Client` of it.

    Use it with ``with``: the node stops (its running tasks too) at the end,
    and its state folder (a temporary one unless ``state_dir``) goes. ``cpus``:
    the cores it offers (default: all); ``resources``: more, as
    ``mesh node --resources`` takes them (``"gpu=1,token=4"`` or a dict).
    ``join``: the address of a node whose mesh it joins, with ``key`` the
    mesh secret's file. ``resume``: as :func:`connect`'s (with a
    ``state_dir`` of its own, a notebook that comes back gets the values
    of its earlier runs).
    """
    python = _checked_python(python)
    b = mesh_binary(binary)
    tmp = None
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mesh-local-")
        state_dir = tmp.name
    state_dir = os.path.abspath(state_dir)
    os.makedirs(state_dir, exist_ok=True)
    env = dict(os.environ)
    for v in ("MESH_ADDR", "MESH_KEY", "MESH_STATE_DIR"):
        env.pop(v, None)
    try:
        if key is not None:
            shutil.copyfile(key, os.path.join(state_dir, "mesh.key"))
            os.chmod(os.path.join(state_dir, "mesh.key"), 0o600)
        elif not os.path.exists(os.path.join(state_dir, "mesh.key")):
            r = subprocess.run([b, "--state-dir", state_dir, "init"], env=env, capture_output=True, text=True, timeout=start_within)
            if r.returncode != 0:
                raise MeshError("mesh init failed: %s" % r.stderr.strip())
        res = []
        if cpus is not None:
            res.append("cpu=%s" % cpus)
        if isinstance(resources, dict):
            res += ["%s=%s" % kv for kv in resources.items()]
        elif resources:
            res.append(resources)
        cmd = [b, "--state-dir", state_dir]
        cmd += ["join", join] if join else ["node"]
        cmd += ["--listen", listen]
        if res:
            cmd += ["--resources", ",".join(res)]
        cmd += list(args)
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    except BaseException:
        if tmp is not None:
            tmp.cleanup()
        raise
    # The node's lines, the last of them: a node may run for days.
    lines = collections.deque(maxlen=1000)
    seen = threading.Event()

    def read():
        for raw in proc.stdout:
            lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
            if " listening on " in lines[-1]:
                seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + start_within
    address = None
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                time.sleep(0.1)
                raise MeshError("the node exited (code %s): %s" % (proc.returncode, "\n".join(list(lines)[-20:])))
            if seen.wait(0.05) and address is None:
                address = next((l.split(" listening on ", 1)[1] for l in lines if " listening on " in l), None)
            if address is not None:
                try:
                    return LocalNode(
                        proc, state_dir, tmp, address, lines, reader, python=python, resume=resume, binary=b
                    )
                except _proto.NoNode:
                    # Its socket is not there yet: asked again.
                    pass
            time.sleep(0.05)
        raise MeshError("the node did not start within %s s: %s" % (start_within, "\n".join(list(lines)[-20:])))
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
        proc.stdout.close()
        if tmp is not None:
            tmp.cleanup()
        raise
