"""Pure parsers for Slurm's output: ``squeue --json``, ``sinfo --json``, ``scontrol show -o``,
host lists and GRES strings. No I/O here, so everything is unit-tested on recorded fixtures.

Shapes handled: Slurm 22.05 (OpenAPI v0.0.38, what Debian bookworm ships: plain numbers, string
states, ``sinfo`` output under ``"nodes"``) and, defensively, later ones seen in the docs: numbers
wrapped as ``{"set": .., "infinite": .., "number": ..}``, states as lists (``["IDLE", "DRAIN"]``),
``sinfo`` output under ``"sinfo"`` with nested ``nodes``/``cpus``/``gres`` objects, comments as
objects, ``gres/gpu`` instead of ``gres:gpu``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Iterable

from dl2d.slurm.driver import SlurmError, SlurmJob, SlurmNode, SlurmUnavailable

# Messages of Slurm clients that mean "controller unreachable right now", or a transient refusal
# (ESLURM_JOB_SETTING_DB_INX: "Job update not available right now, the DB index is being set, try
# again in a bit" -- seen on `scontrol update NumNodes` just after a job started or was resized).
_UNAVAILABLE_PATTERNS = re.compile(
    r"unable to contact slurm controller|connect failure|connection refused|socket timed out"
    r"|communication connection failure|zero bytes were transmitted|slurm backup controller"
    r"|controller in standby|slurmctld.* is down|timed out|try again in a bit",
    re.IGNORECASE)


def is_unavailable_message(stderr: str) -> bool:
    """Does a Slurm client's error text say the controller is unreachable (worth retrying)?"""
    return bool(_UNAVAILABLE_PATTERNS.search(stderr))


def number(value: Any) -> int | None:
    """A Slurm number: plain int, or the ``{"set", "infinite", "number"}`` object of newer
    versions (None when unset or infinite). Slurm's NO_VAL sentinels also give None."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return None if n in (0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE) else n


def text(value: Any) -> str:
    """A string field that newer versions sometimes wrap in an object or a list."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # e.g. comment: {"job": .., "administrator": .., "system": ..}
        for key in ("job", "description", "name", "value"):
            if isinstance(value.get(key), str):
                return value[key]
        return ""
    if isinstance(value, list):
        return ",".join(text(v) for v in value)
    return str(value)


def state_list(value: Any) -> list[str]:
    """Job/node state as upper-case words: ``"RUNNING"``, ``["IDLE", "DRAIN"]``,
    ``"IDLE+DRAIN"`` all work."""
    if value is None:
        return []
    items = value if isinstance(value, list) else re.split(r"[+,]", str(value))
    return [str(s).strip().upper() for s in items if str(s).strip()]


def _split_top_level(s: str) -> list[str]:
    """Split on commas that are not inside brackets or parentheses."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """``"node[1-3,7],gpu[01-02]"`` → ``("node1", "node2", "node3", "node7", "gpu01", "gpu02")``.
    Zero padding is kept. Several bracket groups in one name are expanded as a product."""
    if not hostlist or hostlist in ("(null)", "None"):
        return ()
    out: list[str] = []
    for item in _split_top_level(hostlist):
        names = [""]
        for m in re.finditer(r"([^\[]+)|\[([^\]]*)\]", item):
            if m.group(1) is not None:
                names = [n + m.group(1) for n in names]
                continue
            values: list[str] = []
            for rng in m.group(2).split(","):
                lo, _, hi = rng.partition("-")
                if hi:
                    width = len(lo)
                    values += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
                else:
                    values.append(lo)
            names = [n + v for n in names for v in values]
        out += names
    return tuple(out)


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string: ``"gpu:4"``, ``"gres:gpu:2"``, ``"gres/gpu:a100:2"``,
    ``"gpu:2(IDX:0-1)"``, ``"tmpsize:7T,gpu:l40s:4(S:0-1)"``; ``gpu`` without count = 1."""
    total = 0
    for item in _split_top_level(gres or ""):
        item = re.sub(r"\(.*\)$", "", item)
        item = re.sub(r"^gres[:/]", "", item)
        fields = item.split(":")
        if fields[0] != "gpu" or item in ("(null)", "N/A"):
            continue
        if len(fields) == 1:
            total += 1
        elif fields[-1].isdigit():
            total += int(fields[-1])
    return total


def tres_value(tres: str, key: str) -> int | None:
    """``tres_value("cpu=6,node=3,gres/gpu=6", "gres/gpu")`` → 6."""
    for item in (tres or "").split(","):
        k, _, v = item.partition("=")
        if k == key and v.isdigit():
            return int(v)
    return None


def load_json(data: str | bytes | dict, command: str) -> dict:
    """Decode a ``--json`` answer. Errors in it (Slurm 22.05 exits 0 with ``"errors"`` and no
    jobs when the controller is down) become :class:`SlurmUnavailable`: a query has no user
    input that could be wrong, so an error means the controller did not answer properly."""
    if isinstance(data, dict):
        doc = data
    else:
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise SlurmError(f"{command}: output is not JSON ({e})", command=command) from None
    if not isinstance(doc, dict):
        raise SlurmError(f"{command}: unexpected JSON document", command=command)
    errors = [e for e in doc.get("errors") or [] if e]
    if errors:
        msg = "; ".join(
            ", ".join(f"{k}={v}" for k, v in e.items()) if isinstance(e, dict) else str(e)
            for e in errors)
        raise SlurmUnavailable(f"{command} reported errors", command=command, stderr=msg)
    return doc


def parse_job(j: dict) -> SlurmJob:
    """One element of ``squeue --json``'s ``jobs``."""
    states = state_list(j.get("job_state"))
    node_list = text(j.get("nodes"))
    nodes = expand_hostlist(node_list)
    num_nodes = number(j.get("node_count"))
    if num_nodes is None:
        num_nodes = len(nodes)
    gpus = gpu_count(text(j.get("tres_per_node")))
    if not gpus:  # --gpus=N (per job) instead of --gres per node
        per_job = gpu_count(text(j.get("tres_per_job"))) or (
            tres_value(text(j.get("tres_alloc_str")), "gres/gpu") or 0)
        gpus = per_job // num_nodes if num_nodes else 0
    return SlurmJob(
        job_id=str(number(j.get("job_id"))),
        name=text(j.get("name")),
        state=states[0] if states else "UNKNOWN",
        reason=text(j.get("state_reason")),
        node_list=node_list,
        nodes=nodes,
        num_nodes=num_nodes,
        gpus_per_node=gpus,
        comment=text(j.get("comment")),
        restarts=number(j.get("restart_cnt")) or 0,
        submit_time=number(j.get("submit_time")) or None,
        start_time=number(j.get("start_time")) or None,
        time_limit_min=number(j.get("time_limit")),
        batch_host=text(j.get("batch_host")),
        cpus_per_node=number(j.get("minimum_cpus_per_node")) or 0,
        mem_mb_per_node=number(j.get("memory_per_node")) or 0,
        end_time=number(j.get("end_time")) or None,
        user=text(j.get("user_name")),
    )


def parse_squeue_json(data: str | bytes | dict) -> list[SlurmJob]:
    """``squeue --json`` → jobs."""
    doc = load_json(data, "squeue --json")
    return [parse_job(j) for j in doc.get("jobs") or []]


def _node_from_state(name: str, raw_state: Any, extra_flags: Iterable[str]) -> tuple[str, tuple]:
    words = state_list(raw_state)
    base = words[0].lower() if words else "unknown"
    flags = tuple(dict.fromkeys(words[1:] + [str(f).upper() for f in extra_flags]))
    return base, flags


def parse_node(n: dict) -> SlurmNode:
    """One element of ``sinfo --json``'s ``nodes`` (22.05 / v0.0.38 shape)."""
    base, flags = _node_from_state(n.get("name", ""), n.get("state"), n.get("state_flags") or [])
    partitions = n.get("partitions") or []
    return SlurmNode(
        name=text(n.get("name")),
        state=base,
        flags=flags,
        cpus=number(n.get("cpus")) or 0,
        cpus_alloc=number(n.get("alloc_cpus")) or 0,
        gpus=gpu_count(text(n.get("gres"))),
        gpus_alloc=gpu_count(text(n.get("gres_used"))),
        reason=text(n.get("reason")),
        partitions=tuple(text(p) for p in partitions) if isinstance(partitions, list)
        else tuple(p for p in text(partitions).split(",") if p),
        mem_mb=number(n.get("real_memory")) or 0,
    )


def _nodes_from_sinfo_entry(e: dict) -> list[SlurmNode]:
    """One element of the ``sinfo`` array of newer versions (23.x+): a group of nodes that
    share a state; per-node numbers are the group's ``maximum`` values."""
    names = (e.get("nodes") or {}).get("nodes") or []
    if isinstance(names, str):
        names = list(expand_hostlist(names))
    base, flags = _node_from_state("", (e.get("node") or {}).get("state"), [])
    cpus = e.get("cpus") or {}
    count = max(len(names), 1)
    gres = e.get("gres") or {}
    reason = e.get("reason")
    partition = text((e.get("partition") or {}).get("name"))
    memory = e.get("memory") or {}
    return [
        SlurmNode(
            name=name, state=base, flags=flags,
            cpus=number(cpus.get("maximum")) or (number(cpus.get("total")) or 0) // count,
            cpus_alloc=(number(cpus.get("allocated")) or 0) // count,
            gpus=gpu_count(text(gres.get("total"))),
            gpus_alloc=gpu_count(text(gres.get("used"))),
            reason=text(reason),
            partitions=(partition,) if partition else (),
            mem_mb=number(memory.get("maximum")) or 0,
        )
        for name in names
    ]


def parse_sinfo_json(data: str | bytes | dict) -> list[SlurmNode]:
    """``sinfo --json`` → nodes (one per node name, partitions merged)."""
    doc = load_json(data, "sinfo --json")
    if isinstance(doc.get("nodes"), list):
        found = [parse_node(n) for n in doc["nodes"]]
    else:
        found = [node for e in doc.get("sinfo") or [] for node in _nodes_from_sinfo_entry(e)]
    merged: dict[str, SlurmNode] = {}
    for node in found:
        if node.name in merged:  # same node listed once per partition
            old = merged[node.name]
            parts = tuple(dict.fromkeys(old.partitions + node.partitions))
            node = SlurmNode(**{**old.__dict__, "partitions": parts})
        merged[node.name] = node
    return list(merged.values())


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line → ``{key: value}``. Values may contain spaces
    (``OS=Linux 6.1 #1 SMP``): a value runs until the next ``Key=``."""
    matches = list(_SCONTROL_KEY.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(matches, matches[1:] + [None]):
        end = nxt.start() if nxt else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


def job_from_scontrol(rec: dict[str, str]) -> SlurmJob:
    """A job from ``scontrol show job -o`` (used for single-job look-ups)."""
    def opt(v: str) -> str:
        return "" if v in ("(null)", "None", "N/A") else v

    node_list = opt(rec.get("NodeList", ""))
    num = rec.get("NumNodes", "0").split("-")[0]
    limit = rec.get("TimeLimit", "")
    return SlurmJob(
        job_id=rec.get("JobId", ""),
        name=rec.get("JobName", ""),
        state=rec.get("JobState", "UNKNOWN").upper(),
        reason=opt(rec.get("Reason", "")),
        node_list=node_list,
        nodes=expand_hostlist(node_list),
        num_nodes=int(num) if num.isdigit() else 0,
        gpus_per_node=gpu_count(rec.get("TresPerNode", "")),
        comment=opt(rec.get("Comment", "")),
        restarts=int(rec.get("Restarts", "0") or 0),
        time_limit_min=parse_time_limit(limit),
        batch_host=opt(rec.get("BatchHost", "")),
        cpus_per_node=int(rec["MinCPUsNode"]) if rec.get("MinCPUsNode", "").isdigit() else 0,
        mem_mb_per_node=parse_mem_mb(rec.get("MinMemoryNode", "")),
        end_time=parse_local_time(rec.get("EndTime", "")),
        user=rec.get("UserId", "").split("(")[0],  # UserId=nobody(65534)
    )


_MEM_UNITS_MB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_mem_mb(s: str) -> int:
    """scontrol's memory (``1000M``, ``2G``, ``512``: MB without a unit) → MB; 0 when absent."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", (s or "").strip().upper())
    return round(float(m[1]) * _MEM_UNITS_MB[m[2] or "M"]) if m else 0


def parse_local_time(s: str) -> int | None:
    """scontrol's ``2024-05-01T12:00:00`` (the controller's local time) → unix seconds; None for
    ``Unknown``/``None``/empty."""
    try:
        return int(datetime.fromisoformat((s or "").strip()).timestamp())
    except ValueError:
        return None


def parse_time_limit(s: str) -> int | None:
    """Slurm time ``[D-]HH:MM:SS`` / ``MM:SS`` / ``MM`` → minutes (rounded up);
    ``UNLIMITED``/``INFINITE``/empty → None."""
    s = (s or "").strip()
    if not s or s.upper() in ("UNLIMITED", "INFINITE", "N/A", "NONE"):
        return None
    days, _, rest = s.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
    elif len(parts) == 1:  # MM
        parts = [0, parts[0], 0]
    elif len(parts) == 2:  # MM:SS
        parts = [0, *parts]
    secs = int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    return -(-secs // 60)
