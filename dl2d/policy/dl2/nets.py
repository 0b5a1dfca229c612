"""Policy and value networks (DL2 section 4.1): two hidden ReLU layers, softmax policy, linear value."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dl2d.policy.dl2.config import PolicyConfig


class MLP(nn.Module):
    hidden: int
    out: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.hidden, name="in")(x))
        x = nn.relu(nn.Dense(self.hidden, name="mid")(x))
        return nn.Dense(self.out, name="out")(x)


def networks(cfg: PolicyConfig) -> tuple[MLP, MLP]:
    return MLP(cfg.hidden, cfg.num_actions), MLP(cfg.hidden, 1)


def init_params(cfg: PolicyConfig, key) -> dict:
    pol, val = networks(cfg)
    kp, kv = jax.random.split(key)
    x = jnp.zeros((1, cfg.state_dim))
    return {"policy": pol.init(kp, x)["params"], "value": val.init(kv, x)["params"]}


def masked_logits(logits, mask):
    return jnp.where(mask, logits, -1e9)


def policy_logits(cfg: PolicyConfig, params, states):
    return networks(cfg)[0].apply({"params": params["policy"]}, states)


def value(cfg: PolicyConfig, params, states):
    return networks(cfg)[1].apply({"params": params["value"]}, states)[..., 0]
