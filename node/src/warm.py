"""A warm Python worker of a mesh node: runs scripts one after another in this interpreter.

The node starts it as `python warm.py` and writes one request a line on
its stdin: {"argv": [script, args...], "cwd", "env", "out", "err"}. It runs
the script as `python script args...` would (as `__main__`, with argv and
its folder on sys.path, stdin empty, stdout and stderr the task's log
files, in `cwd` with `env` added to the node's environment), so modules it
imported stay imported for the next, and answers one line: {"code": N},
the exit code a process would have had.
"""

import builtins
import json
import os
import sys
import traceback

#: Scripts compiled, by their text: a script run again is not compiled
#: again (compiling was two thirds of a thin task's time here).
_CODE = {}
_CODE_MAX = 64


def run_script(path):
    """Runs the script at ``path`` as ``__main__``, as ``python path`` would."""
    with open(path, "rb") as f:
        text = f.read()
    code = _CODE.get(text)
    if code is None:
        code = compile(text, path, "exec", dont_inherit=True)
        if len(_CODE) >= _CODE_MAX:
            _CODE.clear()
        _CODE[text] = code
    main = type(sys)("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved


def scratch():
    """A file of this worker's, unnamed: what a task writes goes there
    first, and becomes its log only if there is any (most thin tasks say
    nothing, and a file made per task was much of their cost)."""
    import tempfile

    return tempfile.TemporaryFile(prefix="mesh-warm-")


def keep(f, fd, path):
    """The task's output on ``fd`` (its scratch ``f``) as its log at ``path``, if any."""
    size = os.lseek(fd, 0, os.SEEK_CUR)
    if size == 0:
        return
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


def main():
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    base_env = dict(os.environ)
    base_path = list(sys.path[1:])
    home = os.getcwd()
    logs = (scratch(), scratch())
    for line in requests:
        req = json.loads(line)
        for f, fd in zip(logs, (1, 2)):
            os.ftruncate(f.fileno(), 0)
            os.lseek(f.fileno(), 0, os.SEEK_SET)
            os.dup2(f.fileno(), fd)
        code = 0
        try:
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(base_env)
            os.environ.update(req["env"])
            argv = req["argv"]
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0]))] + base_path
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
        for f, fd, path in zip(logs, (1, 2), (req["out"], req["err"])):
            try:
                keep(f, fd, path)
            except OSError:
                # A log that cannot be written (a full disk): the task's
                # end stands; its words are lost with it.
                pass
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.chdir(home)
        answers.write(json.dumps({"code": code}).encode() + b"\n")


if __name__ == "__main__":
    main()
