"""The LM trainers' registries (algorithms, loss aggregations, KL estimators) and the KL
penalty's functions, by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.checks import ConfigError
from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.rlhf.core import advantages as adv
from ppojax.rlhf.core import kl
from ppojax.rlhf.core.aggregation import AGGREGATIONS, aggregate
from ppojax.rlhf.core.credit import masked_group_advantages


@pytest.mark.parametrize(
    "field, registry",
    [
        ("algorithm", adv.ESTIMATORS),
        ("loss_aggregation", AGGREGATIONS),
        ("kl_estimator", kl.KL_ESTIMATORS),
    ],
)
def test_an_unknown_name_is_a_config_error_naming_the_field_and_the_known_names(field, registry):
    with pytest.raises(ConfigError, match=f"RLHFConfig.{field}") as info:
        RLHFConfig(**{field: "nonesuch"})
    assert info.value.field == field
    for name in registry:
        assert repr(name) in str(info.value)


def test_the_lookups_name_the_known_entries_and_fall_through_to_none():
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'; known: token"):
        aggregate(jnp.ones((1, 2)), jnp.ones((1, 2), bool), "mean")
    with pytest.raises(ValueError, match="unknown algorithm 'ppo2'; known: ppo, grpo, rloo"):
        adv.estimator("ppo2")
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl.kl_estimate(jnp.zeros(2), jnp.zeros(2), "k4")
    # PPO learns a critic: it has token GAE, no group baseline to fall back on
    with pytest.raises(ValueError, match="'ppo' learns a critic.*critic-free: grpo, rloo"):
        adv.sequence_advantages("ppo", jnp.ones(4), 2, True)


def test_needs_critic_and_the_group_size_are_the_estimator_s():
    assert RLHFConfig(algorithm="ppo").needs_critic
    for name in adv.critic_free_names():
        assert not RLHFConfig(algorithm=name, group_size=2).needs_critic
        with pytest.raises(ConfigError, match="group_size must be >= 2"):
            RLHFConfig(algorithm=name, group_size=1)


def test_a_registered_estimator_is_one_registration(monkeypatch):
    """A new critic-free algorithm: RLHFConfig accepts its name, it needs no critic, and both
    the sequence and the turn-level advantages are its own (no fall-through to another)."""

    def best_of_group(rewards, group_size, divide_by_std):
        groups = rewards.reshape(-1, group_size)
        return (groups - groups.max(axis=1, keepdims=True)).reshape(-1)

    def masked_best(values, members, group_size, divide_by_std, eps=1e-6):
        return jnp.where(members, values - 10.0, 0.0)

    entry = adv.Estimator(False, best_of_group, masked_best)
    monkeypatch.setitem(adv.ESTIMATORS, "best", entry)
    config = RLHFConfig(algorithm="best", group_size=2)
    assert not config.needs_critic
    assert "best" in adv.critic_free_names()
    out = adv.sequence_advantages("best", jnp.array([1.0, 3.0, 5.0, 2.0]), 2, True)
    np.testing.assert_allclose(out, [-2.0, 0.0, 0.0, -3.0])
    values, members = jnp.array([[1.0], [4.0]]), jnp.array([[True], [False]])
    masked = masked_group_advantages("best", values, members, 2, True)
    np.testing.assert_allclose(masked, [[-9.0], [0.0]])


def test_a_critic_algorithm_without_a_critic_names_the_critic_free_ones():
    with pytest.raises(ConfigError, match="choose algorithm='grpo' or 'rloo'") as info:
        make_trainer(RLHFConfig(algorithm="ppo"), lambda p, t, m: t, lambda *a: a[0][:, 0])
    assert info.value.field == "critic_apply"


def test_the_kl_penalty_by_hand():
    """log pi = -1, log pi_ref = -2: log rho = -1; k1 = 1, k2 = 0.5, k3 = e^-1 - 1 + 1."""
    log_probs, ref = jnp.array([-1.0]), jnp.array([-2.0])
    in_loss = RLHFConfig(kl_in="loss", kl_estimator="k2")
    np.testing.assert_allclose(kl.loss_penalty(in_loss, 0.5, log_probs, ref), [0.25])
    np.testing.assert_allclose(
        kl.loss_penalty(in_loss.replace(kl_estimator="k3"), 2.0, log_probs, ref),
        [2.0 * np.exp(-1.0)],
        rtol=1e-6,
    )
    assert kl.loss_penalty(RLHFConfig(kl_in="reward"), 0.5, log_probs, ref) is None
    assert kl.reward_coef(RLHFConfig(kl_in="reward"), 0.3) == 0.3
    assert kl.reward_coef(in_loss, 0.3) == 0.0


def test_next_kl_coef_moves_beta_only_under_adaptive_kl():
    """64 rows, KL 3 against a target of 2 (error clipped to 0.2), horizon 320:
    beta = 0.1 * (1 + 0.2 * 64 / 320) = 0.104."""
    batch = {"advantages": jnp.zeros((64, 1))}  # any pytree of 64 rows
    beta, seq_kl = jnp.float32(0.1), jnp.float32(3.0)
    fixed = RLHFConfig(kl_target=2.0, kl_horizon=320.0)
    assert kl.next_kl_coef(fixed, beta, seq_kl, batch) is beta
    moved = kl.next_kl_coef(fixed.replace(adaptive_kl=True), beta, seq_kl, batch)
    np.testing.assert_allclose(moved, 0.104, rtol=1e-6)
