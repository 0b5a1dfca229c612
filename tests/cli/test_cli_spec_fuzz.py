"""Fuzzing of the job-spec path `dl2ctl submit` takes: the spec text parsed
(`parse_spec_text`, JSON or TOML), merged with flags (`merge_submission`, which also normalises the model's
name) and validated (`validate_submission`). Each input ends in a valid submission or in the one-line errors
(`SpecError`, the merge's flag errors, `SubmissionError`), never another exception; within a deadline; and
the memory it allocates (traced) stays small next to its size.

Inputs start from valid specs (a PS job, an all-reduce job with Slurm's account/QOS/partition and a declared
environment), then are mutated as data (a field replaced by a wild value: wrong types, NaN/inf, integers of
hundreds of digits, nesting, strings with newlines or NUL; fields deleted; unknown keys) and as text (cut
short, characters flipped or inserted, runs of digits or brackets inserted, slices duplicated), plus
random text. `pytest --hypothesis-show-statistics` shows how many inputs ended in which outcome (the figures
in docs/security.md)."""
from __future__ import annotations

import json
import math
import tracemalloc

from hypothesis import event, given, settings
from hypothesis import strategies as st

from dl2d.cli.jobspec import SpecError, merge_submission, parse_spec_text
from dl2d.db.jobs import SubmissionError, validate_submission

PS_SPEC = {"name": "resnet-a", "job_type": "resnet-50", "total_epochs": 30, "command": "python train.py",
           "max_workers": 8, "max_ps": 4, "sync": "sync", "time_limit_min": 1440,
           "worker": {"gpus": 1, "cpus": 4, "mem_gb": 16}, "ps": {"cpus": 2, "mem_gb": 8}}
ALLREDUCE_SPEC = {"name": "bert-a", "kind": "allreduce", "job_type": "bert", "batch_size": 96, "workers": 8,
                  "total_epochs": 2, "command": "torchrun train.py", "launch": "srun", "label": "bert-large",
                  "account": "proj-a", "qos": "normal", "partition": "gpu,gpu-long",
                  "env": {"WANDB_PROJECT": "bert", "OMP_NUM_THREADS": "8"},
                  "worker": {"gpus": 1, "cpus": 8, "mem_gb": 40}}
KEYS = sorted({*PS_SPEC, *ALLREDUCE_SPEC, "script", "epoch_seconds", "owner", "bogus"})
SUBKEYS = ("gpus", "cpus", "mem_gb", "WANDB_PROJECT", "DL2D_DB_URL", "SLURM_JOB_ID", "1BAD", "bogus")

#: The most one input may allocate (traced), beyond a few times its own size: a spec is a few hundred bytes.
MEMORY_BASE = 4 * 1024 * 1024

_wild = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(10**200, 10**400),
              st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
              st.sampled_from(["", "a\n", "x\x00y", "-1", "1e309", "nan", "../../etc/passwd", "$(rm -rf /)",
                               "resnet50", "BERT", "allreduce", "async", "once", "a,b", ",", "nobody", "root"])),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.sampled_from(SUBKEYS) | st.text(max_size=8),
                                                              kids, max_size=4),
    max_leaves=20)


def _toml_value(v) -> str:
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))


def to_text(spec: dict, fmt: str) -> str:
    """The spec as a JSON document or as TOML (tables as inline tables; None, which TOML lacks, as "")."""
    if fmt == "json":
        return json.dumps(spec, allow_nan=True)
    return "\n".join(f"{json.dumps(str(k))} = {_toml_value('' if v is None else v)}" for k, v in spec.items())


@st.composite
def mutated_specs(draw):
    spec = json.loads(json.dumps(draw(st.sampled_from([PS_SPEC, ALLREDUCE_SPEC]))))
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(KEYS))
        how = draw(st.sampled_from(["replace", "delete", "nested"]))
        if how == "delete":
            spec.pop(key, None)
        elif how == "nested" and isinstance(spec.get(key), dict):
            spec[key][draw(st.sampled_from(SUBKEYS))] = draw(_wild)
        else:
            spec[key] = draw(_wild)
    fmt = draw(st.sampled_from(["json", "toml"]))
    text = to_text(spec, fmt)
    damage = draw(st.sampled_from(["none", "none", "cut", "flip", "insert", "digits", "brackets", "duplicate"]))
    if damage != "none" and text:
        i = draw(st.integers(0, len(text)))
        if damage == "cut":
            text = text[:i]
        elif damage == "flip":
            text = text[:i] + draw(st.characters()) + text[i + 1:]
        elif damage == "insert":
            text = text[:i] + draw(st.text(min_size=1, max_size=8)) + text[i:]
        elif damage == "digits":
            text = text[:i] + "9" * draw(st.integers(300, 6000)) + text[i:]
        elif damage == "brackets":
            text = text[:i] + draw(st.sampled_from("[{")) * draw(st.integers(100, 3000)) + text[i:]
        else:
            j = draw(st.integers(i, len(text)))
            text = text[:j] + text[i:j] + text[j:]
    return text, fmt, damage


def submit_path(text: str, fmt: str | None) -> str:
    """What dl2ctl submit does with a spec and no flags; the outcome's name."""
    try:
        spec = parse_spec_text(text, fmt, "fuzz.spec")
    except SpecError as e:
        assert "\n" not in str(e) and str(e).startswith("fuzz.spec: "), str(e)
        return "rejected: spec (parse)"
    data, errors = merge_submission(spec, {}, "alice")
    assert not errors  # no flags given
    try:
        sub = validate_submission(data)
    except SubmissionError as e:
        assert e.errors and all(isinstance(m, str) and m for m in e.errors)
        return "rejected: submission (validate)"
    assert sub.name and sub.owner and sub.total_epochs > 0 and json.dumps(sub.spec())  # a storable submission
    return "valid"


def run_one(text: str, fmt: str | None) -> str:
    tracemalloc.start()
    try:
        outcome = submit_path(text, fmt)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BASE + 64 * len(text.encode("utf-8", "surrogatepass")), (peak, len(text))
    return outcome


@settings(max_examples=1500, deadline=2000)
@given(case=mutated_specs())
def test_mutated_specs_end_in_a_valid_submission_or_clean_errors(case):
    text, fmt, damage = case
    event(f"{fmt}, {'text damaged' if damage != 'none' else 'data mutated'}: {run_one(text, fmt)}")


@settings(max_examples=500, deadline=2000)
@given(text=st.text(max_size=400), fmt=st.sampled_from(["json", "toml", None]))
def test_random_text_ends_in_clean_errors(text, fmt):
    event(f"random text: {run_one(text, fmt)}")


def test_the_unmutated_specs_are_valid():
    for spec in (PS_SPEC, ALLREDUCE_SPEC):
        for fmt in ("json", "toml"):
            assert run_one(to_text(spec, fmt), fmt) == "valid", (spec["name"], fmt)
