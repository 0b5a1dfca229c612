"""The command-line driver: ``sbatch --parsable``, ``squeue --json``, ``sinfo --json``,
``scontrol``, ``scancel``. Works with Slurm 22.05 (Debian bookworm) and later.

Argument building and output parsing are pure functions (here and in
:mod:`dl2d.slurm.parsing`); :class:`CliDriver` is the thin shell that runs the commands, each
with a timeout, and turns failures into :class:`SlurmError` / :class:`SlurmUnavailable`.
"""

from __future__ import annotations

import os
import subprocess
from typing import Callable, Mapping, Sequence

from dl2d.slurm.driver import (
    JobSpec,
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmUnavailable,
    wait_for_state,
)
from dl2d.slurm.parsing import (
    is_unavailable_message,
    job_from_scontrol,
    parse_scontrol_record,
    parse_sinfo_json,
    parse_squeue_json,
)

#: ``runner(argv, stdin, env, timeout) -> CompletedProcess``; replaced in unit tests.
Runner = Callable[[Sequence[str], "str | None", Mapping[str, str], float],
                  subprocess.CompletedProcess]


def sbatch_args(spec: JobSpec) -> list[str]:
    """``sbatch`` arguments for a :class:`JobSpec` (without the program name). The environment is
    not on the command line: ``spec.env`` is added to sbatch's own environment and exported
    with ``--export=ALL`` (values may then contain commas)."""
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


def _default_runner(argv: Sequence[str], stdin: str | None, env: Mapping[str, str],
                    timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), input=stdin, env=dict(env), capture_output=True,
                          text=True, timeout=timeout, check=False)


class CliDriver:
    """:class:`~dl2d.slurm.driver.SlurmDriver` over Slurm's commands.

    ``timeout``: seconds per command (a hung controller must not hang the daemon; Slurm's
    clients themselves retry for about ``MessageTimeout``). ``env``: extra environment for the
    commands (e.g. ``SLURM_CONF``). ``requeue_settle_s``: how long :meth:`requeue` waits for the previous
    run of a requeued job to finish completing.
    """

    def __init__(self, *, timeout: float = 15.0, env: Mapping[str, str] | None = None,
                 runner: Runner | None = None, requeue_settle_s: float = 10.0) -> None:
        self.timeout = timeout
        self.env = dict(env or {})
        self.runner = runner or _default_runner
        self.requeue_settle_s = requeue_settle_s

    # -- the thin shell -------------------------------------------------------------------
    def _run(self, *argv: str, stdin: str | None = None,
             extra_env: Mapping[str, str] | None = None) -> str:
        env = {**os.environ, **self.env, **(extra_env or {})}
        try:
            cp = self.runner(argv, stdin, env, self.timeout)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{argv[0]} timed out after {self.timeout:g}s",
                                   command=argv) from None
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found: install Slurm's client commands "
                             "(Debian: slurm-client)", command=argv) from None
        if cp.returncode != 0:
            err = cp.stderr or cp.stdout or ""
            cls = SlurmUnavailable if is_unavailable_message(err) else SlurmError
            raise cls(f"{argv[0]} failed", command=argv, returncode=cp.returncode, stderr=err)
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
        return parse_sbatch_output(
            self._run("sbatch", *sbatch_args(spec), stdin=spec.script, extra_env=spec.env))

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
