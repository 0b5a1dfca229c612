"""The command-line driver: ``sbatch --parsable``, ``squeue --json``, ``sinfo --json``,
``scontrol``, ``scancel``. Works with Slurm 22.05 (Debian bookworm) and later.

Argument building and output parsing are pure functions (here and in
:mod:`dl2d.slurm.parsing`); :class:`CliDriver` is the thin shell that runs the commands, each
with a timeout, and turns failures into :class:`SlurmError` / :class:`SlurmUnavailable`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from dl2d.slurm.driver import (
    DEFAULT_PATH,
    JobSpec,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmUnavailable,
    UnixUser,
    job_environment,
    lookup_user,
    process_user,
    wait_for_state,
)
from dl2d.slurm.parsing import (
    is_unavailable_message,
    job_from_scontrol,
    parse_scontrol_record,
    parse_sinfo_json,
    parse_squeue_json,
)

@dataclass(frozen=True)
class RunAs:
    """Who a command runs as when that is not this process's user: the ids it switches to (with the groups,
    as ``initgroups`` gives them) and the directory it starts in (the user's home: sbatch makes its working
    directory the job's)."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    cwd: str


#: ``runner(argv, stdin, env, timeout) -> CompletedProcess``, and ``run_as=RunAs(...)`` for a command run as
#: another user; replaced in unit tests.
Runner = Callable[..., subprocess.CompletedProcess]


def sbatch_args(spec: JobSpec) -> list[str]:
    """``sbatch`` arguments for a :class:`JobSpec` (without the program name). The environment is
    not on the command line: sbatch runs with exactly the job's (:func:`sbatch_environment`) and exports
    it with ``--export=ALL`` (values may then contain commas, and never show in ``ps``)."""
    args = ["--parsable", f"--job-name={spec.name}", f"--nodes={spec.nodes}", "--export=ALL"]
    if spec.ntasks_per_node:
        args.append(f"--ntasks-per-node={spec.ntasks_per_node}")
    if spec.gpus_per_node:
        args.append(f"--gres=gpu:{spec.gpus_per_node}")
    if spec.cpus_per_task:
        args.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.cpus_per_node:
        # --mincpus: that many CPUs on every node, without imposing a task layout on the job's srun steps.
        args.append(f"--mincpus={spec.cpus_per_node}")
    if spec.mem_mb_per_node:
        args.append(f"--mem={spec.mem_mb_per_node}M")
    if spec.time_limit_min is not None:
        args.append(f"--time={spec.time_limit_min}")
    if spec.output:
        args.append(f"--output={spec.output}")
    if spec.workdir:
        args.append(f"--chdir={spec.workdir}")
    if spec.partition:
        args.append(f"--partition={spec.partition}")
    if spec.account:
        args.append(f"--account={spec.account}")
    if spec.qos:
        args.append(f"--qos={spec.qos}")
    if spec.checkpoint_signal:
        # B: = to the batch script (the job's launcher), which owns the workers' checkpointing.
        args.append(f"--signal=B:{spec.checkpoint_signal}@{spec.checkpoint_signal_secs}")
    args.append("--requeue" if spec.requeue else "--no-requeue")
    if spec.nodelist:
        args.append(f"--nodelist={','.join(spec.nodelist)}")
    if spec.exclude:
        args.append(f"--exclude={','.join(spec.exclude)}")
    if spec.comment:
        args.append(f"--comment={spec.comment}")
    if spec.command is not None:
        args.append(f"--wrap={spec.command}")
    return args


def parse_sbatch_output(stdout: str) -> str:
    """``sbatch --parsable`` prints ``<jobid>`` or ``<jobid>;<cluster>``."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";")[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {stdout!r}", command="sbatch")
    return job_id


def sbatch_environment(user: UnixUser, spec: JobSpec, command_env: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch runs with, and so the job's: :func:`~dl2d.slurm.driver.job_environment` for
    ``user`` with ``spec.env`` declared, and the ``SLURM_CONF`` the driver's commands use (``command_env``:
    this process's environment and the driver's ``env``) — that one variable, nothing else of them. Pure."""
    return job_environment(user, spec.env, slurm_conf=command_env.get("SLURM_CONF"))


def switch_problem(user: UnixUser, euid: int) -> str | None:
    """Why a process of effective uid ``euid`` cannot start a command as ``user`` (None: it can, or need not).
    Pure."""
    if user.uid == euid or euid == 0:
        return None
    return (f"cannot submit a job as user {user.name} (uid {user.uid}): this process runs as uid {euid}, and "
            "only root (CAP_SETUID, CAP_SETGID) can start sbatch as another user; run dl2d as root, or "
            'set [slurm] run_jobs_as = "daemon" on a single-user cluster')


def submitted_job_problem(job: SlurmJob | None, job_id: str, spec: JobSpec, user: str) -> str | None:
    """Why the Slurm job ``job_id`` that sbatch, run as ``user``, printed is not the job it was asked to submit
    (None: it is). sbatch run as the job's user is that user's process, which the user can tamper with; the id
    it prints is only believed when Slurm shows a job of that user with the spec's name and comment. Pure."""
    if job is None:
        return f"sbatch run as {user} printed job id {job_id}, which Slurm does not know"
    if job.user and job.user != user or job.name != spec.name or job.comment != (spec.comment or ""):
        return (f"sbatch run as {user} printed job id {job_id}, which is not the job it submitted: Slurm shows "
                f"user {job.user or '?'}, name {job.name!r}, comment {job.comment!r}; expected user {user}, name "
                f"{spec.name!r}, comment {spec.comment or ''!r}")
    return None


def _default_runner(argv: Sequence[str], stdin: str | None, env: Mapping[str, str],
                    timeout: float, run_as: RunAs | None = None) -> subprocess.CompletedProcess:
    ids = {}
    if run_as is not None:
        # The switch happens in the child between fork and exec: no process of ours runs with root's
        # rights and the job's environment (LD_PRELOAD and friends reach only the user's own sbatch).
        ids = dict(user=run_as.uid, group=run_as.gid, extra_groups=list(run_as.groups), cwd=run_as.cwd)
    return subprocess.run(list(argv), input=stdin, env=dict(env), capture_output=True,
                          text=True, timeout=timeout, check=False, **ids)


class CliDriver:
    """:class:`~dl2d.slurm.driver.SlurmDriver` over Slurm's commands.

    ``timeout``: seconds per command (a hung controller must not hang the daemon; Slurm's
    clients themselves retry for about ``MessageTimeout``). ``env``: extra environment for the
    commands (e.g. ``SLURM_CONF``). ``requeue_settle_s``: how long :meth:`requeue` waits for the previous
    run of a requeued job to finish completing.

    :meth:`submit` runs sbatch with the job's environment only (:func:`sbatch_environment`), as the job's
    user (``JobSpec.user``, switched to between fork and exec; this process must be root for another user)
    and, when that is another user, checks that the job id it printed is that user's job of that name.
    """

    def __init__(self, *, timeout: float = 15.0, env: Mapping[str, str] | None = None,
                 runner: Runner | None = None, requeue_settle_s: float = 10.0) -> None:
        self.timeout = timeout
        self.env = dict(env or {})
        self.runner = runner or _default_runner
        self.requeue_settle_s = requeue_settle_s

    # -- the thin shell -------------------------------------------------------------------
    def _command_env(self) -> dict[str, str]:
        """The environment of the driver's own commands (queries and controls, never a job's)."""
        return {**os.environ, **self.env}

    def _run(self, *argv: str, stdin: str | None = None, env: Mapping[str, str] | None = None,
             run_as: RunAs | None = None) -> str:
        """Run a Slurm command; ``env``: its whole environment (default: :meth:`_command_env`); ``run_as``:
        as another user."""
        env = self._command_env() if env is None else env
        try:
            cp = (self.runner(argv, stdin, env, self.timeout) if run_as is None
                  else self.runner(argv, stdin, env, self.timeout, run_as=run_as))
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{os.path.basename(argv[0])} timed out after {self.timeout:g}s",
                                   command=argv) from None
        except FileNotFoundError:
            raise SlurmError(f"{os.path.basename(argv[0])} not found: install Slurm's client commands "
                             "(Debian: slurm-client)", command=argv) from None
        except OSError as e:  # e.g. EPERM switching users: root without CAP_SETUID/CAP_SETGID (a systemd unit's)
            who = f" as uid {run_as.uid} (needs CAP_SETUID and CAP_SETGID)" if run_as is not None else ""
            raise SlurmError(f"{os.path.basename(argv[0])} could not be started{who}: {e.strerror or e}",
                             command=argv) from None
        if cp.returncode != 0:
            err = cp.stderr or cp.stdout or ""
            cls = SlurmUnavailable if is_unavailable_message(err) else SlurmError
            raise cls(f"{os.path.basename(argv[0])} failed", command=argv, returncode=cp.returncode, stderr=err)
        return cp.stdout

    # -- queries --------------------------------------------------------------------------
    def jobs(self) -> list[SlurmJob]:
        return parse_squeue_json(self._run("squeue", "--json"))

    def job(self, job_id: str) -> SlurmJob | None:
        """One job via ``scontrol show job -o``; None when the controller no longer knows it."""
        try:
            out = self._run("scontrol", "show", "job", "-o", str(job_id))
        except SlurmError as e:
            if not isinstance(e, SlurmUnavailable) and "invalid job id" in e.stderr.lower():
                return None
            raise
        lines = [ln for ln in out.splitlines() if ln.strip()]
        return job_from_scontrol(parse_scontrol_record(lines[0])) if lines else None

    def nodes(self) -> list[SlurmNode]:
        return parse_sinfo_json(self._run("sinfo", "--json"))

    def show_config(self) -> dict[str, str]:
        """``scontrol show config`` as ``{Key: value}`` (readable by any user)."""
        from dl2d.slurm.rights import parse_show_config
        return parse_show_config(self._run("scontrol", "show", "config"))

    def admin_level(self, user: str) -> str | None:
        """The user's AdminLevel in Slurm's accounting database (``sacctmgr show user``): ``None``,
        ``Operator``, ``Administrator``; None when the database does not know the user."""
        out = self._run("sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=adminlevel")
        lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
        return lines[0] if lines else None

    def ping(self) -> bool:
        try:
            out = self._run("scontrol", "ping")
        except SlurmError:
            return False
        return " is UP" in out

    # -- actions --------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> str:
        me = process_user()
        user = lookup_user(spec.user) if spec.user is not None else me
        problem = switch_problem(user, os.geteuid())
        if problem:
            raise SlurmError(problem, command="sbatch")
        command_env = self._command_env()
        try:
            env = sbatch_environment(user, spec, command_env)
        except ValueError as e:
            raise SlurmError(f"job {spec.name}: {e}", command="sbatch") from None
        # Found on this process's PATH, never the job's: a PATH the job declares does not choose our sbatch.
        sbatch = shutil.which("sbatch", path=command_env.get("PATH") or DEFAULT_PATH) or "sbatch"
        run_as = None
        if user.uid != me.uid:
            cwd = user.home if os.path.isdir(user.home) else "/"
            run_as = RunAs(user.uid, user.gid, user.groups or (user.gid,), cwd)
        job_id = parse_sbatch_output(self._run(sbatch, *sbatch_args(spec), stdin=spec.script, env=env,
                                               run_as=run_as))
        if run_as is not None:
            problem = submitted_job_problem(self.job(job_id), job_id, spec, user.name)
            if problem:
                raise SlurmError(problem, command="sbatch")
        return job_id

    def shrink(self, job_id: str, num_nodes: int) -> None:
        if num_nodes < 1:
            raise ValueError(f"cannot shrink job {job_id} to {num_nodes} nodes; cancel it instead")
        self._run("scontrol", "update", f"JobId={job_id}", f"NumNodes={num_nodes}")

    def signal(self, job_id: str, sig: str) -> None:
        # --full: the batch script and its children too, not only the srun steps.
        self._run("scancel", f"--signal={sig}", "--full", str(job_id))

    def requeue(self, job_id: str, num_nodes: int | None = None) -> None:
        self._run("scontrol", "requeue", str(job_id))
        # Until the previous run has finished completing, updates to the requeued job are
        # accepted but then lost (seen on 22.05): wait for squeue to show it PENDING.
        wait_for_state(self, job_id, "PENDING", self.requeue_settle_s)
        if num_nodes:
            # A pending job's node count is a range; pin both ends (sbatch -N set max = min).
            self._run("scontrol", "update", f"JobId={job_id}", f"NumNodes={num_nodes}-{num_nodes}")
        # Slurm holds a requeued job (Reason=BeginTime) for the credential lifetime, AuthInfo
        # cred_expire (120 s by default): slurmd refuses to launch a job id whose credential
        # it revoked ("Job credential revoked" kills the job). Do not release it early
        # (StartTime=now); to restart faster, submit a new job that resumes the checkpoint.

    def cancel(self, job_id: str) -> None:
        try:
            self._run("scancel", str(job_id))
        except SlurmError as e:
            if isinstance(e, SlurmUnavailable) or "already completing or completed" not in e.stderr:
                raise

    def drain_node(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                  f"Reason={reason or 'dl2d'}")

    def resume_node(self, node: str) -> None:
        self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")
