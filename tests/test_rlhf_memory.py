"""The memory levers of the RLHF step: the sharded step donates its state (its outputs alias
its inputs, the numbers unchanged), the KV cache is a buffer a layer in the params' dtype
that sampling updates in place (the same tokens as full recomputation; on an H100 target a
sampled token moves about the cache and the weights once), and ``remat_layers`` gives the
step's numbers with each layer rematerialized in the loss.

A tiny Qwen2-shaped decoder (2 layers, width 16) keeps every compile small.
"""

from __future__ import annotations

import re
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.checks import ConfigError
from ppojax.plan import PlanError, StepShape, plan
from ppojax.plan.planner import abstract_lm
from ppojax.plan.sizing import size_text
from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.rlhf.core.sampling import SamplingSettings, sample_responses
from ppojax.rlhf.core.sharding import make_mesh, shard_trainer
from ppojax.rlhf.models.config import parse_config
from ppojax.runtime import deviceless, launches

SHAPE = {
    "model_type": "qwen2",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}
TINY = parse_config(SHAPE)
GRPO = RLHFConfig(
    algorithm="grpo",
    group_size=2,
    response_len=4,
    update_epochs=2,
    num_minibatches=2,
    pad_id=0,
    eos_id=2,
    learning_rate=1e-3,
)


def tiny_lm(dtype: str = "float32"):
    """The tiny decoder's contract and real params of ``dtype``."""
    lm = abstract_lm(TINY, dtype)
    params = lm.module.init(jax.random.key(1), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1)))
    return lm, params


def token_mean(prompts, prompt_mask, responses, response_mask) -> jax.Array:
    """A reward that differs between a group's responses (GRPO learns only from such)."""
    return (responses * response_mask).sum(axis=1).astype(jnp.float32) / 64.0


def prompts_of(rows: int, length: int) -> tuple[jax.Array, jax.Array]:
    """Left-padded prompts [rows, length]: row r has r % 3 pads, then tokens 3..63."""
    tokens = jax.random.randint(jax.random.key(7), (rows, length), 3, 64)
    mask = jnp.arange(length)[None, :] >= (jnp.arange(rows) % 3)[:, None]
    return jnp.where(mask, tokens, 0), mask


# --- donation -----------------------------------------------------------------------------


def test_the_sharded_step_donates_its_state_and_computes_the_same_numbers():
    lm, params = tiny_lm()
    trainer = make_trainer(GRPO, lm.policy_apply, token_mean, kv_cache=lm.kv_cache)
    sharded = shard_trainer(trainer, make_mesh(1))
    prompts, mask = prompts_of(2, 5)
    key = jax.random.key(3)
    state = sharded.init(params, jax.random.key(2))
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(state))

    compiled = sharded.step.lower(state, prompts, mask, key).compile()
    # every leaf of the next state is written over the one given (beta and the step too)
    assert compiled.memory_analysis().alias_size_in_bytes == state_bytes

    kept = jax.jit(trainer.step)  # the same step without donation, as a reference
    expected, expected_metrics = kept(state, prompts, mask, key)
    given = jax.tree.leaves(state)
    state, metrics = sharded.step(state, prompts, mask, key)
    assert all(leaf.is_deleted() for leaf in given)  # donated: the caller may not read them
    again, again_metrics = kept(state, prompts, mask, key)  # a donated step's state steps on
    state, metrics2 = sharded.step(state, prompts, mask, key)
    # Aliasing changes where outputs live, not the arithmetic: the same bits.
    for ours, theirs in ((state, again), (metrics, expected_metrics), (metrics2, again_metrics)):
        jax.tree.map(np.testing.assert_array_equal, ours, theirs)
    assert not np.array_equal(
        jax.tree.leaves(expected.params)[0], jax.tree.leaves(again.params)[0]
    )  # the second step moved the params: the comparison saw two different states


@pytest.mark.heavy
def test_the_plan_subtracts_what_the_step_writes_in_place():
    step = StepShape("grpo", 2, 2, 4, 3, dtype="float32", update_epochs=1, num_minibatches=2)
    planned = plan(TINY, step, "cpu", 1)
    memory = planned.memory
    held = memory.parameters + memory.reference + memory.critic + memory.optimizer
    # the state's every leaf (params, reference, Adam, beta and the step's int32 each 4 B)
    assert memory.aliased == held + 8
    arguments = held + memory.inputs
    assert memory.peak == arguments + memory.outputs - memory.aliased + memory.temporaries
    # the commands' loop donates too: one peak, one verdict
    assert planned.loop_peak == memory.peak == planned.to_dict()["loop_peak"]
    assert f"verdict: fits: peak {size_text(memory.peak).strip()}" in planned.report()
    assert "in ppojax rlhf's loop" not in planned.report()

    # remat_layers reaches the planned step: each layer's forward runs again in the backward
    remat = plan(TINY, replace(step, remat_layers=True), "cpu", 1)
    assert remat.step.remat_layers and remat.launches > plan(TINY, step, "cpu", 1).launches
    with pytest.raises(PlanError, match="--remat-layers is for ppo, grpo and rloo"):
        StepShape("sft", remat_layers=True)


# --- the KV cache -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kv_cache_is_a_buffer_a_layer_in_the_params_dtype(dtype):
    lm, params = tiny_lm(dtype)
    prompts, mask = prompts_of(3, 5)

    def prefill(params, prompts, mask):
        return lm.kv_cache.prefill(params, prompts, mask, 9)

    _, cache = jax.eval_shape(prefill, params, prompts, mask)
    shape = (3, 9, TINY.num_kv_heads, TINY.head_dim)
    for buffers in (cache.keys, cache.values):
        assert isinstance(buffers, tuple) and len(buffers) == TINY.num_layers
        assert all(b.shape == shape and b.dtype == jnp.dtype(dtype) for b in buffers)


def test_cached_sampling_draws_full_recomputations_tokens_with_no_stacked_cache():
    lm, params = tiny_lm()
    prompts, mask = prompts_of(4, 6)
    settings = SamplingSettings(8, 1.0, 0, 2)

    def sample(model, params, key):
        return sample_responses(model, params, prompts, mask, key, settings)

    cached = jax.jit(lambda p, k: sample(lm.kv_cache, p, k))
    for seed in range(3):
        key = jax.random.key(seed)
        ours, full = cached(params, key), sample(lm.policy_apply, params, key)
        np.testing.assert_array_equal(ours.tokens, full.tokens)
        np.testing.assert_array_equal(ours.mask, full.mask)
        np.testing.assert_allclose(ours.log_probs, full.log_probs, rtol=1e-5, atol=1e-5)
    # No buffer of the layers' stacked shape anywhere in the program: slicing a layer out of
    # one and stacking them again each token copied the whole cache (the old layout).
    text = cached.lower(params, jax.random.key(0)).compile().as_text()
    stacked = f"[{TINY.num_layers},4,14,{TINY.num_kv_heads},{TINY.head_dim}]"
    assert f"[4,14,{TINY.num_kv_heads},{TINY.head_dim}]" in text and stacked not in text


def test_a_sampled_token_moves_the_cache_and_weights_about_once_on_an_h100():
    """The sampling loop's bytes a trip, counted on the H100 program: against what a token
    must read (every layer's keys and values, the weights) the stacked cache of 4 layers moved
    9.0 times that, its largest launches the whole stack; in place, 2.9 times (the rest: a
    tiny model's logits, norms and sampling; 3.4 while the counter counted the V buffers'
    updates whole, as XLA bitcasts them to the attention's layout), no launch more than a
    layer's."""
    if not deviceless.plugin_installed():
        pytest.skip('JAX\'s CUDA plugin is not installed (pip install "ppojax[gpu-aot]")')
    config = parse_config({**SHAPE, "num_hidden_layers": 4})
    lm = abstract_lm(config, "bfloat16")
    rows, prompt_len, response_len = 8, 64, 64
    settings = SamplingSettings(response_len, 1.0, 0, 2)
    prompts = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32)

    def sample(params, prompts, key):
        return sample_responses(lm.kv_cache, params, prompts, prompts > 0, key, settings)

    compiled = deviceless.compile_for(sample, (lm.params, prompts, jax.random.key(0)), "h100")
    loop = next(b for b in launches.count(compiled.as_text()).walk() if b.trips == response_len)
    layer = rows * (prompt_len + response_len) * config.num_kv_heads * config.head_dim * 2
    cache = 2 * config.num_layers * layer  # keys and values
    weights = sum(leaf.size * 2 for leaf in jax.tree.leaves(lm.params))
    assert loop.bytes_per_trip() < 4 * (cache + weights), (loop.bytes_per_trip(), cache, weights)
    assert max(launch.bytes for launch in loop.launches) < 2 * layer


# --- rematerialized layers ----------------------------------------------------------------


def test_remat_layers_rematerializes_the_loss_and_keeps_the_step_numbers():
    lm, params = tiny_lm()
    prompts, mask = prompts_of(2, 5)

    def step_of(config):
        trainer = make_trainer(config, lm.policy_apply, token_mean, kv_cache=lm.kv_cache)
        state = trainer.init(params, jax.random.key(2))
        return trainer.step, state

    plain_step, start = step_of(GRPO)
    remat_step, _ = step_of(GRPO.replace(remat_layers=True))
    args = (start, prompts, mask, jax.random.key(3))

    # the option changes the program: each layer checkpointed (jax names the primitive
    # remat2 or checkpoint by version) in the loss; without it only the LM head's chunks
    # (logit_chunk) are
    def checkpoints(step) -> int:
        return len(re.findall(r"= (?:remat2|checkpoint)\[", str(jax.make_jaxpr(step)(*args))))

    assert checkpoints(remat_step) - checkpoints(plain_step) >= TINY.num_layers
    plain, plain_metrics = jax.jit(plain_step)(*args)
    remat, remat_metrics = jax.jit(remat_step)(*args)
    # The rollout is the same program: its metrics are the same bits.
    for name in ("objective/scores", "completions/mean_length"):
        np.testing.assert_array_equal(remat_metrics[name], plain_metrics[name], err_msg=name)
    for name in plain_metrics:
        np.testing.assert_allclose(
            remat_metrics[name], plain_metrics[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
    # The recomputed forward may round differently in its last float32 bits, and Adam's
    # first steps move a weight by about the learning rate whatever its gradient's size; so
    # each weight agrees within one step of it, and the two updates within 1% of their size.
    for a, b, s in zip(
        jax.tree.leaves(plain.params),
        jax.tree.leaves(remat.params),
        jax.tree.leaves(start.params),
        strict=True,
    ):
        a, b, s = np.asarray(a), np.asarray(b), np.asarray(s)
        assert np.max(np.abs(b - a)) <= GRPO.learning_rate
        assert np.linalg.norm(b - a) <= 1e-2 * np.linalg.norm(a - s) + 1e-7
    assert any(
        not np.array_equal(a, s)
        for a, s in zip(jax.tree.leaves(plain.params), jax.tree.leaves(start.params), strict=True)
    )


def test_remat_layers_must_be_a_bool():
    with pytest.raises(ConfigError, match="remat_layers"):
        RLHFConfig(remat_layers="yes")
