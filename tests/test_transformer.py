"""The built-in transformer as a ``DecoderConfig`` of the one decoder, and the earlier
built-in module's parameter names read back from a checkpoint."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf.models.decoder import Decoder
from ppojax.rlhf.models.transformer import (
    TransformerLM,
    builtin_config,
    from_legacy,
    to_legacy,
    transformer,
)
from ppojax.runs import checkpoints

# A 2-layer built-in model's parameter paths as the earlier module named them
LEGACY_PATHS = {
    ("Embed_0", "embedding"),
    ("position_embedding",),
    ("LayerNorm_0", "scale"),
    ("LayerNorm_0", "bias"),
    ("lm_head", "kernel"),
    ("lm_head", "bias"),
    ("value_head", "kernel"),
    ("value_head", "bias"),
} | {
    (f"Block_{layer}", *part)
    for layer in range(2)
    for part in [
        ("LayerNorm_0", "scale"),
        ("LayerNorm_0", "bias"),
        ("LayerNorm_1", "scale"),
        ("LayerNorm_1", "bias"),
        ("CausalSelfAttention_0", "qkv", "kernel"),
        ("CausalSelfAttention_0", "out", "kernel"),
        ("CausalSelfAttention_0", "out", "bias"),
        ("mlp_in", "kernel"),
        ("mlp_in", "bias"),
        ("mlp_out", "kernel"),
        ("mlp_out", "bias"),
    ]
}


def paths(tree):
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {tuple(part.key for part in path) for path, _ in flat}


def test_the_builtin_transformer_is_gpt2s_layout_with_an_untied_biased_head():
    config = builtin_config(vocab_size=12, max_len=16, d_model=16, num_heads=2, num_layers=2)
    assert (config.model_type, config.norm, config.positions) == ("gpt2", "layer", "learned")
    assert (config.activation, config.intermediate_size, config.head_dim) == ("gelu_new", 64, 8)
    assert not config.tie_embeddings and config.head_bias and not config.qkv_bias
    lm = transformer(12, 16, 16, 2, 2)
    assert isinstance(lm.module, Decoder) and lm.config == config
    params = lm.init(jax.random.key(0))
    assert {("lm_head", "bias"), ("layers_1", "attn", "c_attn", "kernel")} <= paths(
        params["params"]
    )
    assert ("layers_0", "attn", "c_attn", "bias") not in paths(params["params"])
    with pytest.raises(ValueError, match="d_model=10 must be a multiple of num_heads=4"):
        builtin_config(12, 16, 10, 4, 1)


def test_the_head_bias_enters_the_logits_through_both_forms_of_the_head():
    """Moving lm_head's bias moves the full forward's logits and the split head's alike."""
    lm = transformer(12, 16, 16, 2, 1)
    params = lm.init(jax.random.key(0))
    tokens, mask = jnp.arange(8)[None] % 12, jnp.ones((1, 8), bool)
    bias = jnp.arange(12, dtype=jnp.float32)
    shifted = jax.tree.map(lambda x: x, params)
    shifted["params"]["lm_head"]["bias"] = bias
    # logits of order 1 (bias up to 11) from programs compiled apart: float32 rounds them by
    # about 1e-6, so 1e-5 separates rounding from a bias (of at least 1) left out
    delta = lm.policy_apply(shifted, tokens, mask) - lm.policy_apply(params, tokens, mask)
    np.testing.assert_allclose(delta, jnp.broadcast_to(bias, delta.shape), atol=1e-5)
    split = lm.policy_apply.head(shifted, lm.policy_apply.hidden(shifted, tokens, mask))
    np.testing.assert_allclose(split, lm.policy_apply(shifted, tokens, mask), atol=1e-5)


def test_the_earlier_names_map_one_to_one_onto_the_decoders():
    lm = transformer(12, 16, 16, 2, 2)
    params = lm.init(jax.random.key(0))
    adapters = {"params-layers_1-attn-c_attn-kernel": {"a": 1}, "params-value_head-kernel": 2}
    old = to_legacy({"policy": params, "adapters": adapters})
    assert paths(old["policy"]["params"]) == LEGACY_PATHS
    assert set(old["adapters"]) == {
        "params-Block_1-CausalSelfAttention_0-qkv-kernel",
        "params-value_head-kernel",
    }
    back = from_legacy(old)
    chex.assert_trees_all_equal(back, {"policy": params, "adapters": adapters})


def test_a_checkpoint_in_an_earlier_layout_reads_back_through_a_registered_layout(tmp_path):
    lm = transformer(12, 16, 16, 2, 2)
    params = lm.init(jax.random.key(0))
    store = checkpoints.Checkpoints(tmp_path)
    store.save(1, to_legacy(params))
    checkpoints.register_layout(to_legacy, from_legacy)
    chex.assert_trees_all_equal(store.restore(1, params), params)
    store.close()


def test_transformer_lm_is_a_deprecated_name_for_the_decoder():
    with pytest.warns(DeprecationWarning, match="transformer"):
        module = TransformerLM(12, 16, 16, 2, 1)
    assert isinstance(module, Decoder) and module.config.max_positions == 16
