"""snakemake --executor mesh: a workflow's jobs as tasks of one open farm, grown as Snakemake finds jobs ready.

Snakemake hands the executor the jobs that are ready (``run_jobs``); the
workflow run has one open farm on the node (docs/design/open-farm.md),
grown by stages of ``python`` tasks that a node's warm Python worker runs
with ``job.py`` (Snakemake's own remote job, forked from a Snakemake
imported once). A job's asks are fitted to the mesh as ``--cores`` fits
them to a machine (``_fit``); thin jobs go several to a task by their
rule's measured cost (``_pack``); a job runs in the workflow folder where
the node proves it sees it, else in a copy the mesh brings (``job.py``).
Jobs end in Snakemake's eyes as their tasks end (a follower of the farm's
events), and a job the mesh cannot run (unplaceable, cancelled, its node
gone for good) is reported failed, in words. Ctrl-C, SIGTERM and SIGHUP
cancel the workflow's tasks; each task's output is written to
``.snakemake/mesh_logs/<rule>/`` and is in ``mesh logs TASK --farm FARM``.
"""

import asyncio
import base64
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncGenerator, List, Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from snakemake_interface_executor_plugins.executors.real import RealExecutor
from snakemake_interface_executor_plugins.utils import encode_target_jobs_cli_args, format_cli_arg, join_cli_args

from . import _fit, _pack
from . import job as _job_script

#: Seconds between looks at the farm as a whole (tasks that will never
#: run: unplaceable, cancelled), besides the events of tasks that ended.
LOOK_S = 2.0
#: Seconds the mesh's answers about the nodes are taken as still true.
CAPACITY_S = 5.0
#: A job with more inputs to bring than this has a stage of its own (its
#: inputs listed), others share one (an input a sweep variable).
INPUT_SLOTS_MAX = 16
#: Input files a job's input folder may hold to be brought as files.
FOLDER_FILES_MAX = 10000
#: A source file larger than this is left out of the sources brought
#: (Snakemake's own limit for its source archive).
SOURCE_MAX = 10_000_000


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    address: Optional[str] = field(
        default=None,
        metadata={
            "help": "A node of the mesh to send the jobs to, from a machine that runs none "
            "(a login node): its address, as `mesh node` prints it (/ip4/10.0.0.5/tcp/7070). "
            "Default: the node running on this machine.",
            "env_var": True,
            "required": False,
        },
    )
    key: Optional[str] = field(
        default=None,
        metadata={
            "help": "The mesh secret's file, with --mesh-address (default: mesh.key in the state folder).",
            "env_var": True,
            "required": False,
        },
    )
    state_dir: Optional[str] = field(
        default=None,
        metadata={
            "help": "The state folder of the node on this machine (default: the one `mesh` uses, $MESH_STATE_DIR).",
            "env_var": False,
            "required": False,
        },
    )
    farm_name: str = field(
        default="snakemake",
        metadata={"help": "The name the workflow's farms have in `mesh status`.", "required": False},
    )
    lost_after: int = field(
        default=60,
        metadata={
            "help": "Seconds the mesh node may go unanswered (restarting, say) before the workflow's "
            "running jobs are counted failed and no more are sent.",
            "required": False,
        },
    )


common_settings = CommonSettings(
    non_local_exec=True,
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    pass_default_storage_provider_args=True,
    pass_default_resources_args=True,
    pass_envvar_declarations_to_cmd=True,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=0,
)

#: Snakemake's own words when a job's command fails: its exit code.
_EXIT_STATUS = re.compile(rb"returned non-zero exit status (\d+)")


class _Ready:
    """A job fitted to the mesh, on its way to a task."""

    __slots__ = ("job", "res", "cores", "timeout", "shape", "rule", "packable", "info")

    def __init__(self, job, res, cores, timeout):
        self.job = job
        self.res = res
        self.cores = cores
        self.timeout = timeout
        self.shape = (tuple(sorted((k, _fit.mesh_amount(k, v)) for k, v in res.items())), timeout)
        group = job.is_group()
        self.rule = "group" if group else job.rule.name
        # A group job, or a job with a time limit of its own, goes alone.
        self.packable = not group and timeout is None
        self.info = None


def _timeout_of(job):
    """``runtime`` (minutes, Snakemake's unit) as the task's timeout in seconds, or None."""
    try:
        r = job.resources.get("runtime") if job.resources else None
    except Exception:
        r = None
    if isinstance(r, bool) or not isinstance(r, (int, float)) or r <= 0:
        return None
    return max(1, int(round(r * 60)))


class Executor(RemoteExecutor):
    def __post_init__(self):
        try:
            import mesh
        except ImportError:
            raise WorkflowError(
                "snakemake --executor mesh needs the mesh client in this Python (`import mesh` failed): "
                "pip install ./python from the mesh repository, then run snakemake again"
            ) from None
        self._mesh = mesh
        s = self.workflow.executor_settings
        self.where = "the mesh node at %s" % s.address if s.address else "the mesh node of this machine"
        try:
            self.client = mesh.connect(state_dir=s.state_dir, mesh=s.address, key=s.key)
        except mesh.MeshError as e:
            raise WorkflowError(self._unreachable_words(e)) from None
        self.farm_name = s.farm_name
        self.lost_after = max(1, int(s.lost_after or 60))
        self.batches = 0
        #: The workflow run's open farm, made by the first batch.
        self.run = None
        self.logdir = os.path.abspath(os.path.join(".snakemake", "mesh_logs"))
        self.workdir = os.path.abspath(self.workflow.workdir_init)
        #: This workflow run's files for the mesh: its nonce, the job
        #: script, the sources archive, and the farm's output folder.
        self.rundir = os.path.join(self.workdir, ".snakemake", "mesh", uuid.uuid4().hex[:12])
        self.out = os.path.join(self.rundir, "out")
        self._shared_parts = None
        #: The outputs of the checkpoints that ended (every job's, elsewhere).
        self._checkpoint_outputs = []
        # Set when a task of ours ends: the status check comes then, not
        # after Snakemake's poll interval (10 s by default).
        self._ended = threading.Event()
        #: Tasks that ended, by task id, as the farm's events said.
        self._done = {}
        self._done_lock = threading.Lock()
        #: Why the follower stopped (the node gone for good), in words.
        self._follow_error = None
        self._capacity = None
        self._capacity_at = 0.0
        self._warned = set()
        self._looked_at = 0.0
        #: What a job of each rule costs (thin jobs go several to a task).
        self._costs = _pack.Costs()
        #: Jobs of rules not seen yet, waiting for their probes.
        self._deferred = _pack.Deferred()
        #: Growing the farm: from run_jobs and from the status thread.
        self._grow_lock = threading.RLock()
        #: Jobs a task runs, by task id: [SubmittedJobInfo].
        self._task_jobs = {}
        self._terminate_set = False
        self._cancelled = False
        #: Deferred jobs already reported failed (their send was refused).
        self._ended_infos = set()
        self._hangup()

    # ----- words -----

    def _unreachable_words(self, e):
        s = self.workflow.executor_settings
        if s.address:
            return (
                "snakemake --executor mesh: cannot reach the mesh node at %s (--mesh-address): %s. "
                "Check the address `mesh node` printed there and the key (--mesh-key)." % (s.address, e)
            )
        if isinstance(e, self._mesh.NoNode):
            where = self._state_dir_words()
            return (
                "snakemake --executor mesh: no mesh node is running on this machine (state folder: %s). "
                "Start one with `mesh node &` (and `mesh join ADDR &` on other machines), "
                "or send the jobs to a node elsewhere with --mesh-address ADDR --mesh-key FILE." % where
            )
        return "snakemake --executor mesh: cannot reach %s: %s" % (self.where, e)

    def _words(self, e):
        """A client error in Snakemake users' words (not a Python user's:
        no mesh.local() advice)."""
        if isinstance(e, self._mesh.Lost):
            s = self.workflow.executor_settings
            if s.address:
                return "the mesh node at %s does not answer" % s.address
            return "no mesh node runs with state folder %s any more" % self._state_dir_words()
        return str(e)

    def _state_dir_words(self):
        """The node's state folder: --mesh-state-dir, else the one `mesh`
        says it uses here (asked by the client when it connected)."""
        s = self.workflow.executor_settings
        if s.state_dir:
            return s.state_dir
        try:
            return self._mesh.default_state_dir()
        except self._mesh.MeshError as e:
            return "(the default, which %s)" % e

    def _warn_once(self, name, words):
        if name not in self._warned:
            self._warned.add(name)
            self.logger.warning("mesh: " + words)

    # ----- submitting -----

    def run_job(self, job: JobExecutorInterface):
        self.run_jobs([job])

    def run_jobs(self, jobs: List[JobExecutorInterface]):
        for job in jobs:
            self.run_job_pre(job)
        if self._follow_error is not None:
            for job in jobs:
                self.report_job_error(SubmittedJobInfo(job), msg=self._follow_error + ".\n")
            return
        cap = self._mesh_capacity()
        ready = []
        for job in jobs:
            try:
                res, cores = _fit.fit(job, cap, self._warn_once)
            except _fit.Unfit as e:
                self.report_job_error(
                    SubmittedJobInfo(job),
                    msg="the mesh cannot run it: %s (%s).\n" % (e, self.where),
                )
                continue
            ready.append(_Ready(job, res, cores, _timeout_of(job)))
        if not ready:
            return
        self._terminate()
        with self._grow_lock:
            units, deferred = self._pack(ready, cap)
            if not self._send(units):
                return
            for r in deferred:
                self._deferred.add(r.rule, r)
                r.info = SubmittedJobInfo(r.job, external_jobid="%s (waiting to be packed)" % self.run.id, aux={"task": None})
                self.report_job_submission(r.info)

    def _pack(self, ready, cap):
        """The ready jobs as tasks (lists of jobs), and those that wait for
        their rule's probes (see _pack)."""
        units, deferred = [], []
        by = {}
        for r in ready:
            if r.packable:
                by.setdefault((r.shape, r.rule, r.job.attempt), []).append(r)
            else:
                units.append([r])
        for (shape, rule, _), rs in by.items():
            slots = cap.slots(dict(shape[0])) if cap.known else 1
            if not self._costs.known(rule):
                probes = max(1, slots)
                units.extend([r] for r in rs[:probes])
                deferred.extend(rs[probes:])
                continue
            k = self._costs.size(rule, len(rs), slots)
            units.extend(_pack.chunks(rs, k))
        return units, deferred

    def _flush_deferred(self, everything=False):
        """Deferred jobs whose rule is known now (or that waited long enough) sent."""
        if not len(self._deferred):
            return
        with self._grow_lock:
            ready = self._deferred.ready(self._costs, everything=everything)
            if not ready:
                return
            cap = self._mesh_capacity()
            units = []
            for rule, rs in ready.items():
                by = {}
                for r in rs:
                    by.setdefault((r.shape, r.job.attempt), []).append(r)
                for (shape, _), group in by.items():
                    slots = cap.slots(dict(shape[0])) if cap.known else 1
                    units.extend(_pack.chunks(group, self._costs.size(rule, len(group), slots)))
            self._send(units)

    def _send(self, units):
        """Grows the farm by a task per unit (a stage for each batch of
        several, a stage per shape for those alone); False when the mesh
        refused them (each job then reported failed)."""
        if not units:
            return True
        mesh = self._mesh
        shared = self._shared()
        self.batches += 1
        farm = mesh.Farm(self.farm_name, out=self.out, root=self.workdir)
        singles = {}
        where = []
        n = 0
        for unit in units:
            if len(unit) == 1:
                r = unit[0]
                spec, inputs = self._task_spec(unit)
                # Those alone share a stage per shape and count of inputs to
                # bring (a sweep variable each); many inputs: a stage alone.
                c = len(inputs)
                key = (r.shape, c) if c <= INPUT_SLOTS_MAX else (r.shape, c, id(r))
                singles.setdefault(key, []).append((unit, spec, inputs))
                continue
            spec, inputs = self._task_spec(unit)
            name = "jobs%d-%d" % (self.batches, n)
            n += 1
            res, timeout = unit[0].shape
            farm.stage(
                name,
                # Base64: a farm file reads braces as placeholders.
                python=[sys.executable, shared["script"], base64.b64encode(spec.encode()).decode(), shared["stage"], "b64"],
                inputs=list(shared["inputs"]) + [_literal(f) for f in inputs],
                outputs=[".mesh-out/{stage}/{index}/**/*"],
                resources=dict(res),
                success_codes=[0, _job_script.MIXED_CODE],
                max_fails=0,
            )
            where.append((unit, "%s/0" % name))
        for key, js in singles.items():
            (res, timeout), count = key[0], key[1]
            name = "jobs%d-%d" % (self.batches, n)
            n += 1
            sweep = {"job": [spec for _, spec, _ in js]}
            inputs = list(shared["inputs"])
            if count > INPUT_SLOTS_MAX:
                inputs += [_literal(f) for f in js[0][2]]
            else:
                for i in range(count):
                    sweep["i%d" % i] = [ins[i] for _, _, ins in js]
                    inputs.append("{i%d}" % i)
            farm.stage(
                name,
                python=[sys.executable, shared["script"], "{job}", shared["stage"]],
                sweep=sweep,
                sweep_mode="zip" if len(sweep) > 1 else None,
                inputs=inputs,
                outputs=[".mesh-out/{stage}/{index}/**/*"],
                resources=dict(res),
                timeout=timeout,
                max_fails=0,
            )
            for i, (unit, _, _) in enumerate(js):
                where.append((unit, "%s/%d" % (name, i)))
        try:
            if self.run is None:
                # Snakemake has decided these must run: nothing is reused.
                run = self.client.submit(farm, rerun=True, warn=False, open=True)
                # A Snakemake killed without its shutdown: the home cancels
                # the farm, its jobs with it.
                run.hold(cancel=True)
                threading.Thread(target=self._follow, args=(run,), name="mesh-follow", daemon=True).start()
                self.run = run
            else:
                run = self.run
                # Nor here: Snakemake decided these must run.
                run.grow(farm, warn=False, rerun=True)
        except mesh.MeshError as e:
            words = self._refused_words(e)
            for unit in units:
                for r in unit:
                    if r.info is not None:
                        # A deferred job, counted running: no more.
                        self._forget(r.info)
                        self._ended_infos.add(id(r.info))
                    self.report_job_error(r.info or SubmittedJobInfo(r.job), msg=words)
            return False
        for unit, task in where:
            self._task_jobs[task] = unit
            for r in unit:
                aux = {"task": task, "ready": r}
                if r.info is None:
                    r.info = SubmittedJobInfo(r.job, external_jobid="%s %s" % (run.id, task), aux=aux)
                    self.report_job_submission(r.info)
                else:
                    # A deferred job, already counted submitted.
                    r.info.aux.update(aux)
                    r.info.external_jobid = "%s %s" % (run.id, task)
        return True

    def _forget(self, info):
        with self.lock:
            if info in self.active_jobs:
                self.active_jobs.remove(info)

    def _refused_words(self, e):
        # The node's words say what it could not do (a folder it does not
        # see, an input it cannot read).
        return "%s refused the job: %s\n" % (self.where, self._words(e))

    # ----- what a job's task is -----

    def _rel(self, path):
        """``path`` relative to the workflow folder, or None where it is
        outside it (not to be brought: a node that does not see it cannot
        have it)."""
        p = os.path.normpath(os.path.join(self.workdir, str(path)))
        rel = os.path.relpath(p, self.workdir)
        # A farm refuses a path with `..` anywhere in it.
        if rel == "." or ".." in rel or os.path.isabs(rel):
            return None
        return rel

    def _shared(self):
        """What every job's task shares, made once a workflow run: the job
        script, the nonce proving the submitter's folder, the sources
        archive, and the arguments every job's Snakemake gets."""
        if self._shared_parts is not None:
            return self._shared_parts
        os.makedirs(self.rundir, exist_ok=True)
        script = os.path.join(self.rundir, "job.py")
        shutil.copyfile(_job_script.__file__, script)
        nonce_value = uuid.uuid4().hex
        nonce = os.path.join(self.rundir, "nonce")
        with open(nonce, "w") as f:
            f.write(nonce_value)
        archive = self._sources_archive()
        f = self.workflow.spawned_job_args_factory
        general = f.general_args(executor_common_settings=self.common_settings)
        snakefile = self._rel(self.workflow.main_snakefile) or self.workflow.main_snakefile
        args = " ".join(
            a
            for a in [
                "--snakefile %s" % shlex.quote(snakefile),
                general,
                " ".join(self.additional_general_args()),
                "--mode remote",
            ]
            if a
        )
        stage = {
            "wd": self.workdir,
            "nonce": [self._rel(nonce), nonce_value],
            "args": args,
            "py": self.get_python_executable(),
        }
        env = self.envvars() if self.common_settings.pass_envvar_declarations_to_cmd else {}
        if env:
            stage["env"] = {k: str(v) for k, v in env.items()}
        pre = f.precommand(executor_common_settings=self.common_settings)
        if pre:
            stage["pre"] = pre
        inputs = [self._rel(script), self._rel(nonce)]
        if archive is not None:
            stage["archive"] = self._rel(archive)
            inputs.append(self._rel(archive))
        self._shared_parts = {
            "script": self._rel(script),
            # Base64: a farm file reads braces as placeholders.
            "stage": base64.b64encode(json.dumps(stage).encode()).decode(),
            "inputs": inputs,
        }
        return self._shared_parts

    def _sources_archive(self):
        """The workflow's sources (Snakefile, included files, scripts, config,
        files git knows) as one archive, for nodes that do not see the
        workflow folder; None where Snakemake cannot list them."""
        import logging

        quiet = logging.getLogger("snakemake.logging")
        was = quiet.disabled
        try:
            # It says "not a git repository" where the workflow is not in
            # one: only the files it found matter here.
            quiet.disabled = True
            sources = sorted(self.workflow.dag.get_sources())
        except Exception as e:
            quiet.disabled = was
            self.logger.warning("mesh: the workflow's sources cannot be listed (%s): jobs run only on nodes that see the workflow folder" % e)
            return None
        finally:
            quiet.disabled = was
        path = os.path.join(self.rundir, "sources.tar")
        with tarfile.open(path, "w") as tar:
            for f in sources:
                rel = self._rel(f)
                if rel is None or rel.startswith(os.path.join(".snakemake", "")):
                    continue
                full = os.path.join(self.workdir, rel)
                try:
                    if not os.path.isfile(full) or os.path.getsize(full) > SOURCE_MAX:
                        continue
                    tar.add(full, arcname=rel, recursive=False)
                except OSError:
                    continue
        return path

    def _task_spec(self, unit):
        """A task's part of its command (JSON): the arguments to Snakemake of
        its jobs (one, or several packed into one Snakemake), what each
        makes; and the input files a node that does not see the workflow
        folder must be brought (relative paths)."""
        first = unit[0]
        if len(unit) == 1:
            # Not RemoteExecutor's: it adds --wait-for-files with this
            # executor's temporary folder, which a node elsewhere never sees.
            args = RealExecutor.get_job_args(self, first.job, cores=first.cores)
        else:
            targets, rules, temps = [], [], []
            for r in unit:
                targets.extend(r.job.get_target_spec())
                for rule in r.job.rules:
                    if rule not in rules:
                        rules.append(rule)
                temps.extend(t for t in self.workflow.dag.get_unneeded_temp_files(r.job) if t not in temps)
            args = join_cli_args(
                [
                    format_cli_arg("--target-jobs", encode_target_jobs_cli_args(targets)),
                    format_cli_arg("--allowed-rules", rules, quote=False),
                    format_cli_arg("--cores", first.cores),
                    format_cli_arg("--attempt", first.job.attempt),
                    format_cli_arg("--force-use-threads", True),
                    format_cli_arg("--unneeded-temp-files", temps, skip=not temps),
                    # One job's failure is its own: the others run on.
                    "--keep-going",
                    # Jobs with nothing between them: in any order. (Snakemake's
                    # ILP took half of such a task's time.)
                    "--scheduler greedy",
                ]
            )
        jobs, inputs, waits = [], [], []
        seen = set()
        for r in unit:
            js = list(r.job.jobs) if r.job.is_group() else [r.job]
            products, logs = [], []
            for j in js:
                for p in list(j.output) + list(j.log) + ([j.benchmark] if j.benchmark else []):
                    rel = self._rel(p)
                    if rel is not None and rel not in products:
                        products.append(rel)
                for p in j.log:
                    rel = self._rel(p)
                    if rel is not None:
                        logs.append(rel)
            spec = {"key": _job_script.key_of(r.job) if len(unit) > 1 else "", "products": products}
            if logs:
                spec["logs"] = logs
            jobs.append(spec)
            for f in self._inputs_of(r.job):
                if f not in seen:
                    seen.add(f)
                    inputs.append(f)
            waits.extend(str(f) for f in r.job.get_wait_for_files())
        task = {"args": args, "jobs": jobs}
        if waits and len(waits) <= 20:
            task["wait"] = waits
        return json.dumps(task, separators=(",", ":")), inputs

    def _read_too(self, job):
        """Files a job may read besides its inputs, which a node elsewhere
        must have too: the logs and benchmarks of the jobs that made its
        inputs (a rule that checks a log), and the outputs of the
        checkpoints that ended (an input function reads them, as the job's
        own Snakemake builds its part of the DAG again)."""
        out = list(self._checkpoint_outputs)
        deps = getattr(getattr(self.workflow, "dag", None), "dependencies", None)
        if deps is None:
            return out
        members = list(job.jobs) if job.is_group() else [job]
        for j in members:
            for dep in list(deps.get(j, ())):
                if dep in members:
                    continue
                try:
                    out.extend(dep.log)
                    if dep.benchmark:
                        out.append(dep.benchmark)
                except AttributeError:
                    continue
        return out

    def _inputs_of(self, job):
        """The job's input files inside the workflow folder, as they are now
        (a folder's files), relative: what a node elsewhere is brought."""
        out = []
        seen = set()
        try:
            more = self._read_too(job)
        except Exception:
            more = []
        for f in list(job.input) + more:
            rel = self._rel(f)
            if rel is None:
                continue
            full = os.path.join(self.workdir, rel)
            if os.path.isfile(full):
                if rel not in seen:
                    seen.add(rel)
                    out.append(rel)
            elif os.path.isdir(full):
                n = 0
                for d, _, files in os.walk(full):
                    for name in files:
                        r = os.path.relpath(os.path.join(d, name), self.workdir)
                        if r not in seen and os.path.isfile(os.path.join(d, name)):
                            seen.add(r)
                            out.append(r)
                            n += 1
                    if n > FOLDER_FILES_MAX:
                        break
        return out

    def _mesh_capacity(self):
        """The nodes' resources (and the allocation queues'), asked at most every few seconds."""
        now = time.monotonic()
        if self._capacity is not None and now - self._capacity_at < CAPACITY_S:
            return self._capacity
        try:
            status = self.client.status()
        except self._mesh.MeshError:
            return self._capacity or _fit.Capacity([])
        allocs = None
        try:
            allocs = self.client.allocs()
        except self._mesh.MeshError:
            pass
        self._capacity = _fit.Capacity.of_status(status, allocs)
        self._capacity_at = now
        return self._capacity

    # ----- following -----

    def _follow(self, run):
        """Keeps the tasks of ``run`` as they end, and wakes the status checks."""
        try:
            for t in run.as_completed(progress=False, reconnect=self.lost_after):
                with self._done_lock:
                    self._done[t.task] = t
                self._ended.set()
        except self._mesh.MeshError as e:
            self._follow_error = (
                "%s has not answered for %d s (%s): the job's end is not known, and no more jobs are sent. "
                "Once a node runs there again, run snakemake again to go on" % (self.where, self.lost_after, self._words(e))
            )
        except Exception as e:  # the follower must say why it stopped
            self._follow_error = "following the workflow's farm on %s stopped: %s" % (self.where, e)
        self._ended.set()

    async def check_active_jobs(self, active_jobs: List[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        if "_grow_lock" not in self.__dict__:
            # Snakemake's status thread starts before __post_init__ ends.
            for j in active_jobs:
                yield j
            return
        ended = {}
        waiting = []
        for j in active_jobs:
            task = j.aux.get("task")
            if task is not None:
                with self._done_lock:
                    t = self._done.get(task)
                if t is not None:
                    ended.setdefault(task, (t, []))[1].append(j)
                    continue
            waiting.append(j)
        for task, (t, infos) in ended.items():
            with self._done_lock:
                self._done.pop(task, None)
            self._report_task(t, infos)
        if self._follow_error is not None:
            self._deferred.drop()
            for j in waiting:
                self.report_job_error(j, msg=self._follow_error + ".\n")
            return
        # Jobs waiting for their rule's probes: sent once it is known.
        self._flush_deferred()
        never = {}
        now = time.monotonic()
        if waiting and now - self._looked_at >= LOOK_S and self.run is not None:
            self._looked_at = now
            async with self.status_rate_limiter:
                never = self._never_to_run([j for j in waiting if j.aux.get("task")])
        for j in waiting:
            if id(j) in self._ended_infos:
                # Reported failed as its deferred task was refused.
                self._ended_infos.discard(id(j))
                continue
            why = never.get(j.aux.get("task"))
            if why is not None:
                self.report_job_error(j, msg=why + "\n")
            else:
                yield j

    def _never_to_run(self, waiting):
        """The waiting jobs' tasks that will never run, with why in words: a
        stage that fits no node, cancelled tasks, a farm that is over."""
        if not waiting:
            return {}
        run = self.run
        try:
            p = run.progress()
        except self._mesh.MeshError:
            return {}
        never = {}
        unplaceable = {}
        for words in p.unplaceable:
            m = re.match(r"stage (\S+) fits no node", words)
            if m:
                unplaceable[m.group(1)] = words
        stopped = set()
        for name, c in p.stages.items():
            c = c if isinstance(c, dict) else {}
            over = sum(c.get(k, 0) for k in ("done", "failed", "skipped", "cancelled", "stopped"))
            if c.get("total") and over >= c["total"] and (c.get("cancelled") or c.get("skipped") or c.get("stopped")):
                stopped.add(name)
        for j in waiting:
            task = j.aux["task"]
            stage = task.rsplit("/", 1)[0]
            if stage in unplaceable:
                never[task] = "the mesh cannot place mesh task %s of %s: %s" % (task, run.id, unplaceable[stage])
            elif stage in stopped or p.finished:
                with self._done_lock:
                    if task in self._done:
                        continue
                why = "; ".join(p.stopped_words or p.failures or []) or "it was cancelled"
                never[task] = "the mesh did not run mesh task %s of %s: %s" % (task, run.id, why)
        for task in never:
            # Not to run: it takes no more of the farm's time.
            try:
                run.cancel_task(task)
            except self._mesh.MeshError:
                pass
        return never

    def _report_task(self, t, infos):
        """A task ended: each of its jobs reported to Snakemake."""
        unit = self._task_jobs.pop(t.task, None) or [j.aux["ready"] for j in infos]
        rule = unit[0].rule
        several = len(unit) > 1
        log, text = self._keep_log(infos[0], t, several)
        cost = _cost(text or b"")
        if cost is not None:
            self._costs.seen(rule, cost, len(unit))
        if not several:
            j = infos[0]
            if t.state == "done":
                self._succeeded(j, t)
            else:
                self.report_job_error(j, msg=self._failure_words(t, text) + "\n", aux_logs=[log] if log else [])
            return
        said, where = _results(text or b"")
        for j in infos:
            key = _job_script.key_of(j.job)
            if said.get(key) == "ok" and (t.state == "done" or where == "in place"):
                self._succeeded(j, t)
                continue
            if key in said:
                msg = "mesh task %s of %s: the job failed (the task ran %d thin jobs of rule %s, each as its own Snakemake would)." % (
                    t.task,
                    t.run.id,
                    len(unit),
                    rule,
                )
            else:
                msg = "%s It ran %d thin jobs of rule %s." % (self._failure_words(t, text), len(unit), rule)
            self.report_job_error(j, msg=msg + "\n", aux_logs=[log] if log else [])

    def _succeeded(self, j, t):
        try:
            self._bring_home(t)
        except OSError as e:
            self.report_job_error(j, msg="mesh task %s of %s: its outputs could not be put in the workflow folder: %s\n" % (t.task, t.run.id, e))
            return
        for member in list(j.job.jobs) if j.job.is_group() else [j.job]:
            if getattr(member, "is_checkpoint", False):
                self._checkpoint_outputs.extend(str(f) for f in member.output if str(f) not in self._checkpoint_outputs)
        self.report_job_success(j)

    def _bring_home(self, t):
        """A job run in a copy on a node that does not see the workflow
        folder: its outputs, logs and benchmarks, which the mesh brought
        to the farm's folder, moved to their places in the workflow."""
        stage, index = t.task.rsplit("/", 1)
        prefix = os.path.join(self.out, stage, index, ".mesh-out", stage, index) + os.sep
        dirs = []
        for p in t.outputs:
            if not p.startswith(prefix):
                continue
            rel = p[len(prefix):]
            if rel == ".mesh-dirs":
                with open(p) as f:
                    dirs = [d for d in f.read().split("\n") if d]
                continue
            dest = os.path.join(self.workdir, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            if os.path.isdir(dest) and not os.path.islink(dest):
                shutil.rmtree(dest)
            os.replace(p, dest)
        for d in dirs:
            os.makedirs(os.path.join(self.workdir, d), exist_ok=True)

    def _failure_words(self, t, text):
        head = "mesh task %s of %s" % (t.task, t.run.id)
        if t.attempt == 0 and t.exit_code is None and t.reason and not t.reason.startswith("unplaceable"):
            # It never ran (cancelled, its rule's stage stopped): the node
            # tells it so as soon as it is known.
            return "the mesh did not run %s: %s." % (head, t.reason)
        mark = re.findall(re.escape(_job_script.EXIT_MARK.encode()) + rb"(\d+)", text or b"")
        own = mark or _EXIT_STATUS.findall(text or b"")
        if own:
            # The job's own command's code, not its Snakemake's 1.
            return "%s: the job's command ended with exit code %s." % (head, own[-1].decode())
        if t.reason and ("timed out" in t.reason or "timeout" in t.reason):
            return "%s: %s (its runtime resource is its time limit)." % (head, t.reason)
        if t.exit_code is not None:
            return "%s ended with exit code %s." % (head, t.exit_code)
        return "%s: %s." % (head, t.reason or "failed")

    async def sleep(self):
        """Until a task ended or the executor shuts down, or Snakemake's poll interval at most."""
        # The status thread starts before __post_init__ has run.
        ended = self.__dict__.get("_ended")
        if ended is None:
            await asyncio.sleep(0.05)
            return
        deadline = time.monotonic() + min(LOOK_S, self.next_seconds_between_status_checks)
        # Nor past shutdown: Snakemake joins this thread before it exits,
        # and the last poll interval would keep a finished workflow open.
        while not ended.is_set() and self.wait and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        ended.clear()

    def _keep_log(self, j, t, several=False):
        """The task's stdout and stderr where Snakemake users look for a job's
        log (``<rule>/<jobid>.log``; a task of several thin jobs:
        ``<rule>/<task>.log``): its path and its bytes (None, None where
        unreadable). A failed job run in a copy sent its log files in its
        stdout: they are put where the rule says."""
        try:
            out, err = t.logs()
        except self._mesh.MeshError:
            return None, None
        text = out + err
        if _job_script.LOG_MARK.encode() in out:
            out = self._restore_logs(out)
        # The script's lines to the plugin are not the job's words.
        out = b"\n".join(line for line in out.split(b"\n") if not line.startswith(b"mesh-snakemake-"))
        d = os.path.join(self.logdir, j.job.rule.name if not j.job.is_group() else "group")
        os.makedirs(d, exist_ok=True)
        name = t.task.replace("/", "-") if several else j.job.jobid
        path = os.path.join(d, "%s.log" % name)
        with open(path, "wb") as f:
            f.write(out)
            f.write(err)
        return path, text

    def _restore_logs(self, out):
        mark = _job_script.LOG_MARK.encode()
        kept = []
        for line in out.split(b"\n"):
            if not line.startswith(mark):
                kept.append(line)
                continue
            try:
                rel, data = line[len(mark):].split(b" ", 1)
                rel = base64.b64decode(rel).decode()
                data = base64.b64decode(data)
            except ValueError:
                continue
            if self._rel(rel) != os.path.normpath(rel):
                continue
            dest = os.path.join(self.workdir, rel)
            try:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "wb") as f:
                    f.write(data)
            except OSError:
                pass
        return b"\n".join(kept)

    # ----- ending -----

    def _hangup(self):
        """A closed terminal (SIGHUP) ends the workflow as Ctrl-C does: its
        jobs cancelled, none left running. Unless SIGHUP is ignored
        (``nohup``), which is asked for."""
        try:
            if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
                signal.signal(signal.SIGHUP, _as_interrupt)
        except (ValueError, AttributeError):
            # Not the main thread, or no SIGHUP here.
            pass

    def _terminate(self):
        """SIGTERM (a batch job's end, `kill`) ends the workflow as Ctrl-C
        does: its jobs cancelled at once. Snakemake's own handler (set once
        the executor exists) would wait for the running jobs, which is
        what a killed Snakemake must not leave behind."""
        if self._terminate_set or threading.current_thread() is not threading.main_thread():
            return
        self._terminate_set = True
        try:
            if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
                signal.signal(signal.SIGTERM, _as_interrupt)
        except (ValueError, AttributeError):
            pass

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]):
        run = self.run
        self._deferred.drop()
        if run is None:
            return
        self._cancelled = True
        try:
            run.cancel()
        except self._mesh.MeshError as e:
            self.logger.warning("mesh: the workflow's jobs (farm %s) could not be cancelled: %s" % (run.id, self._words(e)))

    def cancel(self):
        # Ctrl-C twice must not end in a traceback half-way through.
        try:
            super().cancel()
        except KeyboardInterrupt:
            pass

    def shutdown(self):
        super().shutdown()
        # The workflow takes no more jobs: its farm ends once its tasks do.
        if self.run is not None and self._follow_error is None and not self._cancelled:
            try:
                self.run.close()
            except self._mesh.MeshError as e:
                self.logger.warning("mesh: the workflow's farm %s could not be closed: %s" % (self.run.id, self._words(e)))
        _remove_empty(self.out)


def _remove_empty(top):
    """The farm's folders left empty once every output went to its place."""
    for d, subdirs, files in os.walk(top, topdown=False):
        if not files:
            try:
                os.rmdir(d)
            except OSError:
                pass


def _literal(path):
    """A path as a farm file's field takes it literally (braces doubled:
    it reads them as placeholders)."""
    return path.replace("{", "{{").replace("}", "}}")


def _results(text):
    """A task of several jobs: how each ended (by key), and where they ran."""
    said, where = {}, None
    mark = _job_script.RESULT_MARK.encode()
    here = _job_script.WHERE_MARK.encode()
    for line in text.split(b"\n"):
        if line.startswith(mark):
            how, _, key = line[len(mark):].partition(b" ")
            try:
                said[base64.b64decode(key).decode()] = how.decode()
            except ValueError:
                continue
        elif line.startswith(here):
            where = line[len(here):].decode(errors="replace").strip()
    return said, where


def _cost(text):
    """How long a task's Snakemake ran, as its script said (None: not said)."""
    mark = _job_script.COST_MARK.encode()
    at = text.rfind(mark)
    if at < 0:
        return None
    try:
        return float(text[at + len(mark) :].split(b"\n", 1)[0])
    except ValueError:
        return None


def _as_interrupt(signum, frame):
    raise KeyboardInterrupt
