"""Pure helpers of `dl2ctl submit`: read a job spec (TOML or JSON), parse sbatch-style values, and merge
the spec with the command-line flags into the dict that `dl2d.db.jobs.validate_submission` checks.

A spec file holds the keys of `validate_submission` (see docs/cli.md). An all-reduce job (DDP, FSDP, JAX):

    name = "bert-a"
    kind = "allreduce"            # or --arch; the default for a model that is not one of DL2's 8 types
    job_type = "bert"             # any model name; bert, cifar10, deepspeech2, imagenet, ncf, yolov3 are measured
    batch_size = 96               # total batch, all workers together (required for a measured model)
    workers = 8                   # optional: the workers you ask for (Slurm as it is gives exactly these)
    min_workers = 2               # optional: never run with fewer (it waits instead); default 1
    epoch_seconds = 600           # optional, a model dl2d does not know: seconds per epoch on one GPU
    total_epochs = 2              # your estimate of the epochs to train
    command = "python train.py"   # or `script`; see docs/jobs.md for what the program is handed
    launch = "srun"               # optional: dl2d starts one process per worker (default); "once": the
                                  # command runs once on the first node and starts its own (torchrun)
    max_workers = 16              # optional, default 64
    adaptive_batch = true         # optional: dl2d chooses the total batch with the GPUs (a measured model);
                                  # batch_size is then the initial one, the one the learning rate is tuned for
    max_batch_size = 4096         # optional, with adaptive_batch: the largest total batch [its model's measured]
    max_local_batch = 128         # optional, with adaptive_batch: most samples a GPU takes in one pass [measured]
    [worker]                      # one worker = one rank
    gpus = 1                      # whole GPUs, default 1
    cpus = 8
    mem_gb = 40

A parameter-server job (DL2's model; no `kind` needed for one of its types):

    name = "resnet-a"
    job_type = "resnet-50"        # one of the 8 DL2 types (paper aliases such as resnet50 accepted)
    total_epochs = 30
    command = "python train.py"
    max_workers = 8               # optional, default 16
    max_ps = 4                    # optional, default 16
    sync = "sync"                 # optional: "sync" or "async"
    time_limit_min = 1440         # optional
    owner = "alice"               # optional, default: you; the job runs as this user
    account = "proj-a"            # optional: Slurm account (default: the owner's default), as sbatch -A
    qos = "normal"                # optional: Slurm QOS, as sbatch -q
    partition = "gpu"             # optional: Slurm partition(s), as sbatch -p
    [env]                         # optional: what the job's environment holds besides dl2d's and Slurm's
    WANDB_PROJECT = "resnet"      # (never the submitting shell's environment; see docs/jobs.md)
    [worker]
    gpus = 1
    cpus = 2
    mem_gb = 8
    [ps]
    cpus = 2
    mem_gb = 4
"""
from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from dl2d.workload.catalog import ALLREDUCE_MODELS
from dl2d.workload.jobtypes import ALIASES, TYPE_NAMES


MAX_SPEC_CHARS = 1_000_000  # a job spec is a few hundred bytes; anything near this is not one


class SpecError(ValueError):
    """A spec file that cannot be parsed at all."""


def parse_spec_text(text: str, fmt: str | None = None, source: str = "<spec>") -> dict[str, Any]:
    """Parse a spec as JSON or TOML. `fmt` is "json", "toml" or None (JSON when the text starts with '{')."""
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(f"{source}: a job spec is at most {MAX_SPEC_CHARS} characters, this one has {len(text)}")
    if fmt is None:
        fmt = "json" if text.lstrip().startswith("{") else "toml"
    if fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
        except (RecursionError, ValueError) as e:  # nesting bombs, integers of thousands of digits
            raise SpecError(f"{source}: unusable JSON ({type(e).__name__}: {str(e)[:200]})") from None
        if not isinstance(data, dict):
            raise SpecError(f"{source}: a job spec must be a JSON object, got {type(data).__name__}")
        return data
    if fmt == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{source}: invalid TOML: {e}") from e
        except (RecursionError, ValueError) as e:  # nesting bombs, integers of thousands of digits
            raise SpecError(f"{source}: unusable TOML ({type(e).__name__}: {str(e)[:200]})") from None
    raise SpecError(f"{source}: unknown spec format {fmt!r} (use json or toml)")


def spec_format(filename: str) -> str | None:
    """The format implied by a file name's extension, None when it does not say."""
    lower = filename.lower()
    if lower.endswith(".json"):
        return "json"
    if lower.endswith(".toml"):
        return "toml"
    return None


_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.I)
_MEM_FACTOR_GB = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}


def parse_mem(value: str) -> float:
    """sbatch's --mem syntax: a number with an optional K/M/G/T suffix, megabytes without one. Returns GB."""
    m = _MEM_RE.match(value)
    if not m:
        raise ValueError(f"memory must be a number with an optional K, M, G or T suffix "
                         f"(megabytes without one, as in sbatch), got {value!r}")
    return float(m.group(1)) * _MEM_FACTOR_GB[(m.group(2) or "M").upper()]


_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_workers(value: str | int) -> int | tuple[int, int]:
    """``--workers``: ``N`` (the workers asked for) or ``MIN-MAX`` (Slurm's ``--nodes=MIN-MAX`` form: asked for
    MAX, never run with fewer than MIN)."""
    text = str(value).strip()
    lo, sep, hi = text.partition("-")
    try:
        if not sep:
            return int(text)
        low, high = int(lo), int(hi)
    except ValueError:
        raise ValueError(f"workers must be N or MIN-MAX, got {value!r}") from None
    if not 1 <= low <= high:
        raise ValueError(f"workers MIN-MAX needs 1 <= MIN <= MAX, got {value!r}")
    return low, high


def parse_time(value: str) -> int:
    """sbatch's --time syntax -> whole minutes (rounded up).

    "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours", "days-hours:minutes",
    "days-hours:minutes:seconds".
    """
    v = value.strip()
    m = _TIME_RE.match(v)
    if not m:
        raise ValueError(f"time must be MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, got {value!r}")
    days, a, b, c = m.groups()
    a, b, c = int(a), int(b) if b else None, int(c) if c else None
    if days is not None:
        seconds = int(days) * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:
        seconds = a * 3600 + b * 60 + c
    elif b is not None:
        seconds = a * 60 + b
    else:
        seconds = a * 60
    return -(-seconds // 60)


def parse_exports(values: Any) -> dict[str, str]:
    """``--export NAME=VALUE`` (repeatable) -> {NAME: VALUE}; the value may hold anything, ``=`` and commas too.
    The names are checked with the rest of the submission (dl2d.db.jobs)."""
    out: dict[str, str] = {}
    for item in values:
        name, sep, value = str(item).partition("=")
        if not sep or not name:
            raise ValueError(f"NAME=VALUE expected, got {item!r} (one variable per --export; the job's environment "
                             "is dl2d's base and what you declare, docs/jobs.md)")
        out[name] = value
    return out


def normalize_job_type(value: Any) -> Any:
    """Map case variants and the paper's aliases (resnet50, vgg16, ctc) to the canonical type name."""
    if not isinstance(value, str):
        return value
    key = value.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in TYPE_NAMES else value


# flag name -> (path in the submission dict, converter or None)
FLAG_FIELDS: dict[str, tuple[tuple[str, ...], Any]] = {
    "job_name": (("name",), None),
    "job_type": (("job_type",), None),
    "epochs": (("total_epochs",), None),
    "command": (("command",), None),
    "gpus_per_worker": (("worker", "gpus"), None),
    "cpus_per_worker": (("worker", "cpus"), None),
    "mem_per_worker": (("worker", "mem_gb"), parse_mem),
    "cpus_per_ps": (("ps", "cpus"), None),
    "mem_per_ps": (("ps", "mem_gb"), parse_mem),
    "max_workers": (("max_workers",), None),
    "max_ps": (("max_ps",), None),
    "sync_mode": (("sync",), None),
    "time": (("time_limit_min",), parse_time),
    "owner": (("owner",), None),
    "arch": (("kind",), None),
    "batch_size": (("batch_size",), None),
    "workers": (("workers",), parse_workers),
    "epoch_seconds": (("epoch_seconds",), None),
    "launch": (("launch",), None),
    "label": (("label",), None),
    "account": (("account",), None),
    "qos": (("qos",), None),
    "partition": (("partition",), None),
    "export": (("env",), parse_exports),
    "adaptive_batch": (("adaptive_batch",), None),
    "max_batch_size": (("max_batch_size",), None),
    "max_local_batch": (("max_local_batch",), None),
}

# the flag each field is set by, for messages
FLAG_NAMES = {
    "job_name": "--job-name", "job_type": "--type", "epochs": "--epochs", "command": "--wrap",
    "gpus_per_worker": "--gpus-per-worker", "cpus_per_worker": "--cpus-per-worker",
    "mem_per_worker": "--mem-per-worker", "cpus_per_ps": "--cpus-per-ps", "mem_per_ps": "--mem-per-ps",
    "max_workers": "--max-workers", "max_ps": "--max-ps", "sync_mode": "--sync-mode", "time": "--time",
    "owner": "--owner", "arch": "--arch", "batch_size": "--batch-size", "workers": "--workers",
    "epoch_seconds": "--epoch-seconds", "launch": "--launch", "label": "--label", "account": "--account",
    "qos": "--qos", "partition": "--partition", "export": "--export", "adaptive_batch": "--adaptive-batch",
    "max_batch_size": "--max-batch-size", "max_local_batch": "--max-local-batch",
}


def merge_submission(spec: Mapping[str, Any], flags: Mapping[str, Any], user: str) -> tuple[dict[str, Any], list[str]]:
    """The submission dict from a spec (possibly {}) and flags (None = not given), flags winning.

    Returns (submission, errors): errors are the flag values that could not be parsed; the result still
    goes through `validate_submission`, whose errors the caller adds. Owner defaults to `user`; the job
    type is normalised (aliases, case).
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in spec.items()}
    errors: list[str] = []
    for flag, value in flags.items():
        if value is None or flag not in FLAG_FIELDS:
            continue
        path, conv = FLAG_FIELDS[flag]
        if conv is not None:
            try:
                value = conv(value)
            except ValueError as e:
                errors.append(f"{FLAG_NAMES[flag]}: {e}")
                continue
        if flag == "workers" and isinstance(value, tuple):  # MIN-MAX: asked for MAX, at least MIN
            out["min_workers"], value = value
            if flags.get("max_workers") is None:
                out["max_workers"] = value
        if path == ("command",):
            out.pop("script", None)  # --wrap replaces the spec's command, whatever its key
        target = out
        for key in path[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        if isinstance(value, dict) and isinstance(target.get(path[-1]), dict):
            value = {**target[path[-1]], **value}  # --export adds to the spec's [env], name by name
        target[path[-1]] = value
    out.setdefault("owner", user)
    if "job_type" in out:
        out["job_type"] = normalize_job_type(out["job_type"])
    return out, errors


# field of the submission -> where a CLI user sets it
FIELD_HINTS = {
    "name": "name, or -J/--job-name",
    "job_type": "job_type, or --type",
    "total_epochs": "total_epochs, or --epochs",
    "worker.cpus": "[worker] cpus, or --cpus-per-worker",
    "worker.mem_gb": "[worker] mem_gb, or --mem-per-worker",
    "ps.cpus": "[ps] cpus, or --cpus-per-ps",
    "ps.mem_gb": "[ps] mem_gb, or --mem-per-ps",
    "batch_size": "batch_size, or --batch-size",
}

_MISSING_NUMBER_RE = re.compile(r"^(\S+) must be (?:a number|an integer), got None$")


def explain_errors(errors: list[str]) -> list[str]:
    """Rephrase `validate_submission`'s messages about missing fields so that they name the spec key and
    the flag that set it; other messages are kept as they are."""
    out = []
    for msg in errors:
        m = _MISSING_NUMBER_RE.match(msg)
        if m and m.group(1) in FIELD_HINTS:
            msg = f"missing {m.group(1)} (give {FIELD_HINTS[m.group(1)]})"
        elif msg.startswith("name must be") and msg.endswith("got None"):
            msg = f"missing name (give {FIELD_HINTS['name']})"
        elif msg.startswith("unknown job type None"):
            msg = (f"missing job type (give {FIELD_HINTS['job_type']}): any model name for an all-reduce job "
                   f"(measured: {', '.join(ALLREDUCE_MODELS)}), or for a PS job one of {', '.join(TYPE_NAMES)}")
        elif msg.startswith(("worker must be a mapping", "ps must be a mapping")) and msg.endswith("got None"):
            role = msg.split()[0]
            msg = (f"missing {role} demand: give [{role}] cpus and mem_gb in the spec, "
                   f"or --cpus-per-{role} and --mem-per-{role}")
        elif msg.startswith("missing script"):
            msg += " or --wrap"
        out.append(msg)
    return out
