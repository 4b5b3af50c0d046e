"""snakemake --executor mesh: each job a task of the workflow's one open farm, grown a batch at a time, its state read in one query a poll.

Snakemake hands the executor the jobs that are ready (``run_jobs``); the
workflow run has one open farm on the node (docs/design/open-farm.md),
and each batch grows it by stages of shell tasks, a stage per resource
shape (a job's ``threads``, ``mem_mb``, ``gpu`` and custom resources), each
task one job's command (``python -m snakemake ... --mode remote``, as for
any remote executor); the farm is closed when the workflow ends. The
jobs' states come from one ``Tasks`` query per poll. Snakemake decides what is up to date, so the mesh runs
every job it is given (no reuse of earlier results). Ctrl-C cancels the
workflow's tasks; each job's output is written to
``.snakemake/mesh_logs/<rule>/<jobid>.log`` and is in ``mesh logs`` too.
"""

import asyncio
import os
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncGenerator, List, Optional

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

#: Resources Snakemake keeps for itself: never a task's.
_SNAKEMAKE_OWN = {"_cores", "_nodes", "_job_count", "tmpdir", "runtime", "disk_mb", "disk_mib", "mem_mib", "mem", "disk", "threads"}


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


def _task_resources(job, most_cpu=None):
    """A job's resources as a mesh task asks them. A group job's threads
    are its parallel components' summed, which may be more cores than any
    node has: it asks for the largest node's (``most_cpu``), and its
    Snakemake runs the components in that node's slots."""
    cpu = max(1, int(job.threads or 1))
    if job.is_group() and most_cpu:
        cpu = min(cpu, most_cpu)
    res = {"cpu": cpu}
    r = dict(job.resources.items()) if job.resources else {}
    mem = r.get("mem_mb")
    if isinstance(mem, (int, float)) and mem > 0:
        res["mem"] = "%dMB" % int(mem)
    for name, value in r.items():
        if name in _SNAKEMAKE_OWN or name == "mem_mb" or name.startswith("_"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        res[name.lower()] = value
    return res


class Executor(RemoteExecutor):
    def __post_init__(self):
        try:
            import mesh
        except ImportError:
            raise WorkflowError("snakemake --executor mesh needs `import mesh`: pip install ./python from the mesh repository") from None
        self._mesh = mesh
        s = self.workflow.executor_settings
        try:
            self.client = mesh.connect(state_dir=s.state_dir, mesh=s.address, key=s.key)
        except mesh.MeshError as e:
            raise WorkflowError("cannot reach a mesh node: %s" % e) from None
        self.farm_name = s.farm_name
        self.batches = 0
        #: The workflow run's open farm, made by the first batch.
        self.run = None
        self.logdir = os.path.abspath(os.path.join(".snakemake", "mesh_logs"))
        # Set when a task of ours ends: the status check comes then, not
        # after Snakemake's poll interval (10 s by default).
        self._ended = threading.Event()

    def run_job(self, job: JobExecutorInterface):
        self.run_jobs([job])

    def run_jobs(self, jobs: List[JobExecutorInterface]):
        for job in jobs:
            self.run_job_pre(job)
        self.batches += 1
        mesh = self._mesh
        farm = mesh.Farm(self.farm_name, out=os.path.join(".snakemake", "mesh"), root=self.workflow.workdir_init)
        shapes = {}
        most_cpu = self._most_cpu() if any(j.is_group() for j in jobs) else None
        for job in jobs:
            res = _task_resources(job, most_cpu)
            shapes.setdefault(tuple(sorted(res.items())), []).append(job)
        where = {}
        for n, (shape, js) in enumerate(shapes.items()):
            # Unique in the open farm, which holds every batch's stages.
            name = "jobs%d-%d" % (self.batches, n)
            farm.stage(
                name,
                shell="{cmd}",
                sweep={"cmd": [self.format_job_exec(j) for j in js]},
                resources=dict(shape),
                max_fails=0,
            )
            for i, j in enumerate(js):
                where[id(j)] = "%s/%d" % (name, i)
        try:
            if self.run is None:
                # Snakemake has decided these must run: nothing is reused.
                run = self.client.submit(farm, rerun=True, warn=False, open=True)
                # A Snakemake killed without its shutdown: the home closes the farm.
                run.hold()
                threading.Thread(target=self._follow, args=(run,), name="mesh-follow", daemon=True).start()
                self.run = run
            else:
                run = self.run
                # Nor here: Snakemake decided these must run.
                run.grow(farm, warn=False, rerun=True)
        except mesh.MeshError as e:
            for job in jobs:
                self.report_job_error(SubmittedJobInfo(job), msg="the mesh refused the jobs: %s" % e)
            return
        for job in jobs:
            task = where[id(job)]
            self.report_job_submission(SubmittedJobInfo(job, external_jobid="%s %s" % (run.id, task), aux={"run": run, "task": task}))

    def _most_cpu(self):
        """The cores of the mesh's largest node now (None if unknown)."""
        try:
            nodes = self.client.status().get("nodes", [])
        except self._mesh.MeshError:
            return None
        most = 0
        for n in nodes:
            for part in str(n.get("resources", {}).get("total", "")).split(","):
                name, _, value = part.partition("=")
                if name == "cpu":
                    try:
                        most = max(most, int(float(value)))
                    except ValueError:
                        pass
        return most or None

    async def check_active_jobs(self, active_jobs: List[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        by_run = {}
        for j in active_jobs:
            by_run.setdefault(j.aux["run"].id, []).append(j)
        for rid, infos in by_run.items():
            run = infos[0].aux["run"]
            async with self.status_rate_limiter:
                try:
                    tasks = {t.task: t for t in run.tasks()}
                except self._mesh.MeshError as e:
                    self.logger.warning("mesh: cannot read the state of %s: %s" % (rid, e))
                    for j in infos:
                        yield j
                    continue
            progress = None
            for j in infos:
                t = tasks.get(j.aux["task"])
                if t is None or t.state == "unfinished":
                    if progress is None:
                        progress = run.progress()
                    if progress.finished:
                        # Never to run: cancelled, or its farm stopped.
                        self.report_job_error(j, msg="the mesh did not run it (%s)" % (progress.stopped_words or progress.failures or "farm %s ended" % rid))
                    else:
                        yield j
                    continue
                log = self._keep_log(j, t)
                if t.state == "done":
                    self.report_job_success(j)
                else:
                    # The job's first stderr line is Snakemake's own banner:
                    # how it ended, and the log, say more.
                    how = "exit code %s" % t.exit_code if t.exit_code is not None else (t.reason or "failed")
                    self.report_job_error(j, msg="mesh task %s of %s ended with %s" % (t.task, rid, how), aux_logs=[log] if log else [])

    def _follow(self, run):
        """Wakes the status checks as each task of ``run`` ends."""
        try:
            for _ in run.as_completed(progress=False):
                self._ended.set()
        except self._mesh.MeshError:
            pass
        self._ended.set()

    async def sleep(self):
        """Until a task ended or the executor shuts down, or Snakemake's poll interval at most."""
        # The status thread starts before __post_init__ has run.
        ended = self.__dict__.get("_ended")
        if ended is None:
            await asyncio.sleep(0.05)
            return
        deadline = time.monotonic() + self.next_seconds_between_status_checks
        # Nor past shutdown: Snakemake joins this thread before it exits,
        # and the last poll interval would keep a finished workflow open.
        while not ended.is_set() and self.wait and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        ended.clear()

    def _keep_log(self, j, t):
        """The task's stdout and stderr where Snakemake users look for a job's log."""
        try:
            out, err = t.logs()
        except self._mesh.MeshError:
            return None
        d = os.path.join(self.logdir, j.job.rule.name if not j.job.is_group() else "group")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "%s.log" % j.job.jobid)
        with open(path, "wb") as f:
            f.write(out)
            f.write(err)
        return path

    def cancel_jobs(self, active_jobs: List[SubmittedJobInfo]):
        by_run = {}
        for j in active_jobs:
            by_run.setdefault(j.aux["run"].id, []).append(j)
        for rid, infos in by_run.items():
            run = infos[0].aux["run"]
            try:
                run.cancel()
            except self._mesh.MeshError as e:
                self.logger.warning("mesh: cancelling %s: %s" % (rid, e))

    def shutdown(self):
        super().shutdown()
        # The workflow takes no more jobs: its farm ends once its tasks do.
        if self.run is not None:
            try:
                self.run.close()
            except self._mesh.MeshError as e:
                self.logger.warning("mesh: closing %s: %s" % (self.run.id, e))

    def get_job_exec_prefix(self, job: JobExecutorInterface):
        if self.workflow.storage_settings.assume_common_workdir:
            return "cd %s" % shlex.quote(self.workflow.workdir_init)
        return ""
