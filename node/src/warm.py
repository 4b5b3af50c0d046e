"""A warm Python worker of a mesh node: runs scripts one after another in this interpreter.

The node starts it as `python warm.py` and writes one request a line on
its stdin: {"argv": [script, args...], "cwd", "env", "out", "err"}. It runs
the script as `python script args...` would (as `__main__`, with argv and
its folder on sys.path, stdin empty, stdout and stderr the task's log
files, in `cwd` with `env` added to the node's environment), so modules it
imported stay imported for the next, and answers one line: {"code": N},
the exit code a process would have had.
"""

import json
import os
import runpy
import sys
import traceback


def main():
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    base_env = dict(os.environ)
    base_path = list(sys.path[1:])
    home = os.getcwd()
    for line in requests:
        req = json.loads(line)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        out = os.open(req["out"], flags, 0o644)
        err = os.open(req["err"], flags, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        code = 0
        try:
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(base_env)
            os.environ.update(req["env"])
            argv = req["argv"]
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0]))] + base_path
            runpy.run_path(argv[0], run_name="__main__")
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
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.chdir(home)
        answers.write(json.dumps({"code": code}).encode() + b"\n")


if __name__ == "__main__":
    main()
