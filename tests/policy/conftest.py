"""Shared fixtures of the DL2 policy tests: one small PolicyConfig (J = 8, hidden 32) so that every jitted
function compiles once and quickly, and a tiny cluster whose per-job limits actually bind."""
from __future__ import annotations

import jax
import pytest

from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.nets import init_params
from dl2d.sim.engine import SimConfig
from testkit.policy import CFG, MAX_P, MAX_W, SIM, tiny_trace  # noqa: F401  (re-exported)


@pytest.fixture(scope="session")
def cfg() -> PolicyConfig:
    return CFG


@pytest.fixture(scope="session")
def sim() -> SimConfig:
    return SIM


@pytest.fixture(scope="session")
def params(cfg):
    return init_params(cfg, jax.random.PRNGKey(0))
