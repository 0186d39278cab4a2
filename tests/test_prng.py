"""ppojax.prng draws flat for compile time; its values must be jax.random's, bit for bit."""

import jax
import numpy as np
import pytest

from ppojax import prng


@pytest.mark.parametrize("shape", [(128, 4), (3, 5, 2), (7,)])
def test_flat_draws_equal_jax_random_draws_of_the_shape(shape):
    key = jax.random.key(11)
    np.testing.assert_array_equal(
        jax.random.key_data(prng.split(key, shape)),
        jax.random.key_data(jax.random.split(key, shape)),
    )
    for sampler in (jax.random.normal, jax.random.gumbel, jax.random.bits, jax.random.uniform):
        np.testing.assert_array_equal(prng.draw(sampler, key, shape), sampler(key, shape))


def test_flat_draws_equal_jax_random_draws_under_vmap():
    keys = jax.random.split(jax.random.key(3), 4)
    ours = jax.jit(jax.vmap(lambda k: prng.draw(jax.random.gumbel, k, (16, 4, 2))))(keys)
    theirs = jax.jit(jax.vmap(lambda k: jax.random.gumbel(k, (16, 4, 2))))(keys)
    np.testing.assert_array_equal(ours, theirs)
