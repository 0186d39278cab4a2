import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.envs import EnvSpec
from ppojax.networks.distributions import (
    deterministic_action,
    draw_action_noise,
    policy_distribution,
    sample_from_noise,
)

DISCRETE = EnvSpec(obs_dim=1, discrete=True, action_dim=5, action_low=None, action_high=None)
LOGITS = np.array([0.3, 2.0, -1.0, 0.5, 1.5], np.float32)
MASK = np.array([True, False, True, True, False])  # hides the two most likely actions
OTHER_LOGITS = np.array([-0.2, 0.1, 0.9, 0.0, -3.0], np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def masked_probs(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """NumPy reference: the softmax over the allowed actions, 0 elsewhere."""
    probs = np.zeros_like(logits, np.float64)
    probs[mask] = softmax(logits[mask].astype(np.float64))
    return probs


def test_a_masked_action_has_probability_zero_and_the_rest_renormalize():
    dist = policy_distribution(DISCRETE, jnp.asarray(LOGITS), None, jnp.asarray(MASK))
    expected = masked_probs(LOGITS, MASK)
    log_probs = np.asarray([dist.log_prob(a) for a in range(5)])
    np.testing.assert_array_equal(np.exp(log_probs)[~MASK], 0.0)
    np.testing.assert_allclose(np.exp(log_probs)[MASK], expected[MASK], rtol=1e-6)
    allowed = expected[MASK]
    np.testing.assert_allclose(dist.entropy(), -(allowed * np.log(allowed)).sum(), rtol=1e-6)
    # Without the mask the same logits give the masked actions most of the probability.
    unmasked = policy_distribution(DISCRETE, jnp.asarray(LOGITS), None)
    assert float(jnp.exp(unmasked.log_prob(1))) > 0.4


def test_kl_between_masked_policies_counts_only_allowed_actions():
    mask = jnp.asarray(MASK)
    old = policy_distribution(DISCRETE, jnp.asarray(LOGITS), None, mask)
    new = policy_distribution(DISCRETE, jnp.asarray(OTHER_LOGITS), None, mask)
    p, q = masked_probs(LOGITS, MASK)[MASK], masked_probs(OTHER_LOGITS, MASK)[MASK]
    np.testing.assert_allclose(old.kl_divergence(new), (p * np.log(p / q)).sum(), rtol=1e-5)
    assert float(old.kl_divergence(old)) == 0.0


def test_masked_actions_are_never_sampled_and_gradients_stay_finite():
    mask = jnp.asarray(MASK)
    noise = draw_action_noise(DISCRETE, jax.random.key(0), (20_000,))
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (20_000, 5))
    actions, log_probs = sample_from_noise(DISCRETE, logits, None, noise, mask)
    counts = np.bincount(np.asarray(actions), minlength=5)
    assert counts[~MASK].sum() == 0
    # 20k draws: the frequencies lie within 0.015 (> 4 standard errors) of the probabilities.
    np.testing.assert_allclose(counts / 20_000, masked_probs(LOGITS, MASK), atol=0.015)
    assert np.isfinite(np.asarray(log_probs)).all()
    # the mode among the allowed logits 0.3, -1.0, 0.5
    assert int(deterministic_action(DISCRETE, jnp.asarray(LOGITS), mask)) == 3

    def objective(logits):
        dist = policy_distribution(DISCRETE, logits, None, mask)
        return dist.entropy() + dist.log_prob(3) + dist.kl_divergence(dist)

    grad = jax.grad(objective)(jnp.asarray(LOGITS))
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_array_equal(np.asarray(grad)[~MASK], 0.0)


MULTI = EnvSpec(1, True, 9, None, None, action_nvec=(3, 2, 4))
MULTI_LOGITS = np.array([0.1, -0.4, 1.2, 0.7, 0.0, -1.0, 0.3, 2.2, 0.5], np.float32)
PARTS = (slice(0, 3), slice(3, 5), slice(5, 9))


def np_entropy(logits: np.ndarray) -> float:
    probs = softmax(logits.astype(np.float64))
    return float(-(probs * np.log(probs)).sum())


def np_kl(logits: np.ndarray, other: np.ndarray) -> float:
    p, q = softmax(logits.astype(np.float64)), softmax(other.astype(np.float64))
    return float((p * np.log(p / q)).sum())


def test_multidiscrete_log_prob_entropy_and_kl_are_sums_over_the_choices():
    dist = policy_distribution(MULTI, jnp.asarray(MULTI_LOGITS), None)
    reversed_logits = MULTI_LOGITS[::-1].copy()
    other = policy_distribution(MULTI, jnp.asarray(reversed_logits), None)
    for action in ([0, 0, 0], [2, 1, 3], [1, 0, 2]):
        # NumPy reference: the sum of each choice's log-probability
        reference = sum(
            np.log(softmax(MULTI_LOGITS[part].astype(np.float64))[a])
            for part, a in zip(PARTS, action, strict=True)
        )
        np.testing.assert_allclose(dist.log_prob(jnp.asarray(action)), reference, rtol=1e-6)
    entropy = sum(np_entropy(MULTI_LOGITS[part]) for part in PARTS)
    np.testing.assert_allclose(dist.entropy(), entropy, rtol=1e-6)
    kl = sum(np_kl(MULTI_LOGITS[part], reversed_logits[part]) for part in PARTS)
    np.testing.assert_allclose(dist.kl_divergence(other), kl, rtol=1e-5)


GAUSSIAN = EnvSpec(obs_dim=1, discrete=False, action_dim=3, action_low=None, action_high=None)


def test_gaussian_log_prob_entropy_and_kl_equal_the_numpy_formulas():
    mean, log_std = np.array([0.2, -1.0, 0.5]), np.array([-0.5, 0.0, 0.3])
    other_mean, other_log_std = np.array([0.0, -0.4, 1.5]), np.array([0.1, -0.2, 0.3])
    dist = policy_distribution(GAUSSIAN, jnp.asarray(mean, jnp.float32), jnp.asarray(log_std))
    other = policy_distribution(
        GAUSSIAN, jnp.asarray(other_mean, jnp.float32), jnp.asarray(other_log_std)
    )
    action = np.array([0.7, -0.1, 0.0])
    std, other_std = np.exp(log_std), np.exp(other_log_std)
    log_prob = (-0.5 * ((action - mean) / std) ** 2 - np.log(std * np.sqrt(2 * np.pi))).sum()
    entropy = (0.5 * np.log(2 * np.pi * np.e * std**2)).sum()
    kl = (
        np.log(other_std / std) + (std**2 + (mean - other_mean) ** 2) / (2 * other_std**2) - 0.5
    ).sum()
    np.testing.assert_allclose(dist.log_prob(jnp.asarray(action, jnp.float32)), log_prob, rtol=1e-6)
    np.testing.assert_allclose(dist.entropy(), entropy, rtol=1e-6)
    np.testing.assert_allclose(dist.kl_divergence(other), kl, rtol=1e-5)
    assert float(dist.kl_divergence(dist)) == 0.0
    # the sampler of ppojax eval: 20k draws, mean and std within 4 standard errors
    batch = policy_distribution(
        GAUSSIAN,
        jnp.broadcast_to(jnp.asarray(mean, jnp.float32), (20_000, 3)),
        jnp.asarray(log_std),
    )
    samples = np.asarray(batch.sample(jax.random.key(0)))
    np.testing.assert_allclose(samples.mean(0), mean, atol=4 * std.max() / np.sqrt(20_000))
    np.testing.assert_allclose(samples.std(0), std, rtol=0.03)


def test_multidiscrete_samples_lie_in_each_choice_and_respect_a_per_choice_mask():
    mask = np.ones(9, bool)
    mask[[2, 3, 7]] = False  # no value 2 in choice 0, no 0 in choice 1, no 2 in choice 2
    noise = draw_action_noise(MULTI, jax.random.key(1), (5_000,))
    logits = jnp.broadcast_to(jnp.asarray(MULTI_LOGITS), (5_000, 9))
    actions, log_probs = sample_from_noise(MULTI, logits, None, noise, jnp.asarray(mask))
    actions = np.asarray(actions)
    assert actions.shape == (5_000, 3)
    assert (actions >= 0).all() and (actions < np.array([3, 2, 4])).all()
    assert not (actions[:, 0] == 2).any() and (actions[:, 1] == 1).all()
    assert not (actions[:, 2] == 2).any()
    dist = policy_distribution(MULTI, jnp.asarray(MULTI_LOGITS), None, jnp.asarray(mask))
    np.testing.assert_allclose(log_probs[:5], dist.log_prob(jnp.asarray(actions[:5])), rtol=1e-6)
    np.testing.assert_array_equal(
        deterministic_action(MULTI, jnp.asarray(MULTI_LOGITS), jnp.asarray(mask)), [0, 1, 3]
    )


@pytest.mark.parametrize("spec", [DISCRETE, MULTI])
def test_without_a_mask_the_policy_is_the_plain_categorical(spec):
    logits = jnp.asarray(LOGITS if spec is DISCRETE else MULTI_LOGITS)
    ones = jnp.ones(spec.action_dim, bool)
    masked, plain = (
        policy_distribution(spec, logits, None, ones),
        policy_distribution(spec, logits, None),
    )
    np.testing.assert_array_equal(masked.entropy(), plain.entropy())


def test_elementwise_argmax_picks_what_argmax_picks():
    """The CUDA default "elementwise_argmax": the first largest (ties), the first NaN, -inf
    masked choices, over 1 to ELEMENTWISE_ARGMAX_MAX choices, and it is what a sampled action
    takes where chosen."""
    from ppojax.networks import distributions
    from ppojax.runtime import kernels

    nan, inf = float("nan"), float("inf")
    rows = jnp.array(
        [[1.0, 3.0, 3.0, 0.0], [nan, 5.0, nan, 1.0], [2.0, nan, 9.0, 1.0], [-inf, -inf, 0.5, -inf]]
    )
    np.testing.assert_array_equal(distributions.elementwise_argmax(rows), jnp.argmax(rows, axis=-1))
    rng = np.random.default_rng(3)
    for choices in range(1, distributions.ELEMENTWISE_ARGMAX_MAX + 1):
        logits = jnp.asarray(rng.integers(-2, 3, size=(64, choices)), jnp.float32)  # many ties
        np.testing.assert_array_equal(
            distributions.elementwise_argmax(logits), jnp.argmax(logits, axis=-1)
        )

    def primitives(fn) -> str:  # a new function each time: traced afresh
        return str(jax.make_jaxpr(lambda x: fn(x))(rows))

    with kernels.use("elementwise_argmax"):
        assert "argmax" not in primitives(distributions.argmax_last)
    assert "argmax" in primitives(distributions.argmax_last)  # plain here: one argmax
