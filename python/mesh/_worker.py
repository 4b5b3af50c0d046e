"""Runs one Python function call on a node: ``python mesh_worker.py FN ARGS KEY OUT``.

It is shipped with each farm of function calls as an input, so a node
needs a Python with cloudpickle, not this package. It reads the function
the client pickled (``FN``, a file with the client's Python first, then
the folders the client imports its own modules from, put on the path
where this node sees them, and the files ``upload_file`` shipped) and
its arguments (``ARGS``: base64, or ``@file``), with the values of the
futures it was given read from their result files (under the
task's ``{out}``, where exactly its dependencies are, or beside it for a
value of an earlier farm), calls the function, and writes the value to
``result-KEY.pkl``, an output of the task; in a node's warm worker a
small value is handed back to the node instead (``mesh_warm.hand``) and
rides with the task's report, no file made. An exception is said on stderr:
its type and message on the first line (the cause `mesh status` shows and
failing fast compares), the traceback, and last a line with the pickled
exception for the client to raise.
"""

import base64
import glob
import io
import os
import pickle
import sys
import traceback

#: The first line of a call file: this magic, the client's major.minor.
MAGIC = b"mesh-call 1 "
#: The line on stderr after which the pickled exception follows.
EXCEPTION_MARK = "mesh-exception: "
#: Exit codes: the call raised; this Python cannot run the call.
RAISED = 1
REFUSED = 3


#: Functions a warm worker keeps unpickled, at most.
FUNCTIONS_KEPT = 64

#: What a future given as an argument is pickled as (its persistent id):
#: this tag and the future's key.
FUTURE = "mesh-future"

#: The environment variable naming the files ``upload_file`` shipped with
#: a call (``name=hash;...``, under ``uploads/`` beside this script).
UPLOADS_ENV = "MESHPY_UPLOADS"


def result_name(key):
    return "result-%s.pkl" % key


class _Deps:
    """Where this call finds the values of the futures it was given: in
    memory, those that rode with the farm's log (a warm worker's
    ``mesh_warm.riding``), else as files under ``{out}``, looked up once."""

    def __init__(self, out, home):
        self.out = out
        self.home = home
        warm = sys.modules.get("mesh_warm")
        self.riding = {p.rsplit("/", 1)[-1]: data for p, data in getattr(warm, "riding", {}).items()}
        self.files = None

    def load(self, key):
        name = result_name(key)
        data = self.riding.get(name)
        if data is not None:
            return pickle.loads(data)
        with open(self.find(key, name), "rb") as f:
            return pickle.load(f)

    def find(self, key, name):
        scattered = os.path.join(self.home, "scatter", key + ".pkl")
        if os.path.exists(scattered):
            return scattered
        if self.files is None:
            # One walk of {out}, not a glob per value (a gather of a
            # hundred made a hundred walks of a hundred folders).
            self.files = {}
            if self.out != "-":
                for path in glob.glob(os.path.join(glob.escape(self.out), "*", "*", "result-*.pkl")):
                    self.files.setdefault(os.path.basename(path), path)
        path = self.files.get(name)
        if path is None:
            raise LookupError("the value of future %s is not under %s: it is not among this task's dependencies" % (key, self.out))
        return path


def _loads(body, out, given, home):
    """The call, each future in it replaced by its value: from ``given``
    (the values of an earlier farm's futures, sent with the call), else
    scattered data (an input of the call), else its result file under
    ``out``."""
    values = {}
    deps = _Deps(out, home)

    def persistent_load(pid):
        tag, key = pid
        if tag != FUTURE:
            raise pickle.UnpicklingError("unknown persistent id %r" % (pid,))
        if key in given:
            values[key] = pickle.loads(given.pop(key))
        if key not in values:
            values[key] = deps.load(key)
        return values[key]

    # An instance's hook, not a class made per call (a thin call's cost).
    u = pickle.Unpickler(io.BytesIO(body))
    u.persistent_load = persistent_load
    return u.load()


def _refuse(words):
    sys.stderr.write(words + "\n")
    sys.stderr.flush()
    sys.exit(REFUSED)


def _read_function(path):
    """The function the client pickled, after the header that names its
    Python, and what the client said of it (``path``: its folders)."""
    with open(path, "rb") as f:
        head = f.readline()
        meta = f.readline()
        body = f.read()
    if not head.startswith(MAGIC):
        _refuse("%s is not a function a mesh client wrote" % path)
    theirs = head[len(MAGIC) :].strip().decode()
    ours = "%d.%d" % sys.version_info[:2]
    if theirs != ours:
        _refuse(
            "python %s here (%s) cannot run a call pickled by the client's python %s: "
            "give the nodes the same major.minor (`python=` on the client)" % (ours, sys.executable, theirs)
        )
    import json

    return json.loads(meta), body


def _import_from(meta, home, cache):
    """The client's folders, where this node sees them, and the files it
    uploaded, on the path (a warm worker's path is reset per call); a
    module uploaded again is imported anew."""
    paths = [p for p in meta.get("path", ()) if os.path.isdir(p)]
    uploads = [u.split("=", 1) for u in os.environ.get(UPLOADS_ENV, "").split(";") if "=" in u]
    loaded = cache.setdefault("mesh-uploads", {})
    folder = os.path.join(home, "uploads")
    for name, digest in uploads:
        path = os.path.join(folder, name)
        if name.endswith(".py"):
            if folder not in paths:
                paths.append(folder)
            mods = [name[: -len(".py")]]
        else:
            paths.append(path)
            mods = _modules_in(path)
        for m in mods:
            if loaded.get(m, digest) != digest:
                for k in [k for k in sys.modules if k == m or k.startswith(m + ".")]:
                    del sys.modules[k]
            loaded[m] = digest
    sys.path[1:1] = [p for p in paths if p not in sys.path]


def _modules_in(archive):
    """The top-level modules and packages of a .zip or .egg."""
    import zipfile

    try:
        with zipfile.ZipFile(archive) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile):
        return []
    tops = set()
    for n in names:
        first = n.split("/", 1)[0]
        if first.endswith(".py"):
            tops.add(first[:-3])
        elif "/" in n and not first.endswith((".egg-info", ".dist-info")) and first != "EGG-INFO":
            tops.add(first)
    return sorted(tops)


def _function_key(path):
    """What a function unpickled from ``path`` is kept by in a warm worker:
    the file it came from (a file rewritten is another)."""
    st = os.stat(path)
    return ("mesh-function", st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def main(argv):
    fn_path, args, key, out = argv[1], argv[2], argv[3], argv[4]
    warm = sys.modules.get("mesh_warm")
    # A node's warm worker keeps what it unpickled between calls.
    cache = getattr(warm, "cache", {})
    fn_key = _function_key(fn_path)
    kept = cache.get(fn_key)
    if kept is None:
        meta, fn_body = _read_function(fn_path)
        fn = None
    else:
        fn, meta = kept
    home = os.getcwd()
    _import_from(meta, home, cache)
    try:
        import cloudpickle
    except ImportError:
        _refuse("cloudpickle is not installed in the python here (%s): pip install cloudpickle" % sys.executable)
    try:
        if args.startswith("@"):
            with open(args[1:], "rb") as f:
                body = f.read()
        else:
            body = base64.b64decode(args)
        given = {}
        vals = os.path.join("calls", key + ".vals")
        if os.path.exists(vals):
            with open(vals, "rb") as f:
                given = pickle.load(f)
        if fn is None:
            fn = pickle.loads(fn_body)
            if len(cache) >= FUNCTIONS_KEPT:
                uploads = cache.get("mesh-uploads")
                cache.clear()
                if uploads is not None:
                    cache["mesh-uploads"] = uploads
            cache[fn_key] = (fn, meta)
        args, kwargs, cwd = _loads(body, out, given, home)
        # Where the client ran, where this machine has that folder (the
        # same machine, a shared file system): relative paths and $PWD
        # mean there what they meant to the client, as on a Dask worker
        # started in the job's folder. Else the task's own folder.
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
            os.environ["PWD"] = cwd
        value = fn(*args, **kwargs)
        pickler = pickle if _plain(value) else cloudpickle
        if _big(value):
            # Straight to its file, no copy in memory first: it cannot ride.
            data = None
            _write(os.path.join(home, result_name(key)), lambda f: pickler.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL))
        else:
            data = pickler.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:  # noqa: B902 - the client gets whatever it raised
        sys.stdout.flush()
        first = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
        sys.stderr.write((first[-1] if first else type(e).__name__) + "\n")
        traceback.print_exc()
        try:
            mark = base64.b64encode(cloudpickle.dumps(e)).decode()
        except Exception:
            mark = ""
        sys.stderr.write(EXCEPTION_MARK + mark + "\n")
        sys.stderr.flush()
        sys.exit(RAISED)
    if data is not None:
        if warm is not None and warm.hand(result_name(key), data):
            return
        _write(os.path.join(home, result_name(key)), lambda f: f.write(data))
    # Nothing else reads it: the node may move it where outputs go.
    made = getattr(warm, "made", None)
    if made is not None:
        made(result_name(key))


def _write(path, write):
    """A file at ``path``, whole or not at all."""
    tmp = path + ".part"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


#: A value at least this big is pickled straight into its file.
BIG_BYTES = 1 << 20


def _big(v):
    """A value known to pickle to more than ``BIG_BYTES`` without pickling it."""
    n = v.nbytes if hasattr(v, "nbytes") and isinstance(getattr(v, "nbytes"), int) else len(v) if isinstance(v, (bytes, bytearray, str)) else 0
    return n >= BIG_BYTES


def _plain(v):
    """Values the standard pickle writes as well as cloudpickle, and faster."""
    return type(v) in (int, float, str, bytes, bool, type(None))


if __name__ == "__main__":
    # In a node's warm worker the next call runs main again, not this file.
    _warm = sys.modules.get("mesh_warm")
    if _warm is not None:
        _warm.again = main
    main(sys.argv)
