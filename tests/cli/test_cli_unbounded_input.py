"""Unbounded and malformed input gets a clear error, never a traceback (issue #14, item 6): huge integers,
names ending in a newline, a 20 MB command, nesting bombs and thousand-digit integers in a spec, a non-UTF-8
spec file, job ids beyond the database's range; and a hypothesis fuzz of the spec parser + validation."""
from __future__ import annotations

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


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300), fmt=st.sampled_from(["json", "toml", None]),
       data=st.dictionaries(st.sampled_from(["name", "owner", "job_type", "total_epochs", "command", "worker", "ps",
                                             "max_workers", "max_ps", "sync", "time_limit_min", "bogus"]), _value))
def test_fuzzed_specs_end_in_a_clean_error_or_a_valid_submission(text, fmt, data):
    try:
        parse_spec_text(text, fmt, "fuzz")
    except SpecError:
        pass
    try:
        validate_submission(data)
    except SubmissionError:
        pass
