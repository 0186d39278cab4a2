"""The probes ``ppojax.runtime.kernel_check`` runs on a device: for each of CUDA's and a
TPU's platform defaults, small inputs on which the kernel is held to its plain form (or to an
exact reference) with the tolerance its own test argues, and inputs of a run's size for
``ppojax doctor`` to time both forms on.

A probe's function is traced twice, once with the kernel chosen and once with every default
off (``kernel_check.Trial``), so it calls the code a run calls: the loss and its gradient,
``compute_gae``, ``steps_scan``, ``ppo_update``, ``argmax_last``, ``attend_cached``. Each
imports what it needs when built: a run that checks one kernel loads only that one's code.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.runtime.kernel_check import EPS32, Probe, Trial


class State(NamedTuple):
    """What a probe needs of a TrainState: parameters, optimizer state, the shape of the
    observations [1, ...] (a ShapeDtypeStruct)."""

    params: Any
    opt_state: Any
    obs: Any


# tests/tolerance.py's TRAINING_ULPS: a few Adam steps carry a few ulps of each reduction on
TRAINING_ULPS = 128


def made_up_samples(spec: Any, obs_shape: tuple[int, ...], rows: int, key: jax.Array) -> Any:
    """``rows`` made-up PPO samples of an env with ``spec``: log pi_old 0.1 off the initial
    policy's (log(1 / actions), or the N(~0, 1) density of the action), so ratios of about
    0.75 to 1.35 fall on both sides of the clip range, and values 0.1 off their targets'
    scale."""
    from ppojax.ppo.types import Batch

    keys = jax.random.split(key, 6)
    head = jax.random.normal(keys[0], (rows, spec.action_dim))
    if spec.discrete:
        action = jax.random.randint(keys[2], (rows,), 0, spec.action_dim)
        log_prob = jnp.log(1.0 / spec.action_dim)
    else:
        action = jax.random.normal(keys[2], (rows, spec.action_dim))
        log_prob = (-0.5 * action**2 - 0.9189385).sum(-1)
    return Batch(
        obs=jax.random.normal(keys[1], (rows, *obs_shape)),
        action=action,
        advantage=2.0 * jax.random.normal(keys[3], (rows,)),
        target=jax.random.normal(keys[4], (rows,)),
        log_prob=log_prob + 0.1 * jax.random.normal(keys[5], (rows,)),
        value=0.1 * jax.random.normal(keys[0], (rows,)),
        policy_head=head,
        policy_log_std=None if spec.discrete else jnp.zeros_like(head),
    )


def _made_up_batch(config: Any, rows: int, seed: int = 5) -> tuple[Any, Any, Any]:
    """An agent, its initial parameters and optimizer state, and ``rows`` made-up samples
    whose ratios (about 0.75 to 1.35) and value changes fall on both sides of the clip ranges
    (tests/test_kernels.py's ``pallas_batch``)."""
    from ppojax.networks import init_params, observation_template
    from ppojax.ppo.train import make_agent
    from ppojax.ppo.update import make_optimizer

    agent = make_agent(config)
    observation = observation_template(agent.env)

    def initial(key):  # compiled: the orthogonal inits' eager ops took 37 s on 2 busy cores
        params = init_params(key, agent.network, observation)
        return params, make_optimizer(config).init(params)

    params, opt_state = jax.jit(initial)(jax.random.key(0))
    state = State(params, opt_state, jax.ShapeDtypeStruct((1, *observation.shape), "float32"))
    batch = made_up_samples(agent.env.spec, state.obs.shape[1:], rows, jax.random.key(seed))
    return agent, state, batch


def ppo_loss_trial(dtype: str, large: bool) -> Trial:
    """ "pallas_ppo_loss": PPO-Clip's loss, metrics and gradient for the classic CartPole
    network (a Categorical head) and Pendulum's (a Gaussian one), 128 rows (8,192 to time).
    Means of a few hundred order-1 terms summed in another order and in blocks: 64 ulps of 1,
    test_pallas_ppo_loss_gives_ppo_loss_and_its_gradient's."""
    from ppojax.ppo.config import PPOConfig
    from ppojax.ppo.update import ppo_loss_function

    rows = 8192 if large else 128
    configs = [PPOConfig(), PPOConfig(env_id="Pendulum-v1", init_log_std=-0.5)]
    made = [_made_up_batch(config, rows) for config in configs]

    def both(*operands: Any) -> Any:
        outputs = []
        for config, (agent, _, _), params, batch in zip(
            configs, made, operands[::2], operands[1::2], strict=True
        ):
            loss_fn = ppo_loss_function(agent, config, jnp.float32(1.0))
            outputs.append(jax.value_and_grad(loss_fn, has_aux=True)(params, batch))
        return outputs

    args = tuple(x for _, state, batch in made for x in (state.params, batch))
    return Trial(both, both, args, ulps=64)


def gae_trial(dtype: str, large: bool) -> Trial:
    """ "associative_gae": GAE over T = 128 steps of 32 envs (8,192 to time), with
    terminations and truncations, against the float64 sum: within 2T ulps of
    S_t = sum_k |decay product| * |delta_{t+k}|, test_associative_form_computes_the_reverse_
    scan_recurrence's bound (each form rounds every term at most ~2T times)."""
    from ppojax.engine.gae import compute_gae

    rng = np.random.default_rng(1)
    steps, envs = 128, 8192 if large else 32
    rewards = (rng.normal(size=(steps, envs)) * 10.0).astype(np.float32)
    terminated = rng.random((steps, envs)) < 0.03
    truncated = rng.random((steps, envs)) < 0.02
    zeros = np.zeros_like(rewards)
    decay = np.float32(0.99 * 0.95)
    decays = np.where(terminated | truncated, np.float32(0.0), decay)
    exact, scale = np.zeros((steps, envs)), np.zeros((steps, envs))
    running, running_scale = np.zeros(envs), np.zeros(envs)
    for t in reversed(range(steps)):
        running = rewards[t] + decays[t].astype(np.float64) * running
        running_scale = np.abs(rewards[t]) + decays[t].astype(np.float64) * running_scale
        exact[t], scale[t] = running, running_scale

    def advantages(rewards, values, terminated, truncated):
        return compute_gae(
            rewards, values, values, terminated, truncated, gamma=0.99, gae_lambda=0.95
        )[0]

    return Trial(
        advantages,
        advantages,
        (rewards, zeros, terminated, truncated),
        ulps=2 * steps,
        scale=scale,
        relative=False,
        reference=lambda *_: exact,
    )


def packed_steps_trial(dtype: str, large: bool) -> Trial:
    """ "packed_steps": a scan of 37 steps (a trip's remainder too) whose float32, int32,
    uint32, boolean and bfloat16 outputs are stored as ``lax.scan`` stores them, bit for bit
    (test_packed_scan_stores_what_scan_stores_bit_for_bit)."""
    from ppojax.runtime import kernels

    envs = 8192 if large else 3

    def step(carry, x):
        y = {
            "f": x * carry,
            "i": jnp.int32(-3) * carry.astype(jnp.int32),
            "b": x > 0.5,
            "u": jax.lax.bitcast_convert_type(x, jnp.uint32),
            "h": x.astype(jnp.bfloat16),
        }
        return carry + x.sum() * 1e-3, y

    def scanned(carry, xs):
        return kernels.steps_scan(step, carry, xs)

    xs = np.asarray(jax.random.normal(jax.random.key(4), (37, envs)))
    return Trial(scanned, scanned, (np.float32(1.0), xs), ulps=0)


def flat_params_trial(dtype: str, large: bool) -> Trial:
    """ "flat_params": one PPO update (2 epochs of 2 minibatches) of the tiny CartPole config
    (64 samples; 2,048 to time): the parameters and optimizer state within TRAINING_ULPS,
    the counters exactly (test_the_cuda_defaults_of_rollout_gae_and_optimizer_train_as_the_
    plain_forms)."""
    from ppojax.engine.epochs import OptimizerCarry
    from ppojax.ppo.config import PPOConfig
    from ppojax.ppo.update import make_optimizer, ppo_update

    envs = 128 if large else 4
    shape = {"num_envs": envs, "num_steps": 16, "total_timesteps": envs * 16 * 3}
    config = PPOConfig(**shape, update_epochs=2, num_minibatches=2)
    agent, state, batch = _made_up_batch(config, config.batch_size)
    optimizer = make_optimizer(config)

    def update(params, opt_state, batch, key):
        carry = OptimizerCarry(params, opt_state)
        return ppo_update(agent, config, optimizer, carry, batch, jnp.float32(1.0), key)

    args = (state.params, state.opt_state, batch, jax.random.key(7))
    return Trial(update, update, args, ulps=TRAINING_ULPS, scale=100.0)


def argmax_trial(dtype: str, large: bool) -> Trial:
    """ "elementwise_argmax": the index ``jnp.argmax`` picks, exactly: the first of ties, the
    first NaN, -inf masked choices, over 1 to ELEMENTWISE_ARGMAX_MAX choices
    (test_elementwise_argmax_picks_what_argmax_picks)."""
    from ppojax.networks import distributions

    nan, inf = float("nan"), float("inf")
    rows = np.array(
        [[1.0, 3.0, 3.0, 0.0], [nan, 5.0, nan, 1.0], [2.0, nan, 9.0, 1.0], [-inf, -inf, 0.5, -inf]]
    )
    rng = np.random.default_rng(3)
    count = 8192 if large else 64
    tables = [rows] + [
        rng.integers(-2, 3, size=(count, choices)).astype(np.float64)  # many ties
        for choices in range(1, distributions.ELEMENTWISE_ARGMAX_MAX + 1)
    ]
    args = tuple(jnp.asarray(table, dtype) for table in tables)

    def argmaxes(*tables):
        return [distributions.argmax_last(table) for table in tables]

    return Trial(argmaxes, argmaxes, args, ulps=0)


def decode_trial(dtype: str, large: bool) -> Trial:
    """ "pallas_decode_attention": a decoded token's attention and cache write, 3 rows of 0,
    5 and 20 padding positions, 6 query heads on 2 KV heads of 32, 48 positions, the token at
    position 30 (to time: Qwen2.5-0.5B's 64 rows, 14 heads on 2 of 64, 1,536 positions).
    float32: the plain form's output within 32 ulps of max |v| and its cache
    (test_pallas_decode_attention_is_the_plain_attention_in_float32); bfloat16: within
    2^-8 max |v| of the float32 attention of the same operands
    (..._in_bfloat16_rounds_only_its_weights_and_output)."""
    from ppojax.rlhf.models import attention, decode_attention

    rows, heads, kv_heads, head_dim, length = (64, 14, 2, 64, 1536) if large else (3, 6, 2, 32, 48)
    keys = jax.random.split(jax.random.key(3), 5)
    queries = jax.random.normal(keys[0], (rows, 1, heads, head_dim))
    cache = [jax.random.normal(key, (rows, length, kv_heads, head_dim)) for key in keys[1:3]]
    new = [jax.random.normal(key, (rows, 1, kv_heads, head_dim)) for key in keys[3:]]
    padding = jnp.array([0, 5, 20] * (rows // 3 + 1))[:rows]
    key_mask = jnp.arange(length)[None, :] >= padding[:, None]
    start = jnp.int32(length - 18)
    scores = attention.Scores(0.25)

    def attend(queries, new_keys, new_values, keys, values, key_mask, start):
        operands = (queries, new_keys, new_values, keys, values, key_mask, start)
        return decode_attention.attend_cached(*operands, scores)

    wide = [queries, *new, *cache]
    args = (*[x.astype(dtype) for x in wide], key_mask, start)
    largest = float(jnp.abs(args[4].astype(jnp.float32)).max())
    if dtype == "float32":
        return Trial(attend, attend, args, ulps=32, scale=largest)

    def reference(*operands):  # the plain form in float32, of the operands as rounded
        rounded = [x.astype(jnp.float32) for x in operands[:5]]
        return attend(*rounded, *operands[5:])

    # 2^-8 max |v| in float32 ulps of max |v|, absolute (the bfloat16 test's bound)
    return Trial(
        attend,
        attend,
        args,
        ulps=2.0**-8 / EPS32,
        scale=largest,
        relative=False,
        reference=reference,
    )


PROBES: dict[str, Probe] = {
    "pallas_ppo_loss": Probe(ppo_loss_trial),
    "associative_gae": Probe(gae_trial),
    "packed_steps": Probe(packed_steps_trial),
    "flat_params": Probe(flat_params_trial),
    "elementwise_argmax": Probe(argmax_trial, ("float32", "bfloat16")),
    "pallas_decode_attention": Probe(decode_trial, ("float32", "bfloat16")),
}
