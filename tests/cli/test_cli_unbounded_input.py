"""Unbounded and malformed input gets a clear error, never a traceback: huge integers,
names ending in a newline, a 20 MB command, nesting bombs and thousand-digit integers in a spec, a non-UTF-8
spec file, job ids beyond the database's range; and a hypothesis fuzz of the spec parser + validation.
Also the simulated cluster's size (`--servers`, `sim.servers`) and `dl2ctl train --out` checked before training
(trace files: tests/sim/test_trace_bounds.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2d.cli.jobspec import SpecError, parse_spec_text
from dl2d.db.jobs import SubmissionError, validate_submission
from testkit.db import submission


@pytest.mark.parametrize("change, message", [
    ({"total_epochs": 10 ** 400}, "total_epochs must be a number"),
    ({"max_workers": 10 ** 400}, "max_workers must be an integer"),
    ({"name": "job\n"}, "name must be 1-64 characters"),
    ({"owner": "alice\n"}, "owner must be a unix user name"),
    ({"command": "x" * 20_000_000}, "command must be at most 65536 characters"),
])
def test_oversized_or_sneaky_values_are_rejected(change, message):
    with pytest.raises(SubmissionError) as e:
        validate_submission(submission(**change))
    assert message in str(e.value)


@pytest.mark.parametrize("text, fmt, message", [
    ("[" * 100_000 + "]" * 100_000, "json", "unusable JSON"),
    ('{"a": ' + "9" * 5000 + "}", "json", "unusable JSON"),
    ("a = " + "9" * 5000, "toml", "unusable TOML"),
    ("x" * 1_000_001, "toml", "at most 1000000 characters"),
])
def test_spec_bombs_are_clean_errors(text, fmt, message):
    with pytest.raises(SpecError, match=message):
        parse_spec_text(text, fmt, "bomb")


def test_cli_refuses_non_utf8_specs_and_out_of_range_ids(dl2ctl, tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_bytes(b"name = \"\xff\xfe\"\n")
    r = dl2ctl("submit", str(bad))
    assert r.exit_code == 1 and "not UTF-8 text" in r.output and "Traceback" not in r.output
    for args in (("show", str(2 ** 70)), ("cancel", str(2 ** 70)), ("show", "0")):
        r = dl2ctl(*args)
        assert r.exit_code == 2 and "is not in the range" in r.output, (args, r.output)


_value = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                      lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                      max_leaves=25)


#: What parsing and validating one fuzzed spec may trace (tracemalloc's peak): the inputs are at most 300
#: characters and 25 leaves; a parser or a check that built something from a value's size (a 10**400 integer,
#: a long string repeated) would pass it by orders of magnitude.
FUZZ_TRACED_BYTES = 1024 * 1024


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300), fmt=st.sampled_from(["json", "toml", None]),
       data=st.dictionaries(st.sampled_from(["name", "owner", "job_type", "total_epochs", "command", "worker", "ps",
                                             "max_workers", "max_ps", "sync", "time_limit_min", "bogus"]), _value),
       over_valid=st.booleans())
def test_fuzzed_specs_end_in_a_clean_error_or_a_valid_submission(text, fmt, data, over_valid):
    """Random text through the spec parser, and random dicts (alone, or laid over a valid submission, so that
    some stay valid) through validation: each ends in a valid result (a table; a JobSubmission of the values
    given) or the component's error of one line naming what is wrong (SpecError naming the source;
    SubmissionError listing every problem), never another exception, within FUZZ_TRACED_BYTES. The outcomes
    are hypothesis events (pytest --hypothesis-show-statistics; figures in docs/security.md)."""
    import tracemalloc

    from hypothesis import event

    from dl2d.db.jobs import JobSubmission

    if over_valid:
        data = submission(**data)
    tracemalloc.start()
    try:
        try:
            parsed = parse_spec_text(text, fmt, "fuzz")
            assert isinstance(parsed, dict)
            event("text: parsed")
        except SpecError as e:
            assert str(e).startswith("fuzz: ") and "\n" not in str(e), str(e)
            event("text: rejected")
        try:
            sub = validate_submission(data)
            assert isinstance(sub, JobSubmission) and sub.name == data["name"] and sub.owner == data["owner"]
            event("dict: valid")
        except SubmissionError as e:
            assert e.errors and all(m and "\n" not in m for m in e.errors), e.errors
            assert str(e).startswith("invalid job submission: ") and "\n" not in str(e)
            event("dict: rejected")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < FUZZ_TRACED_BYTES, peak


# ---------------------------------------------------------------- cluster size and `dl2ctl train --out` (item 6)

@pytest.mark.parametrize("command", ["sim", "train"])
def test_a_cluster_of_1e8_servers_is_refused_naming_the_option(command):
    from click.testing import CliRunner

    from dl2d.cli.main import cli

    r = CliRunner().invoke(cli, [command, "--servers", "100000000"])
    assert r.exit_code == 2, r.output
    assert "--servers" in r.output and "1<=x<=10000" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("file_data, env, source", [
    ({"sim": {"servers": 100_000_000}}, {}, "sim.servers: must be in 0..10000"),
    ({}, {"DL2D_SIM_SERVERS": "100000000"}, "sim.servers: must be in 0..10000"),
    ({"sim": {"servers": -1}}, {}, "sim.servers: must be in 0..10000"),
])
def test_the_daemons_sim_servers_is_bounded_before_anything_is_allocated(file_data, env, source):
    import tracemalloc

    from dl2d.daemon.config import ConfigError, build_config

    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=source) as e:
            build_config(file_data, env)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "got 100000000" in str(e.value) or "got -1" in str(e.value)
    assert peak < 20 * 2 ** 20  # a 1e8-server cluster is 2.4 GB per array
    assert build_config({"sim": {"servers": 10_000}}).sim.servers == 10_000


def test_a_cluster_spec_is_bounded_where_it_is_built():
    from dl2d.sim.cluster import MAX_SERVERS, ClusterSpec

    with pytest.raises(ValueError, match="at most 10000 servers, not 100000000"):
        ClusterSpec(100_000_000)
    assert ClusterSpec(MAX_SERVERS).empty().shape == (MAX_SERVERS, 3)


TINY_TRAIN = ["train", "--policy", "dl2", "--cluster", "tiny", "--jobs", "3", "--max-jobs", "4", "--hidden", "8",
              "--sl-epochs", "1", "--sl-traces", "1"]


def test_train_refuses_an_out_path_it_could_not_write_before_training(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dl2d.cli.main import cli
    from dl2d.policy.dl2 import learn
    trained = []
    monkeypatch.setattr(learn, "supervised", lambda *a, **k: trained.append(1))  # must never be reached
    (tmp_path / "file").write_text("x")
    cases = [(tmp_path / "file" / "p.ckpt", "is not a directory"),
             (tmp_path / "missing" / "p.ckpt", "does not exist")]
    if Path("/sys").is_dir():  # root ignores permissions, not this: a file cannot be created in /sys
        cases.append((Path("/sys/dl2d-test-policy.ckpt"), "cannot create a file in '/sys'"))
    for out, message in cases:
        r = CliRunner().invoke(cli, TINY_TRAIN + ["--out", str(out)])
        assert r.exit_code == 2, r.output
        assert "--out" in r.output and message in r.output and "Traceback" not in r.output, r.output
    assert not trained and not list((tmp_path).glob("**/*.probe"))


def test_train_out_probe_leaves_nothing_behind_and_accepts_a_writable_directory(tmp_path):
    from dl2d.cli.train import out_problem

    assert out_problem(tmp_path / "p.ckpt") is None
    assert list(tmp_path.iterdir()) == []


def test_train_keeps_the_policy_when_out_fails_after_training(tmp_path, monkeypatch):
    """The directory may change while training runs: the policy is written to a temporary file and the
    message says where, instead of being lost."""
    from click.testing import CliRunner

    from dl2d.cli.main import cli
    from dl2d.policy import checkpoint as C

    out = tmp_path / "p.ckpt"
    real_save = C.save

    def save(path, ckpt):
        if Path(path) == out:
            raise PermissionError(13, "Permission denied")
        real_save(path, ckpt)

    import tempfile

    monkeypatch.setattr(C, "save", save)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    r = CliRunner().invoke(cli, TINY_TRAIN + ["--out", str(out)])
    assert r.exit_code == 1, r.output
    assert f"cannot write --out {out} (Permission denied)" in r.output and "Traceback" not in r.output
    rescued = list((tmp_path / "tmp").glob("dl2-policy-*.ckpt"))
    assert len(rescued) == 1 and str(rescued[0]) in r.output
    assert C.load(rescued[0]).config.max_jobs == 4


@pytest.mark.parametrize("args", [["sim", "--world", "dl2", "--jobs", "100000000"],
                                  ["sim", "--world", "dl2", "--max-arrivals", "10000000000000000000"],
                                  ["train", "--jobs", "100000000"]])
def test_generated_traces_are_bounded_like_trace_files(args):
    from click.testing import CliRunner

    from dl2d.cli.main import cli

    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and "1<=x<=50000" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("option", ["--slot-seconds", "--restart-seconds"])
@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_sim_time_settings_are_bounded(option, value):
    from click.testing import CliRunner

    from dl2d.cli.main import cli

    r = CliRunner().invoke(cli, ["sim", "--world", "dl2", "--cluster", "tiny", "--jobs", "2", option, value])
    assert r.exit_code == 2 and option in r.output and "86400" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("args", [["sim", "--load", "nan"], ["sim", "--world", "dl2", "--interference", "nan"],
                                  ["sim", "--world", "dl2", "--interference", "inf"], ["sim", "--slot-seconds", "nan"],
                                  ["sim", "--restart-seconds", "nan"], ["sim", "--slot-noise", "nan"],
                                  ["sim", "--estimate-error", "nan"], ["train", "--rl-lr", "nan"],
                                  ["train", "--entropy-weight", "inf"], ["train", "--epsilon", "nan"]])
def test_float_options_must_be_finite(args):
    from click.testing import CliRunner

    from dl2d.cli.main import cli

    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and args[-2] in r.output and "is not a finite number" in r.output, r.output
