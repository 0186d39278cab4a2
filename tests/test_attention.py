"""The blockwise attention against the plain one (the whole score matrix): outputs and
gradients, with every mask the decoders use, and both transformers on it.

Tolerance: both forms compute each output as a softmax-weighted mean of values of order 1
in float32; the blockwise form sums the same terms in another order and rescales partial sums
by exp(m_old - m_new), a few roundings more per term. Outputs and gradients of order 1 then
agree to some tens of float32 ulps; 64 ulps of 1 (7.6e-6) leaves room, and a wrong mask or a
dropped block moves them by 1e-2 or more.
"""

from pathlib import Path

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf.models import attention
from ppojax.rlhf.models.pretrained import from_pretrained
from ppojax.rlhf.models.transformer import transformer
from tests.tolerance import assert_close

ULPS = 64
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"


def operands(key, batch=2, chunk=11, length=11, heads=4, kv_heads=2, head_dim=8):
    q_key, k_key, v_key, m_key = jax.random.split(key, 4)
    queries = jax.random.normal(q_key, (batch, chunk, heads, head_dim))
    keys = jax.random.normal(k_key, (batch, length, kv_heads, head_dim))
    values = jax.random.normal(v_key, (batch, length, kv_heads, head_dim))
    # left padding: row 1's first 3 keys are padding, and one key in the middle is masked
    mask = jnp.ones((batch, length), bool).at[1, :3].set(False).at[0, 5].set(False)
    return queries, keys, values, mask


CASES = {
    "causal": attention.Scores(0.35, block=4),
    "softcap": attention.Scores(0.35, softcap=2.0, block=4),
    "window": attention.Scores(0.35, window=3, block=4),
    "window, softcap, block 2": attention.Scores(0.5, softcap=1.5, window=5, block=2),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("start", [0, 5])
def test_blockwise_matches_plain_outputs_and_gradients(name, start):
    blockwise = CASES[name]
    reference = blockwise._replace(block=0)
    chunk = 11 - start  # queries at cache positions start .. 10 over an 11-key cache
    queries, keys, values, mask = operands(jax.random.key(3), chunk=chunk)
    weights = jax.random.normal(jax.random.key(4), (2, chunk, 4 * 8))

    def loss(scores, q, k, v):
        out = attention.attend(q, k, v, mask, start, scores)
        return jnp.sum(out * weights), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)(
        blockwise, queries, keys, values
    )
    (_, want), want_grads = jax.value_and_grad(loss, argnums=(1, 2, 3), has_aux=True)(
        reference, queries, keys, values
    )
    assert_close(out, want, ulps=ULPS)
    for got, expected in zip(grads, want_grads, strict=True):
        assert_close(got, expected, ulps=ULPS, scale=float(jnp.abs(expected).max()))
    # the masks matter: without the window or the softcap the outputs move well past that
    if blockwise.window is not None or blockwise.softcap is not None:
        loose = attention.Scores(blockwise.scale, block=0)
        assert np.abs(loss(loose, queries, keys, values)[1] - want).max() > 1e-3


def test_blockwise_never_builds_the_whole_score_matrix():
    queries, keys, values, mask = operands(jax.random.key(0), chunk=64, length=64)

    def loss(block):
        scores = attention.Scores(0.35, block=block)
        return lambda q, k, v: attention.attend(q, k, v, mask, 0, scores).sum()

    def largest(fn):  # the largest array the program's jaxpr holds, forward and backward
        jaxpr = jax.make_jaxpr(jax.grad(fn, argnums=(0, 1, 2)))(queries, keys, values)
        sizes = []

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                sizes.extend(np.prod(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    walk(sub)

        walk(jaxpr.jaxpr)
        return max(sizes)

    full = 2 * 2 * 2 * 64 * 64  # [B, KVH, G, S, L]
    assert largest(loss(0)) >= full
    assert largest(loss(16)) <= full // 4  # one [B, KVH, G, 16, 16] block and the operands


def test_the_loop_s_carries_are_made_once_the_layer_s_queries_exist():
    """The blockwise loop's initial carries (the running max, sum and float32 accumulator)
    are constants; left free, XLA makes every layer's at the step's start in one fusion and
    holds them all at once. A 10-layer model of Qwen2.5-1.5B's width, GRPO LoRA r16 remat,
    planned 15.39 GiB of temporaries on one H100 that way and 6.01 with each layer's carries
    tied to its queries by an optimization barrier. That compile takes minutes and small
    models do not show it, so this holds the tie itself: the loop's carries come out of a
    barrier that takes the queries."""
    queries, keys, values, mask = operands(jax.random.key(0), chunk=16, length=16)
    scores = attention.Scores(0.35, block=4)
    jaxpr = jax.make_jaxpr(lambda q: attention.attend(q, keys, values, mask, 0, scores))(queries)
    tied = []

    def walk(jaxpr):
        made_by = {out: eqn for eqn in jaxpr.eqns for out in eqn.outvars}
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "scan":
                # scan's params name its carries differently across jax versions: read the tie
                # from its operands, the three carries out of one barrier that takes more
                barriers = [made_by.get(var) for var in eqn.invars]
                barriers = [b for b in barriers if b and b.primitive.name == "optimization_barrier"]
                tied.append(
                    len(barriers) == 3
                    and all(b is barriers[0] for b in barriers)
                    and len(barriers[0].invars) > 3
                )
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    assert tied == [True]


@pytest.mark.parametrize("name", sorted(path.name for path in FIXTURES.iterdir()))
def test_decoders_give_the_same_logits_blockwise_and_plain(name):
    # every family that loads (GQA, gemma2's softcap and sliding window, gpt2's learned
    # positions, ...): logits of order 4 agree within 64 float32 ulps of that scale
    lm = from_pretrained(FIXTURES / name)
    tokens = jax.random.randint(jax.random.key(1), (2, 13), 3, lm.config.vocab_size)
    mask = jnp.ones((2, 13), bool).at[1, :4].set(False)
    want = lm.module.apply(lm.params, tokens, mask)[0]
    got = lm.module.clone(attention_block=4).apply(lm.params, tokens, mask)[0]
    assert_close(got, want, ulps=ULPS, scale=float(jnp.abs(want).max()), err_msg=name)
    # the plain form is the reference: block 0 everywhere gives the same logits as the
    # default (13 queries, fewer than a 256-row block, take the plain form there too)
    plain = lm.module.clone(attention_block=0).apply(lm.params, tokens, mask)[0]
    np.testing.assert_array_equal(plain, want)


def test_built_in_transformer_blockwise_matches_plain_and_takes_a_dtype():
    plain = transformer(17, 24, d_model=32, num_heads=4, num_layers=2, attention_block=0)
    blockwise = transformer(17, 24, d_model=32, num_heads=4, num_layers=2, attention_block=8)
    params = plain.init(jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (3, 24), 0, 17)
    mask = jnp.ones((3, 24), bool).at[0, :5].set(False)
    want = plain.policy_apply(params, tokens, mask)
    assert_close(blockwise.policy_apply(params, tokens, mask), want, ulps=ULPS, scale=4.0)

    half = transformer(17, 24, d_model=32, num_heads=4, num_layers=2, dtype="bfloat16")
    half_params = half.init(jax.random.key(0))
    assert {leaf.dtype for leaf in jax.tree.leaves(half_params)} == {jnp.dtype(jnp.bfloat16)}
    logits = half.policy_apply(half_params, tokens, mask)
    assert logits.dtype == jnp.bfloat16
    assert half.critic_apply(half_params, tokens, mask).dtype == jnp.float32


def test_a_traced_start_visits_every_block_pair_and_gives_the_same_attention():
    # a start known only at run time (a multi-turn chunk's) cannot leave out hidden pairs:
    # the masks hide them instead, and the result is the static start's within rounding
    scores = attention.Scores(0.35, softcap=2.0, window=5, block=4)
    queries, keys, values, mask = operands(jax.random.key(5), chunk=9, length=14)

    def out(start):
        return attention.attend(queries, keys, values, mask, start, scores)

    def grads(start):
        return jax.grad(lambda q: out_of(q, start).sum())(queries)

    def out_of(q, start):
        return attention.attend(q, keys, values, mask, start, scores)

    assert_close(jax.jit(out)(5), out(5), ulps=ULPS)
    want = grads(5)
    assert_close(jax.jit(grads)(5), want, ulps=ULPS, scale=float(jnp.abs(want).max()))
    reference = attention.attend(queries, keys, values, mask, 5, scores._replace(block=0))
    assert_close(out(5), reference, ulps=ULPS)
