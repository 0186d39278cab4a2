"""Float32 master weights under bf16 compute (``ppojax.engine.precision``): gradients of a
bf16 forward reach the float32 masters, a step at a post-training learning rate moves them
as a float32 step does, and the bf16-only state (``master_weights=False``) loses it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.engine import precision
from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.rlhf.core.trainer import in_compute_dtype
from ppojax.rlhf.models.transformer import transformer

VOCAB, LEN = 16, 16
BF16 = jnp.dtype(jnp.bfloat16)


def test_widened_cast_and_compute_dtype_touch_floats_only():
    tree = {"w": jnp.ones(3, jnp.bfloat16), "n": jnp.arange(3), "f": jnp.ones(2)}
    wide = precision.widened(tree)
    assert wide["w"].dtype == jnp.float32 and wide["n"].dtype == tree["n"].dtype
    assert precision.cast(wide, "bfloat16")["f"].dtype == BF16
    assert precision.cast(wide, "bfloat16")["n"].dtype == tree["n"].dtype
    assert precision.compute_dtype({"a": tree["w"]}) == BF16
    assert precision.compute_dtype(tree) is None  # mixed: no single compute dtype
    assert precision.cast(tree, None) is tree


def models(dtype):
    return transformer(VOCAB, LEN, d_model=64, num_heads=4, num_layers=2, dtype=dtype)


def test_bf16_forward_gives_the_float32_masters_float32_gradients_close_to_float32s():
    master = models("float32").init(jax.random.key(0))
    reference = precision.cast(master, "bfloat16")  # the model as loaded in bf16
    tokens = jax.random.randint(jax.random.key(1), (4, LEN), 0, VOCAB)
    mask = jnp.ones_like(tokens, bool)

    def loss_of(lm):
        def loss(params):
            logits = lm.policy_apply(params, tokens, mask).astype(jnp.float32)
            log_probs = jax.nn.log_softmax(logits[:, :-1])
            return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], -1).mean()

        return loss

    mixed = jax.grad(in_compute_dtype(loss_of(models("bfloat16")), reference))(master)
    wide = jax.grad(loss_of(models("float32")))(master)
    assert {leaf.dtype for leaf in jax.tree.leaves(mixed)} == {jnp.dtype(jnp.float32)}
    # bf16 keeps 8 bits of mantissa: each op rounds by <= 2^-9 (0.2%) of its value, and the
    # two layers, softmax and head add up some tens of such roundings; 5% of each leaf's
    # largest gradient bounds that, while a gradient of another loss or of unmixed params
    # differs by its whole size.
    for got, want in zip(jax.tree.leaves(mixed), jax.tree.leaves(wide), strict=True):
        assert np.abs(got - want).max() <= 0.05 * np.abs(want).max() + 1e-12


def reward(prompts, prompt_mask, responses, response_mask):
    # the mean token id: it differs between a group's sampled responses, so every group has
    # advantages and every parameter a gradient (a sparse reward can tie a whole group at 0)
    return (responses * response_mask).mean(axis=1).astype(jnp.float32)


def one_step(dtype, master_weights):
    lm = models(dtype)
    params = precision.cast(models("float32").init(jax.random.key(0)), dtype)
    config = RLHFConfig(
        algorithm="grpo",
        group_size=4,
        response_len=8,
        pad_id=0,
        eos_id=1,
        learning_rate=1e-6,
        num_minibatches=1,
        update_epochs=1,
        master_weights=master_weights,
    )
    trainer = make_trainer(config, lm.policy_apply, reward, kv_cache=lm.kv_cache)
    state = trainer.init(params, jax.random.key(1))
    prompts = jax.random.randint(jax.random.key(2), (4, 4), 2, VOCAB)
    new, _ = jax.jit(trainer.step)(state, prompts, jnp.ones_like(prompts, bool), jax.random.key(3))
    return state, new


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_step_at_lr_1e6_moves_the_masters_as_float32_does_and_bf16_state_loses_it(dtype):
    state, new = one_step(dtype, master_weights=True)
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}
    assert {leaf.dtype for leaf in jax.tree.leaves(new.opt_state) if leaf.ndim} == {
        jnp.dtype(jnp.float32)
    }
    assert {leaf.dtype for leaf in jax.tree.leaves(state.reference)} == {jnp.dtype(dtype)}

    def moved(before, after):
        kernels = [
            (a, b)
            for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
            if a.ndim == 2
        ]
        return np.mean(np.concatenate([np.ravel(a != b) for a, b in kernels]))

    # Adam's first step is lr * g / (|g| + eps): every entry with a gradient moves by ~1e-6,
    # which float32 keeps (spacing 1.9e-9 at 0.02) and bf16 rounds away (spacing 1.2e-4)
    assert moved(state.params, new.params) > 0.95
    if dtype == "bfloat16":
        state, new = one_step(dtype, master_weights=False)
        assert jax.tree.leaves(state.params)[0].dtype == BF16
        assert moved(state.params, new.params) < 0.05
