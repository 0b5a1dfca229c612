"""`dl2ctl report`'s decision_sources says which policy decided: one row per policy in charge and source, so the
slots before and after a reload that changed the policy are told apart; its title names no policy network
(under DRF there is none), and decisions recorded before the policy was stored say so."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from click.testing import CliRunner

from dl2d.cli.main import cli
from dl2d.db.engine import session_scope
from dl2d.db.report import queries
from dl2d.db.slots import DecisionRecord, record_slot

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _decide(engine, number: int, policy: str | None, source: str = "policy", latency: float = 10.0) -> None:
    with session_scope(engine) as s:
        record_slot(s, number, T0 + timedelta(minutes=number), [],
                    DecisionRecord("0" * 64, [], source=source, latency_ms=latency, policy=policy))


def test_decisions_before_and_after_a_reload_are_told_apart_by_their_policy(engine, db_url):
    _decide(engine, 1, None)  # a decision recorded before the policy was
    for n in (2, 3):
        _decide(engine, n, "drf")
    _decide(engine, 4, "dl2-target", latency=30.0)  # the policy reloaded
    _decide(engine, 5, "dl2-target", source="fallback", latency=50.0)
    r = CliRunner().invoke(cli, ["report", "--db", db_url, "--only", "decision_sources", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["decision_sources"]
    assert [(x["policy"], x["source"], x["n_decisions"], round(x["share"], 6), x["avg_latency_ms"])
            for x in rows] == [("(not recorded)", "policy", 1, 0.2, 10.0), ("dl2-target", "fallback", 1, 0.2, 50.0),
                               ("dl2-target", "policy", 1, 0.2, 30.0), ("drf", "policy", 2, 0.4, 10.0)]


def test_the_title_names_no_policy_network_and_the_table_shows_the_policy(engine, db_url):
    title = queries()["decision_sources"].description
    assert "network" not in title and "policy in charge" in title, title
    _decide(engine, 1, "drf")
    r = CliRunner().invoke(cli, ["report", "--db", db_url, "--only", "decision_sources"])
    assert r.exit_code == 0, r.output
    assert "policy network" not in r.stdout and "drf" in r.stdout
