import jax
import jax.numpy as jnp
import numpy as np

import ppojax
from ppojax.types import Batch
from ppojax.update import learning_rate_at, shuffle_into_minibatches


def test_shuffle_is_a_permutation_split_into_minibatches():
    n = 24
    batch = Batch(*(jnp.arange(n, dtype=jnp.float32) * (i + 1) for i in range(6)))
    minibatches = shuffle_into_minibatches(jax.random.key(0), batch, 4)
    assert minibatches.obs.shape == (4, 6)
    seen = np.sort(np.asarray(minibatches.obs).ravel())
    np.testing.assert_array_equal(seen, np.arange(n))
    assert not np.array_equal(np.asarray(minibatches.obs).ravel(), np.arange(n))
    # every field is permuted the same way, so samples stay whole
    np.testing.assert_allclose(minibatches.target, minibatches.obs * 6)
    other = shuffle_into_minibatches(jax.random.key(1), batch, 4)
    assert not np.array_equal(other.obs, minibatches.obs)


def test_learning_rate_anneals_linearly_per_gradient_step():
    config = ppojax.PPOConfig(learning_rate=1e-3)
    total = config.num_gradient_steps
    np.testing.assert_allclose(learning_rate_at(config, 0), 1e-3)
    np.testing.assert_allclose(
        learning_rate_at(config, total // 2), 1e-3 * (1 - (total // 2) / total)
    )
    np.testing.assert_allclose(learning_rate_at(config, total), 0.0)
    constant = config.replace(anneal_lr=False)
    np.testing.assert_allclose(learning_rate_at(constant, total), 1e-3)
