"""What a job writes for the daemon, checked before anything of it is believed. Pure.

A job runs as its owner and writes its own files (``progress.json``, ``checkpoint/coordinator.json``,
docs/jobs.md): to the daemon, which runs as root, they are input from a stranger. Each value the daemon reads
from them must be of its type, finite and in range before it reaches the database, a datetime or a socket: a
``NaN`` epoch would break the database's NOT NULL constraint, a ``time`` of ``1e18`` overflows the C library's
time conversion, and either would otherwise stop the whole slot for every job.

:func:`checked_progress` returns the report with only the fields the daemon reads, or raises
:class:`JobReportError` naming the field and the value; the backend then fails that job with the reason (an
event, and ``dl2ctl show`` says it) and goes on with the others. :func:`checked_coordinator` does the same for an
elastic runtime's published address. Fields the daemon does not read are left alone (a job may report more).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

#: The most epochs any report may claim (the submission's own bound on ``epochs`` is far below it).
MAX_EPOCHS = 1e6
#: The most steps a report may count (``step``, ``total_steps``, ``lost_steps``).
MAX_STEPS = 1e15
#: A report's ``time`` (unix seconds) must lie in these years, 2000-2100: anything else is no clock reading, and
#: values far outside overflow the conversion to a date.
TIME_RANGE = (946_684_800.0, 4_102_444_800.0)
#: The longest ``state`` / ``status`` word (the contract's words are ten letters at most).
MAX_STATE_CHARS = 32
#: ``host:port`` of a coordinator: a DNS name or an IPv4 address, or an IPv6 one in brackets.
ADDRESS = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]):([0-9]{1,5})$")

#: The numeric fields the daemon reads, with their bounds.
NUMBERS = {"epoch": MAX_EPOCHS, "epochs": MAX_EPOCHS, "step": MAX_STEPS, "total_steps": MAX_STEPS,
           "lost_steps": MAX_STEPS}


class JobReportError(ValueError):
    """A value in a job's own file that the daemon refuses; the message names the file's field."""


def _number(doc: Mapping[str, Any], key: str, high: float, low: float = 0.0) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise JobReportError(f"{key} must be a number, not {type(value).__name__}")
    if isinstance(value, int) and not low <= value <= high:  # an int beyond float's range is refused here
        raise JobReportError(f"{key} = {value:.3g} is outside [{low:g}, {high:g}]")
    if not math.isfinite(value):
        raise JobReportError(f"{key} = {value} is not a finite number")
    if not low <= value <= high:
        raise JobReportError(f"{key} = {value:.6g} is outside [{low:g}, {high:g}]")
    return float(value)


def _word(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_STATE_CHARS or not value.isprintable():
        raise JobReportError(f"{key} must be a short word, not {str(value)[:40]!r}")
    return value


def checked_progress(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The progress report's fields the daemon reads (``epoch``, ``epochs``, ``step``, ``total_steps``,
    ``lost_steps``, ``time``, ``state``, ``status``; an adaptive job's batch and noise,
    :func:`checked_batch_report`), each checked; None for no report. JobReportError names the first bad one.
    ``step`` beyond ``total_steps`` is refused too: it would claim more than the whole job."""
    if doc is None:
        return None
    out: dict[str, Any] = {}
    for key, high in NUMBERS.items():
        value = _number(doc, key, high)
        if value is not None:
            out[key] = value
    said = _number(doc, "time", TIME_RANGE[1], TIME_RANGE[0])
    if said is not None:
        out["time"] = said
    for key in ("state", "status"):
        word = _word(doc, key)
        if word is not None:
            out[key] = word
    step, total = out.get("step"), out.get("total_steps")
    if step is not None and total is not None and total > 0 and step > total:
        raise JobReportError(f"step = {step:g} is beyond total_steps = {total:g}")
    out.update(checked_batch_report(doc))
    return out


#: The largest squared gradient norm or variance a report may give (beyond it an estimate has diverged).
MAX_NOISE = 1e30
#: The largest total batch a report may say it trains at (the submission's own bound).
MAX_REPORTED_BATCH = 2.0 ** 24


def checked_batch_report(doc: Mapping[str, Any]) -> dict[str, Any]:
    """An adaptive job's ``batch_size`` and gradient noise (``grad_sqr`` > 0, ``grad_var`` >= 0, both or neither)
    from its report. Unlike the fields above, a bad one does not fail the job: it is left out, never applied, and
    ``report_error`` says why (the daemon flags the job with it; a noisy estimate is no broken contract)."""
    out: dict[str, Any] = {}
    try:
        batch = _number(doc, "batch_size", MAX_REPORTED_BATCH)
        if batch is not None:
            if not batch > 0:
                raise JobReportError("batch_size must be > 0")
            out["batch_size"] = batch
        sqr, var = _number(doc, "grad_sqr", MAX_NOISE), _number(doc, "grad_var", MAX_NOISE)
        if (sqr is None) != (var is None):
            raise JobReportError("grad_sqr and grad_var come together")
        if sqr is not None:
            if not sqr > 0:
                raise JobReportError(f"grad_sqr = {sqr:g} must be > 0")
            out.update(grad_sqr=sqr, grad_var=var)
    except JobReportError as e:
        out = {k: v for k, v in out.items() if k == "batch_size"}
        out["report_error"] = f"its gradient noise report is refused: {e}"
    return out


def checked_coordinator(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An elastic runtime's ``coordinator.json`` with its ``address`` checked (``host:port``, a port in
    1-65535); None for none. JobReportError for anything else: the daemon would otherwise open a connection
    to whatever the job wrote."""
    if doc is None:
        return None
    address = doc.get("address")
    if not isinstance(address, str) or not (m := ADDRESS.match(address)) or not 1 <= int(m.group(1)) <= 65535:
        raise JobReportError(f"address must be host:port, not {str(address)[:60]!r}")
    return {"address": address}
