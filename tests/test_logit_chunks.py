"""RLHFConfig.logit_chunk: responses' log-probs, entropy and KL from the LM head in chunks of
positions (ppojax.rlhf.core.logprobs) equal those of the full [B, L, V] logits (so the
SplitPolicy's hidden states and head are its logits), gradients and a trainer's steps too,
and the compiled step keeps less in temporaries.

Tolerances: both ways run the same float32 ops on each token (the head's dot over D, the
log-softmax over V), only in programs of other shapes, where XLA may order a sum's terms
otherwise. A log-prob here is O(log V) ~ 5 nats, whose float32 spacing is 4.8e-7; 1e-5 is 20
of them. A gradient sums O(1) terms over at most rows x positions = 21 tokens of O(1) each.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.checks import ConfigError
from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.rlhf.core.kl import kl_estimate
from ppojax.rlhf.core.logprobs import SplitPolicy, chunk_positions, policy_stats
from ppojax.rlhf.core.sampling import Sequences
from ppojax.rlhf.models.config import parse_config
from ppojax.rlhf.models.decoder import Decoder
from ppojax.rlhf.models.pretrained import contract
from ppojax.rlhf.models.transformer import transformer

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"
PROMPT, RESPONSE = 4, 7


def sequences(key: jax.Array, rows: int, vocab: int) -> Sequences:
    """Prompts left-padded by 0 to 2 tokens, responses ending early on some rows."""
    token_key, length_key = jax.random.split(key)
    tokens = jax.random.randint(token_key, (rows, PROMPT + RESPONSE), 3, vocab)
    prompt_mask = jnp.arange(PROMPT)[None, :] >= jnp.arange(rows)[:, None] % 3
    lengths = jax.random.randint(length_key, (rows, 1), 2, RESPONSE + 1)
    response_mask = jnp.arange(RESPONSE)[None, :] < lengths
    prompts = jnp.where(prompt_mask, tokens[:, :PROMPT], 0)
    return Sequences(prompts, prompt_mask, tokens[:, PROMPT:], response_mask)


def decoder_policy(name: str) -> tuple[SplitPolicy, dict, int]:
    """The decoder of a fixture's config.json (random params): tied or untied head, softcap."""
    config = parse_config(json.loads((FIXTURES / name / "config.json").read_text()))
    module = Decoder(config)
    ones = jnp.ones((1, 2), jnp.int32)
    params = module.init(jax.random.key(0), ones, ones.astype(bool))
    return contract(module)[0], params, config.vocab_size


def builtin_policy() -> tuple[SplitPolicy, dict, int]:
    lm = transformer(97, PROMPT + RESPONSE, d_model=16, num_heads=2, num_layers=1)
    return lm.policy_apply, lm.init(jax.random.key(0)), 97


def test_chunk_positions_spread_the_tokens_over_the_rows():
    assert chunk_positions(rows=64, length=1024, logit_chunk=4096) == 64
    assert chunk_positions(rows=16, length=1024, logit_chunk=4096) == 256
    assert chunk_positions(rows=64, length=1024, logit_chunk=10) == 1  # at least one
    assert chunk_positions(rows=2, length=7, logit_chunk=4096) == 7  # at most all


def stats_terms(policy, params, reference, batch, chunk):
    """Log-probs, entropy and k3 KL to ``reference`` [B, R] and their masked sum."""
    stats = policy_stats(policy, params, batch, 0.7, chunk)
    ref = policy_stats(policy, reference, batch, 0.7, chunk)
    kl = kl_estimate(stats.log_probs, ref.log_probs, "k3")
    mask = batch.response_mask
    total = jnp.where(mask, stats.log_probs - 0.1 * stats.entropy + kl, 0.0).sum()
    return (stats.log_probs, stats.entropy, kl), total


# the decoder's heads: tied with a softcap (gemma2), untied (llama), GPT-2's tied wte; and the
# built-in transformer's. 1 position a chunk; 2 positions of 3 rows (the last chunk padded);
# 5 (padded); every position in one chunk.
@pytest.mark.heavy
@pytest.mark.parametrize(
    ("model", "chunk"), [("gemma2", 1), ("builtin", 8), ("llama", 15), ("gpt2", 4096)]
)
def test_chunked_log_probs_entropy_kl_and_gradients_equal_the_full_logits(model, chunk):
    policy, params, vocab = builtin_policy() if model == "builtin" else decoder_policy(model)
    reference = jax.tree.map(lambda leaf: leaf * 0.9, params)
    batch = sequences(jax.random.key(2), 3, vocab)

    def terms(params, chunk):
        return stats_terms(policy, params, reference, batch, chunk)

    full, full_total = jax.jit(terms, static_argnums=1)(params, 0)
    chunked, chunked_total = jax.jit(terms, static_argnums=1)(params, chunk)
    for name, want, got in zip(("log_probs", "entropy", "kl"), full, chunked, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)

    def total(params, chunk):
        return terms(params, chunk)[1]

    want = jax.jit(jax.grad(total), static_argnums=1)(params, 0)
    got = jax.jit(jax.grad(total), static_argnums=1)(params, chunk)
    scale = max(float(jnp.abs(leaf).max()) for leaf in jax.tree.leaves(want))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale)
    assert np.isclose(chunked_total, full_total, rtol=1e-5)


def test_logit_chunk_is_a_nonnegative_int():
    assert RLHFConfig().logit_chunk > 0  # on by default
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="logit_chunk"):
            RLHFConfig(logit_chunk=bad)


def length_reward(prompts, prompt_mask, responses, response_mask):
    return response_mask.sum(axis=1).astype(jnp.float32) / responses.shape[1]


@pytest.mark.heavy
def test_a_trainer_step_with_chunks_gives_the_params_of_one_without_in_less_memory():
    """Two PPO steps (a critic beside the policy) of 2 epochs x 2 minibatches with
    logit_chunk 8 (1 to 2 positions a chunk) and 0, from the same state and keys; a
    vocabulary of 512 over a width of 8, where the logits dominate the step's temporaries."""
    vocab = 512
    lm = transformer(vocab, PROMPT + RESPONSE, d_model=8, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    config = RLHFConfig(
        algorithm="ppo",
        pad_id=0,
        eos_id=1,
        response_len=RESPONSE,
        update_epochs=2,
        num_minibatches=2,
        learning_rate=1e-3,
        kl_in="loss",
        ent_coef=0.01,
    )
    batch = sequences(jax.random.key(4), 8, vocab)
    results = {}
    for chunk in (0, 8):
        trainer = make_trainer(
            config.replace(logit_chunk=chunk),
            lm.policy_apply,
            length_reward,
            critic_apply=lm.critic_apply,
            kv_cache=lm.kv_cache,
        )
        step = jax.jit(trainer.step)
        state = trainer.init(params, jax.random.key(5))
        compiled = step.lower(state, batch.prompts, batch.prompt_mask, jax.random.key(6)).compile()
        metrics = []
        for key in jax.random.split(jax.random.key(7), 2):
            state, step_metrics = compiled(state, batch.prompts, batch.prompt_mask, key)
            metrics.append(step_metrics)
        results[chunk] = state, metrics, compiled.memory_analysis().temp_size_in_bytes
    (full, full_metrics, full_temp), (chunked, chunked_metrics, chunked_temp) = results.values()
    for want, got in zip(full_metrics, chunked_metrics, strict=True):
        for name in ("objective/kl", "objective/entropy", "loss/policy_avg", "val/ratio"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # 8 Adam steps of at most ~lr each; gradients equal to rounding move each param alike
    for got, want in zip(
        jax.tree.leaves(chunked.params), jax.tree.leaves(full.params), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert not np.allclose(jax.tree.leaves(full.params)[0], jax.tree.leaves(params)[0])
    # the full logits of the scoring passes are rows x (4 + 7) x 512 float32 each
    logits_bytes = batch.prompts.shape[0] * (PROMPT + RESPONSE) * vocab * 4
    assert chunked_temp < full_temp - logits_bytes
