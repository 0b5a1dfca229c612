"""The per-job directory of the Slurm backend, ``<state_dir>/jobs/<id>/`` (docs/slurm.md). A job runs as its
owner, so the directory is in two parts: the daemon's, which the job may read but never change, and one the
job owns.

The daemon's, ``jobs/<id>/`` (owned by the daemon, mode 0755; its files 0644):

* ``record.json`` — the backend's durable state (Slurm job ids, target and applied size, requested
  allocation, stopped/cancelled/final, the latest submission's token), written atomically
  (write-then-rename), mode 0600: the daemon's alone;
* ``target.env`` / ``target.json`` (and ``hostfile`` for a placed target) — the size the job should run
  at; the batch script sources ``target.env`` every time it starts (so a requeued job sees its new size)
  and exports ``DL2D_WORKERS``/``DL2D_PS``; running jobs may re-read ``$DL2D_TARGET_FILE``;
* ``user-script`` — the spec's ``script``, when it gives one instead of a ``command``.

The job's, ``jobs/<id>/job/`` (``$DL2D_JOB_DIR``, :attr:`JobDir.owned_dir`; owned by the job's user, mode
0700, :meth:`JobDir.prepare`):

* ``job.secret`` (``$DL2D_JOB_SECRET_FILE``) — the job's secret (mode 0600, made by the daemon at the first
  submission and kept across restarts): an elastic runtime (dl2-run) authenticates every connection to
  its coordinator and roles with it, and the daemon's hot scaling with it (docs/elastic.md);
* ``progress.json`` (``$DL2D_PROGRESS_FILE``) — written by the job: epochs done, its state;
* ``checkpoint/`` (``$DL2D_CHECKPOINT_DIR``) — the job's checkpoints, kept across restarts; an elastic
  runtime (dl2-run) publishes its coordinator there (``coordinator.json``);
* ``slurm-<slurm id>.out`` — the batch job's output.

The daemon (root) reads the job's files without following a symbolic link and only up to
:data:`MAX_JOB_FILE_BYTES` (:func:`read_job_file`): the job decides what they are, and one that is a link, no
regular file or too large fails the job with the reason.

The directory must be on a file system the compute nodes share. :func:`batch_script` and
:func:`target_env` are pure; :class:`JobDir` reads and writes the files.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
from pathlib import Path
from typing import Any, Iterable, Mapping

from dl2d.core.files import atomic_open, ensure_secret_file, read_secret_file, write_atomic
from dl2d.daemon.backend import Target
from dl2d.daemon.slurm.jobreport import JobReportError

#: The subdirectory of a job's directory that the job (its owner) owns: ``$DL2D_JOB_DIR``.
OWNED_DIR = "job"
#: The most the daemon reads of a file the job writes (progress, coordinator): a few hundred bytes each.
MAX_JOB_FILE_BYTES = 1024 * 1024
#: The daemon's job directory and the files the job reads there: readable by the job's user, whoever it is.
DIR_MODE, SHARED_FILE_MODE = 0o755, 0o644
#: The job's own directory: its user's alone.
OWNED_MODE = 0o700
#: The job's secret (docs/elastic.md), in the directory the job owns (its user must read it).
SECRET_FILE = "job.secret"


def number_text(x: float) -> str:
    """A number as the job reads it from its environment: whole numbers without a point, others exactly."""
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


def target_env(workers: int, ps: int, hostfile: Path | None = None, batch_size: float = 0.0) -> str:
    """``DL2D_WORKERS``/``DL2D_PS``, ``DL2D_BATCH_SIZE`` (the total batch of this start, where the job has one) and
    ``DL2D_HOSTFILE`` (one node per task, PS first: for ``srun --distribution=arbitrary`` with ``SLURM_HOSTFILE``)
    when the target carries a placement."""
    text = f"DL2D_WORKERS={int(workers)}\nDL2D_PS={int(ps)}\nexport DL2D_WORKERS DL2D_PS\n"
    if batch_size:
        text += f"DL2D_BATCH_SIZE={number_text(batch_size)}\nexport DL2D_BATCH_SIZE\n"
    if hostfile is not None:
        text += f"DL2D_HOSTFILE={shlex.quote(str(hostfile))}\nexport DL2D_HOSTFILE\n"
    return text


def launch_of(spec: Mapping[str, Any]) -> str:
    """The spec's ``launch`` (one of dl2d.core.jobs.LAUNCHES); where it has none, ``srun`` for an all-reduce job
    and ``once`` otherwise."""
    launch = spec.get("launch")
    if launch is None:
        return "srun" if spec.get("kind") == "allreduce" else "once"
    return str(launch)


def srun_line(cpus_per_task: int) -> str:
    """The ``srun`` that starts one process per worker: ``$DL2D_WORKERS`` tasks spread evenly over the
    allocation's nodes (no node more than ``ceil(W / N)``, as dl2d sized them), rank 0 on the first; one
    task that fails ends them all."""
    return ('N="${SLURM_JOB_NUM_NODES:-1}"\n'
            'exec srun --ntasks="$DL2D_WORKERS" --ntasks-per-node="$(( (DL2D_WORKERS + N - 1) / N ))" '
            f'--cpus-per-task={int(cpus_per_task)} --kill-on-bad-exit=1 --distribution=block')


def batch_script(job_id: int, job_dir: Path, command: str | None, script_path: Path | None, *,
                 exports: Mapping[str, str] | None = None, srun_cpus_per_task: int | None = None) -> str:
    """The batch script of a dl2d job. It exports the job's paths (and ``exports``: the rest of the job
    contract, docs/jobs.md), sources the target file (every start, so a requeued job sees its new size) and
    ``exec`` s the user's command through ``bash -c`` (bash replaces itself with a single command, so the
    program receives Slurm's checkpoint signal) or the user's script. With ``srun_cpus_per_task`` it starts
    that one process per worker instead (:func:`srun_line`; ``scancel --full`` signals every one)."""
    if (command is None) == (script_path is None):
        raise ValueError("batch_script needs exactly one of command or script_path")
    q = shlex.quote
    owned = job_dir / OWNED_DIR  # the job's own (writable) directory; job_dir itself is the daemon's
    lines = [
        "#!/bin/bash",
        f"# dl2d job {job_id}: generated by dl2d.daemon.slurm; do not edit",
        f"export DL2D_JOB_ID={int(job_id)}",
        f"export DL2D_JOB_DIR={q(str(owned))}",
        f"export DL2D_CHECKPOINT_DIR={q(str(owned / 'checkpoint'))}",
        f"export DL2D_PROGRESS_FILE={q(str(owned / 'progress.json'))}",
        f"export DL2D_TARGET_FILE={q(str(job_dir / 'target.json'))}",
        f"export DL2D_JOB_SECRET_FILE={q(str(owned / SECRET_FILE))}",
        'mkdir -p "$DL2D_CHECKPOINT_DIR"',
    ]
    for name, value in (exports or {}).items():
        if not name.isidentifier():
            raise ValueError(f"not a variable name: {name!r}")
        lines.append(f"export {name}={q(str(value))}")
    target = q(str(job_dir / "target.env"))
    lines.append(f"if [ -r {target} ]; then . {target}; fi")
    program = f"bash -c {q(command)}" if command is not None else q(str(script_path))
    if srun_cpus_per_task is not None:
        lines.append(f"{srun_line(srun_cpus_per_task)} {program}")
    else:
        lines.append(f"exec {program}")
    return "\n".join(lines) + "\n"


def read_json_file(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when missing or (being) garbled."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def read_job_file(base: Path, *parts: str, max_bytes: int = MAX_JOB_FILE_BYTES) -> tuple[bytes, float] | None:
    """(content, modification time) of the file ``base/parts...`` that a job wrote: each part opened in the one
    before without following a symbolic link, the last one a regular file of at most ``max_bytes``. None when it
    does not exist (yet); JobReportError, naming the file, when it is a link, not a regular file or larger: a job
    cannot make the daemon (root) read another file through its own, nor hang it on a FIFO or a file that never
    ends, and what it put there is its contract broken, said once (the job fails with it), not ignored."""
    fds: list[int] = []
    name = "/".join(parts)
    try:
        fds.append(os.open(base, os.O_RDONLY | os.O_DIRECTORY))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fds.append(os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1]))
        st = os.fstat(fds[-1])
        if not stat.S_ISREG(st.st_mode):
            raise JobReportError(f"{name} is not a regular file")
        if st.st_size > max_bytes:
            raise JobReportError(f"{name} has {st.st_size} bytes, more than the {max_bytes} a job's file may have")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fds[-1], max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise JobReportError(f"{name} grew past the {max_bytes} bytes a job's file may have")
        return b"".join(chunks), st.st_mtime
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a link where a file or directory was to be
            raise JobReportError(f"{name} (or a directory on its way) is a symbolic link or not a directory") from None
        return None  # not there (yet), or unreadable for now
    finally:
        for fd in fds:
            os.close(fd)


def _json_object(data: bytes | None) -> dict[str, Any] | None:
    """A JSON object from a job's file; None when there is none or it is (being) garbled."""
    if data is None:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return doc if isinstance(doc, dict) else None


def _write_shared(path: Path, text: str) -> None:
    """Replace ``path`` atomically with a file the job's user can read (0644 whatever the daemon's umask: a
    job runs as its owner, not in the daemon's group)."""
    with atomic_open(path, "w") as f:
        f.write(text)
        os.fchmod(f.fileno(), SHARED_FILE_MODE)


def _give(dir_fd: int, name: str, me: int, uid: int, gid: int) -> None:
    """Give the entry ``name`` of the directory ``dir_fd`` to ``uid``/``gid`` when ``me`` owns it and it is a
    directory or a regular file of one link (not followed if a symbolic link; a hard link to someone else's
    file, or anything else, is left alone)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:  # a symbolic link (ELOOP), gone meanwhile, unreadable
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == me and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def known_job_ids(jobs_dir: Path) -> list[int]:
    """The dl2d job ids that have a record under ``<state_dir>/jobs``."""
    return sorted(int(p.name) for p in jobs_dir.iterdir()
                  if p.name.isdigit() and (p / "record.json").exists())


def record_slurm_ids(record: Mapping[str, Any]) -> set[str]:
    """The Slurm ids of every run a job's record names (its current one and its earlier ones)."""
    ids = {str(i) for i in record.get("slurm_job_ids") or []}
    if record.get("slurm_job_id"):
        ids.add(str(record["slurm_job_id"]))
    return ids


class JobDir:
    """The files of one job (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def owned_dir(self) -> Path:
        """The directory the job owns (``$DL2D_JOB_DIR``): its progress file, checkpoints and Slurm output,
        and what the daemon hands the job alone. Owned by the job's user, mode 0700 (:meth:`prepare`)."""
        return self.path / OWNED_DIR

    @property
    def checkpoint_dir(self) -> Path:
        return self.owned_dir / "checkpoint"

    @property
    def progress_file(self) -> Path:
        return self.owned_dir / "progress.json"

    @property
    def output_pattern(self) -> Path:
        """Slurm's ``--output`` of the job's runs (``%j``: the Slurm job id)."""
        return self.owned_dir / "slurm-%j.out"

    def prepare(self, uid: int | None = None, gid: int | None = None) -> Path:
        """Make the job's directories before it is submitted: this one (the daemon's, mode 0755: the job reads its
        target here and changes nothing) and :attr:`owned_dir` (0700, with ``checkpoint/``); then give the owned
        directory, and whatever the daemon put in it (e.g. a secret file), to ``uid``/``gid`` (None: it stays the
        daemon's, the job runs as the daemon's user). Only what the daemon's user owns changes hands, and only
        directories and regular files of one link, opened without following a symbolic link: a job that plants
        links in its directory gets nothing of anyone else's. Returns :attr:`owned_dir`."""
        me = os.geteuid()
        self.path.mkdir(parents=True, exist_ok=True)
        if self.path.stat().st_uid == me:
            self.path.chmod(DIR_MODE)
        for d in (self.owned_dir, self.checkpoint_dir):
            try:
                os.mkdir(d, OWNED_MODE)
            except FileExistsError:
                pass
        dfd = os.open(self.owned_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            mine = os.fstat(dfd).st_uid == me
            if mine:
                os.fchmod(dfd, OWNED_MODE)
            if uid is not None and uid != me:
                for name in os.listdir(dfd):
                    _give(dfd, name, me, uid, gid if gid is not None else -1)
                if mine:
                    os.fchown(dfd, uid, gid if gid is not None else -1)
        finally:
            os.close(dfd)
        return self.owned_dir

    def record(self) -> dict[str, Any]:
        """The backend's record of the job; empty when it has none."""
        return read_json_file(self.path / "record.json") or {}

    def save_record(self, record: dict[str, Any]) -> None:
        """Replace the record (mode 0600 whatever the umask: it holds the submission's token)."""
        write_atomic(self.path / "record.json", json.dumps(record, indent=1), perms=0o600)

    def write_target(self, target: Target, hostfile_nodes: Iterable[str] | None) -> None:
        """The size the job should run at; with ``hostfile_nodes`` (a placed target's tasks, PS first)
        also the hostfile and the placement in target.json."""
        hostfile = self.path / "hostfile" if hostfile_nodes is not None else None
        if hostfile is not None:
            _write_shared(hostfile, "".join(f"{n}\n" for n in hostfile_nodes))
        _write_shared(self.path / "target.env", target_env(target.workers, target.ps, hostfile, target.batch_size))
        doc: dict[str, Any] = {"workers": target.workers, "ps": target.ps,
                               **({"batch_size": target.batch_size} if target.batch_size else {})}
        if hostfile is not None:
            doc.update(worker_nodes=list(target.worker_nodes), ps_nodes=list(target.ps_nodes))
        _write_shared(self.path / "target.json", json.dumps(doc))

    def write_user_script(self, text: str) -> Path:
        """The spec's ``script``, executable, for the batch script to ``exec``."""
        path = self.path / "user-script"
        write_atomic(path, text)
        path.chmod(0o755)
        return path

    @property
    def secret_file(self) -> Path:
        """``$DL2D_JOB_SECRET_FILE``, in :attr:`owned_dir`: :meth:`prepare` gives it to the job's user."""
        return self.owned_dir / SECRET_FILE

    def write_secret(self) -> str:
        """The job's secret: made on the first call (``secrets.token_hex(32)``, mode 0600, written whole and
        linked into place), then kept and returned as it is across restarts and requeues. Call it before
        :meth:`prepare`, which hands the file to the job's user. SecretFileError when the file there is not a
        private secret file (a symbolic link, or readable by others)."""
        return ensure_secret_file(self.secret_file, what="job secret file", owners=(), follow_symlinks=False)

    def secret(self) -> str | None:
        """The job's secret, for the daemon's hot scaling; None when it has none (a job submitted before dl2d
        made them). The file belongs to the job's user (who can only confuse its own job by changing it); a
        symbolic link, a FIFO or a file others can read is a SecretFileError, nothing else is followed."""
        if not self.secret_file.exists() and not self.secret_file.is_symlink():
            return None
        return read_secret_file(self.secret_file, what="job secret file", owners=(), follow_symlinks=False)

    def progress(self) -> dict[str, Any] | None:
        """What the job last wrote to its progress file (None: nothing yet, or being rewritten); JobReportError
        when it is a link, no regular file or too large (:func:`read_job_file`)."""
        return self.progress_and_mtime()[0]

    def progress_and_mtime(self) -> tuple[dict[str, Any] | None, float | None]:
        """The progress report and when the job last wrote it (unix seconds), from one read; (None, None) when it
        has none. JobReportError as :meth:`progress`."""
        got = read_job_file(self.path, OWNED_DIR, "progress.json")
        return (_json_object(got[0]), got[1]) if got else (None, None)

    def coordinator(self) -> tuple[dict[str, Any] | None, float | None]:
        """An elastic runtime's published coordinator (``checkpoint/coordinator.json``: its address)
        and when the file was written (unix seconds); (None, None) when there is none."""
        got = read_job_file(self.path, OWNED_DIR, "checkpoint", "coordinator.json")
        doc = _json_object(got[0] if got else None)
        return (doc, got[1]) if doc is not None and got else (None, None)
