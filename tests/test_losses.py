import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import assert_close

from ppojax.engine import losses


def test_clipped_surrogate_hand_values():
    ratios = jnp.array([0.5, 1.0, 1.5])
    advantages = jnp.array([1.0, -1.0, 2.0])
    # min(r A, clip(r) A): min(0.5, 0.8)=0.5, min(-1, -1)=-1, min(3, 2.4)=2.4
    loss = losses.clipped_surrogate_loss(jnp.log(ratios), advantages, 0.2)
    np.testing.assert_allclose(loss, -(0.5 - 1.0 + 2.4) / 3, rtol=1e-6)


@pytest.mark.parametrize(
    "ratio,advantage,gradient_is_zero",
    [
        (1.5, 2.0, True),  # above 1 + eps with A > 0: the clipped term is the min
        (0.5, -1.0, True),  # below 1 - eps with A < 0: the clipped term is the min
        (0.5, 1.0, False),  # below the band with A > 0: the unclipped term is the min
        (1.5, -1.0, False),  # above the band with A < 0: the unclipped term is the min
        (1.1, 1.0, False),  # inside the band
    ],
)
def test_clipped_surrogate_gradient_vanishes_only_where_the_min_picks_the_clip(
    ratio, advantage, gradient_is_zero
):
    def loss(log_ratio):
        return losses.clipped_surrogate_loss(log_ratio, jnp.array([advantage]), 0.2)

    gradient = jax.grad(loss)(jnp.log(jnp.array([ratio])))[0]
    if gradient_is_zero:
        assert gradient == 0.0
    else:
        # d/dlogr of -(r A) is -r A
        np.testing.assert_allclose(gradient, -ratio * advantage, rtol=1e-6)


def test_value_loss_unclipped_is_half_mse():
    values = jnp.array([1.0, 2.0])
    targets = jnp.array([0.0, 4.0])
    np.testing.assert_allclose(losses.value_loss(values, values, targets, None), 0.5 * 5 / 2)


def test_value_clipping_changes_the_loss_only_outside_the_band():
    old = jnp.array([1.0, 1.0, 1.0])
    targets = jnp.array([2.0, 2.0, 2.0])
    new = jnp.array([1.1, 1.5, 0.5])
    # 1.1: inside band -> 0.81; 1.5: clipped to 1.2 -> max(0.25, 0.64); 0.5: max(2.25, 1.44)
    per_sample = [0.5 * 0.81, 0.5 * 0.64, 0.5 * 2.25]
    for i, expected in enumerate(per_sample):
        got = losses.value_loss(new[i : i + 1], old[i : i + 1], targets[i : i + 1], 0.2)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    unclipped = losses.value_loss(new, old, targets, None)
    clipped = losses.value_loss(new, old, targets, 0.2)
    np.testing.assert_allclose(clipped - unclipped, 0.5 * (0.64 - 0.25) / 3, rtol=1e-5)


def test_total_loss_combines_the_terms_with_their_coefficients():
    total = losses.total_loss(
        jnp.float32(-1.0), jnp.float32(4.0), jnp.float32(2.0), vf_coef=0.5, ent_coef=0.01
    )
    np.testing.assert_allclose(total, -1.0 + 0.5 * 4.0 - 0.01 * 2.0, rtol=1e-6)


def test_entropy_bonus_is_the_mean_entropy():
    np.testing.assert_allclose(losses.entropy_bonus(jnp.array([0.2, 0.4])), 0.3, rtol=1e-6)


def test_normalize_gives_zero_mean_unit_std():
    x = jnp.array([1.0, 2.0, 3.0, 10.0])
    z = losses.normalize(x)
    np.testing.assert_allclose(z.mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(z.std(), 1.0, rtol=1e-5)


def test_approx_kl_and_clip_fraction_hand_values():
    log_ratio = jnp.log(jnp.array([1.0, 2.0, 0.5, 1.1]))
    expected_kl = np.mean([0.0, 1.0 - np.log(2.0), -0.5 - np.log(0.5), 0.1 - np.log(1.1)])
    np.testing.assert_allclose(losses.approx_kl(log_ratio), expected_kl, rtol=1e-5)
    np.testing.assert_allclose(losses.clip_fraction(log_ratio, 0.2), 0.5)


def test_explained_variance():
    targets = jnp.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(losses.explained_variance(targets, targets), 1.0)
    np.testing.assert_allclose(losses.explained_variance(jnp.zeros(4), targets), 0.0, atol=1e-6)
    assert jnp.isnan(losses.explained_variance(targets, jnp.ones(4)))


def test_masked_terms_ignore_padding():
    rng = np.random.default_rng(0)
    log_ratio = jnp.asarray(rng.normal(0, 0.3, 6), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=6), jnp.float32)
    values = jnp.asarray(rng.normal(size=6), jnp.float32)
    old = jnp.asarray(rng.normal(size=6), jnp.float32)
    targets = jnp.asarray(rng.normal(size=6), jnp.float32)
    mask = jnp.array([1, 1, 1, 1, 0, 0])
    real = slice(0, 4)
    padded_junk = dict(log_ratio=log_ratio.at[4:].set(50.0), targets=targets.at[4:].set(1e6))
    pairs = [
        (
            losses.clipped_surrogate_loss(padded_junk["log_ratio"], advantages, 0.2, mask),
            losses.clipped_surrogate_loss(log_ratio[real], advantages[real], 0.2),
        ),
        (
            losses.value_loss(values, old, padded_junk["targets"], 0.2, mask),
            losses.value_loss(values[real], old[real], targets[real], 0.2),
        ),
        (losses.entropy_bonus(values, mask), losses.entropy_bonus(values[real])),
        (
            losses.approx_kl(padded_junk["log_ratio"], mask),
            losses.approx_kl(log_ratio[real]),
        ),
        (
            losses.clip_fraction(padded_junk["log_ratio"], 0.2, mask),
            losses.clip_fraction(log_ratio[real], 0.2),
        ),
        (
            losses.normalize(advantages.at[4:].set(99.0), mask)[real],
            losses.normalize(advantages[real]),
        ),
        (
            losses.explained_variance(values, padded_junk["targets"], mask),
            losses.explained_variance(values[real], targets[real]),
        ),
    ]
    # Padded and unpadded inputs have other shapes, so the sums run in another order: terms of
    # order 1 (the junk is masked out, never added), four of them, differ by ulps of 1.
    for masked, reference in pairs:
        assert_close(masked, reference, ulps=64)
