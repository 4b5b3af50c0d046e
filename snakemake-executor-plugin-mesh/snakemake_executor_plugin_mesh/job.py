"""The jobs of one task of `snakemake --executor mesh`, as a mesh node runs them.

Run as ``python job.py TASK STAGE`` by a node's warm Python worker (a
stage's ``python`` command: the interpreter is kept between tasks), in
the task's folder. TASK and STAGE are JSON (in base64 where a farm file
would read their braces as placeholders): the task's arguments to
Snakemake and what its jobs make, and what the stage's tasks share (the
workflow folder, the arguments every job gets, the proof of the
submitter's folder, the sources archive).

- **Snakemake imported once.** Snakemake's remote job (``snakemake
  --mode remote``, what every remote executor runs) runs in a child forked
  from this worker, which imported Snakemake, ran one small job to warm
  up, and imports what each child imported and compiles the expressions
  it compiled: each job starts from a clean copy of that state, not from
  a fresh interpreter (most of a thin job's second), and exits as a
  process of its own would, its exit code this task's.
- **Several thin jobs, one Snakemake.** A task of several jobs (chosen by
  the plugin) runs them in one Snakemake (``--keep-going``), takes each
  one's end from that Snakemake's scheduler, and says each in its stdout;
  some done and some failed is ``MIXED_CODE``, which the stage counts a
  success so that the outputs of those done come home.
- **In place, or in a copy, never stale.** The jobs run in the workflow
  folder only where this node sees the submitter's folder, proved by a
  nonce that the workflow's Snakemake wrote (an earlier copy of the folder
  has no such file). Elsewhere they run in this task's folder, where the
  node put their declared inputs (fetched and hash-checked by the mesh)
  and the workflow's sources (an archive, unpacked once per node and
  run); their outputs, logs and benchmarks go to ``.mesh-out/<task>/``,
  which the mesh brings to the workflow's folder. A failed job's logs are
  written to stdout, encoded, for the plugin to put in place.
- Lines starting ``mesh-snakemake-`` in stdout are for the plugin: the
  time Snakemake ran (a rule's cost), the failed command's exit code, each
  job's end.

Nothing here imports the plugin or mesh: a node needs Snakemake only.
"""

import base64
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

#: Lines of stdout that carry a failed staged job's log file back.
LOG_MARK = "mesh-snakemake-log "
#: The most bytes of a log file carried back that way.
LOG_MAX = 4 << 20
#: Lines of stdout that say how each job of a task of several ended.
RESULT_MARK = "mesh-snakemake-result "
#: The line that says where they ran (in place, or in a copy).
WHERE_MARK = "mesh-snakemake-where "
#: The line that says how long the jobs' Snakemake ran (seconds, its
#: interpreter's start aside): what the plugin learns a rule's cost from.
COST_MARK = "mesh-snakemake-cost "
#: The line that says the exit code of the command a failed job ran (its
#: shell line's, its script's), not its Snakemake's 1.
EXIT_MARK = "mesh-snakemake-exit "
#: A task of several jobs some of which failed (each said in its
#: stdout): counted a success by its stage, so that the outputs of the
#: others are brought home.
MIXED_CODE = 75


def sees(wd, nonce):
    """Whether this node sees the submitter's workflow folder itself."""
    if not nonce:
        return True
    rel, value = nonce
    try:
        with open(os.path.join(wd, rel)) as f:
            return f.read() == value
    except OSError:
        return False


def unpack(here, archive):
    """The workflow's sources in ``here``, once per node and farm: files
    already there (the job's inputs, fetched fresher) are kept."""
    import fcntl
    import tarfile

    marker = os.path.join(here, archive + ".unpacked")
    if os.path.exists(marker):
        return
    with open(os.path.join(here, archive + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(marker):
            return
        with tarfile.open(os.path.join(here, archive)) as tar:
            for m in tar.getmembers():
                dest = os.path.join(here, m.name)
                if os.path.lexists(dest) or m.name.startswith("/") or ".." in m.name.split("/"):
                    continue
                try:
                    tar.extract(m, here, filter="data")
                except TypeError:
                    tar.extract(m, here)
        with open(marker, "w"):
            pass


def _learned(before):
    """What a child made that the worker can make too, for the next job's
    child to find made: the modules of installed packages it imported,
    and the regular expressions it compiled (Snakemake compiles a dozen
    per job, a third of its parse of the Snakefile)."""
    import re

    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix} - {""})
    mods = []
    for name, mod in list(sys.modules.items()):
        if name in before[0]:
            continue
        f = getattr(mod, "__file__", None)
        if f and f.startswith(prefixes):
            mods.append(name)
    patterns = []
    for key in list(getattr(re, "_cache", {})):
        if key in before[1] or len(key) < 3 or not isinstance(key[1], str):
            continue
        if isinstance(key[2], int):
            patterns.append([key[1], key[2]])
    return {"mods": mods, "re": patterns}


def _learn(what):
    """The modules and expressions a child made, made here."""
    import importlib
    import re

    for name in what.get("mods", ()):
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:
                pass
    for pattern, flags in what.get("re", ()):
        try:
            re.compile(pattern, flags)
        except Exception:
            pass


#: A workflow of one job, run once per worker before its first job: what
#: Snakemake imports and compiles as it runs a job is then in the worker,
#: and each job's child starts with it (and its time is its own).
WARM_SNAKEFILE = """
rule warm:
    output: "warm.txt"
    shell: "echo warm > {output}"
"""


def warm():
    """Snakemake imported in this worker, and run once (a job of its own,
    in a child): None when it cannot be imported here."""
    try:
        import snakemake.cli  # noqa: F401
    except Exception:
        return None
    cli = sys.modules["snakemake.cli"]
    if not getattr(cli, "_mesh_warm", False):
        cli._mesh_warm = True
        # Snakemake's plugin registries (each a scan of every folder of
        # sys.path, made once per process) and its argument parser's
        # imports, here once rather than in every job's child.
        try:
            cli.get_argument_parser()
        except Exception:
            pass
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mesh-snakemake-warm-") as d:
            with open(os.path.join(d, "Snakefile"), "w") as f:
                f.write(WARM_SNAKEFILE)
            args = ["--snakefile", "Snakefile", "--cores", "1", "--quiet", "all", "--nolock", "--force", "--mode", "remote", "--target-jobs", "warm:"]
            saved = os.dup(1), os.dup(2)
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                # Its words are nobody's: not in the first job's log.
                os.dup2(null, 1)
                os.dup2(null, 2)
                fork_run(cli, args, d, {})
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in (null,) + saved:
                    os.close(fd)
    return cli


def fork_run(cli, argv, cwd, env, results=None, several=False):
    """Snakemake's ``main(argv)`` in a child of this worker; its exit code."""
    import re

    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    before = (set(sys.modules), set(getattr(re, "_cache", {})))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.chdir(cwd)
            os.environ.update(env)
            sys.argv = ["snakemake"] + argv
            watched = several and watch_jobs(results)
            codes = watch_commands()
            try:
                cli.main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            try:
                said = _learned(before)
                if codes:
                    said["exit"] = codes[-1]
                if watched:
                    said["ok"] = sorted(results["ok"])
                    said["failed"] = sorted(results["failed"])
                data = json.dumps(said).encode()
                while data:
                    data = data[os.write(w, data):]
            except Exception:
                pass
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:
                pass
            os._exit(code & 0xFF if isinstance(code, int) else 1)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    try:
        said = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        said = {}
    _learn(said)
    if said.get("exit") is not None and results is not None:
        results["exit"] = said["exit"]
    if results is not None and "ok" in said:
        results["ok"].update(said["ok"])
        results["failed"].update(said["failed"])
        results["watched"] = True
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def run_snakemake(stage, argv, cwd, results=None, several=False):
    env = dict(stage.get("env") or {})
    pre = stage.get("pre")
    cli = None if pre else warm()
    if cli is not None:
        return fork_run(cli, argv, cwd, env, results, several)
    # A precommand to run first (a storage plugin's install, say), or no
    # Snakemake in this interpreter: a process of its own.
    line = " ".join(shlex.quote(a) for a in [stage.get("py") or sys.executable, "-m", "snakemake"] + argv)
    if pre:
        line = "%s && %s" % (pre, line)
    full = dict(os.environ)
    full.update(env)
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.call(["/bin/sh", "-c", line], cwd=cwd, env=full)


def key_of(job):
    """A job as both Snakemake processes name it: its rule and wildcards."""
    specs = job.get_target_spec()
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    return ";".join(
        "%s:%s" % (s.rulename, ",".join("%s=%s" % kv for kv in sorted(s.wildcards_dict.items()))) for s in specs
    )


def watch_jobs(results):
    """Each job's end as the child's Snakemake decides it: a job reported
    finished to its scheduler (``_proceed``, what an executor's
    ``finish_callback`` is) is done unless it then failed (its outputs
    checked: ``_handle_error``). False where this Snakemake has neither."""
    cls = None
    for name in ("snakemake.scheduling.job_scheduler", "snakemake.scheduler"):
        try:
            module = __import__(name, fromlist=["JobScheduler"])
            cls = module.JobScheduler
            proceed, handle_error = cls._proceed, cls._handle_error
            break
        except (ImportError, AttributeError):
            cls = None
    if cls is None:
        return False

    def keys(job):
        try:
            return [key_of(j) for j in (job.jobs if job.is_group() else [job])]
        except Exception:
            return []

    def _proceed(self, job, *a, **kw):
        results["ok"].update(keys(job))
        return proceed(self, job, *a, **kw)

    def _handle_error(self, job, *a, **kw):
        results["failed"].update(keys(job))
        return handle_error(self, job, *a, **kw)

    cls._proceed = _proceed
    cls._handle_error = _handle_error
    return True


def watch_commands():
    """The exit codes of the commands that failed in this process (a job's
    shell line, its script: Snakemake raises CalledProcessError with it),
    newest last."""
    codes = []
    init = subprocess.CalledProcessError.__init__

    def __init__(self, returncode, *a, **kw):
        if isinstance(returncode, int):
            codes.append(returncode)
        init(self, returncode, *a, **kw)

    subprocess.CalledProcessError.__init__ = __init__
    return codes


def stage_out(here, jobs, ok):
    """Jobs run in a copy: the products of those that succeeded to
    ``.mesh-out/<task>/`` (the stage's outputs, which the mesh brings
    home); the logs of those that failed to stdout, encoded."""
    dest = os.path.join(here, ".mesh-out", os.environ.get("MESH_TASK_ID", "task"))
    if os.path.lexists(dest):
        shutil.rmtree(dest)
    dirs = []
    for job in jobs:
        if not ok(job):
            continue
        for rel in job.get("products") or []:
            src = os.path.join(here, rel)
            # A link comes home as the file it points to (a link to the
            # other node's folder would point nowhere there): the file is
            # copied in its place before its target may be moved.
            if os.path.islink(src) and os.path.isfile(src):
                tmp = src + ".mesh-copy"
                shutil.copy2(src, tmp)
                os.replace(tmp, src)
    for job in jobs:
        if not ok(job):
            for rel in job.get("logs") or []:
                p = os.path.join(here, rel)
                if os.path.isfile(p):
                    with open(p, "rb") as f:
                        data = f.read(LOG_MAX)
                    sys.stdout.write(
                        "\n%s%s %s\n" % (LOG_MARK, base64.b64encode(rel.encode()).decode(), base64.b64encode(data).decode())
                    )
            continue
        for rel in job.get("products") or []:
            src = os.path.join(here, rel)
            if not os.path.lexists(src):
                continue
            to = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(to), exist_ok=True)
            if os.path.isdir(src) and not os.path.islink(src):
                dirs.append(rel)
            shutil.move(src, to)
    if dirs:
        # Directories (a checkpoint's): made at home even when empty.
        os.makedirs(dest, exist_ok=True)
        with open(os.path.join(dest, ".mesh-dirs"), "w") as f:
            f.write("\n".join(dirs))
    sys.stdout.flush()


def main(argv):
    # A task of several jobs has its JSON in base64 (a farm file reads
    # braces as placeholders; a sweep's values are not read that way).
    task = json.loads(base64.b64decode(argv[1]) if argv[3:4] == ["b64"] else argv[1])
    stage = json.loads(base64.b64decode(argv[2]))
    wd = stage["wd"]
    here = os.getcwd()
    args = shlex.split(stage["args"]) + shlex.split(task["args"])
    jobs = task["jobs"]
    if sees(wd, stage.get("nonce")):
        where, cwd = "in place", wd
        waits = task.get("wait") or []
        if waits:
            args += ["--wait-for-files"] + waits
    elif not stage.get("archive"):
        sys.stderr.write(
            "mesh: this node does not see the workflow folder %s (the workflow's proof of it, %s, is not "
            "there), and the workflow's sources could not be brought: run the workflow from a folder that "
            "holds its Snakefile, or on nodes that share the folder\n" % (wd, stage.get("nonce", ["?"])[0])
        )
        return 1
    else:
        where, cwd = "in a copy", here
        sys.stderr.write("mesh: this node does not see the workflow folder %s: the job runs in a copy of its inputs (%s)\n" % (wd, here))
        unpack(here, stage["archive"])
    results = {"ok": set(), "failed": set()}
    warm()
    began = time.monotonic()
    code = run_snakemake(stage, args, cwd, results, several=len(jobs) > 1)
    sys.stdout.write("\n%s%.3f\n" % (COST_MARK, time.monotonic() - began))
    if code != 0 and len(jobs) == 1 and results.get("exit") is not None:
        sys.stdout.write("%s%d\n" % (EXIT_MARK, results["exit"]))
    watched = results.pop("watched", False)

    def ok(job):
        if len(jobs) == 1 or not watched:
            return code == 0
        return job["key"] in results["ok"] and job["key"] not in results["failed"]

    if where != "in place":
        stage_out(here, jobs, ok)
    if len(jobs) > 1:
        for job in jobs:
            sys.stdout.write("%s%s %s\n" % (RESULT_MARK, "ok" if ok(job) else "failed", base64.b64encode(job["key"].encode()).decode()))
        sys.stdout.write("%s%s\n" % (WHERE_MARK, where))
        sys.stdout.flush()
        n_ok = sum(1 for j in jobs if ok(j))
        if 0 < n_ok < len(jobs):
            # Some done, some failed, each said above: the task counts as
            # done, so that the outputs of those done are brought home.
            return MIXED_CODE
        return 0 if n_ok == len(jobs) else (code or 1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
