"""The parts of benchmarks/gpu.py that look inside ppojax's update: where its time goes, what
one minibatch step costs, and what each kernels candidate is worth.

- ``phases(envs)``: one update of the classic CartPole config at ``envs`` envs split into its
  phases, each compiled alone and timed (best of a few runs): the rollout (env, forward pass,
  sampling: the "rollout alone" ceiling), GAE (with V(next_obs)), the epochs, and the whole
  update; steps/s of each, and the kernels of each compiled phase
  (``ppojax.runtime.launches.kernel_count``; for the rollout, the kernels of one env step, the
  latency of a small batch).
- ``minibatch_step(envs)``: one gradient step on one minibatch (batch / num_minibatches
  samples): the kernels of its compiled program (instructions of the entry computation and of
  its loops that launch work, an upper bound where XLA runs a fusion in place), XLA's cost
  analysis (flops, bytes accessed) and its time, so the bytes it moves per sample can be put
  against the device's copy bandwidth; plain, and with the candidate "pallas_ppo_loss" (the
  loss and its gradient in one kernel).
- ``candidate_pair``: each kernels candidate (``ppojax.runtime.kernels.CANDIDATES``) against
  the plain program (compiled once per work): both compiled, then runs alternating,
  steps/s of each and the ratio, and the largest difference of their final parameters (the
  candidates compute what the plain forms compute: 0 for gather_once, float32 rounding for
  fused_actor_critic); and ``compute_dtype="bfloat16"`` against float32 the same way (its
  parameters differ by bfloat16 rounding carried through training).

These use ppojax's internal modules (``ppojax.ppo.train``, ``ppojax.ppo.update``,
``ppojax.engine.epochs``), which is what they measure. ``SMOKE`` sizes run in seconds on a CPU.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from common import timed

import ppojax
from ppojax.engine.epochs import EpochCarry, OptimizerCarry, gradient_step, shuffle_into_minibatches
from ppojax.ppo.kernels import pallas_loss
from ppojax.ppo.rollout import collect_rollout, rollout_start
from ppojax.ppo.train import init_state, make_agent, make_batch, update_step
from ppojax.ppo.update import make_optimizer, ppo_loss_function, ppo_update
from ppojax.runtime import kernels
from ppojax.runtime.launches import kernel_count

ENV_ID = "CartPole-v1"
EVAL_EPISODES = 16


def classic_config(num_envs: int, updates: int, final_return: bool) -> ppojax.PPOConfig:
    """PureJaxRL's classic CartPole config at ``num_envs`` envs and ``updates`` updates; with
    one sampled-action evaluation of EVAL_EPISODES episodes after the last update."""
    evaluation = dict(eval_every=updates, eval_episodes=EVAL_EPISODES, eval_deterministic=False)
    return ppojax.PPOConfig(
        env_id=ENV_ID,
        num_envs=num_envs,
        num_steps=128,
        total_timesteps=num_envs * 128 * updates,
        update_epochs=4,
        num_minibatches=4,
        learning_rate=2.5e-4,
        anneal_lr=True,
        hidden_sizes=(64, 64),
        activation="tanh",
        **(evaluation if final_return else {}),
    )


def classic(envs: int, updates: int = 1) -> ppojax.PPOConfig:
    """PureJaxRL's classic CartPole config at ``envs`` envs, without the evaluation."""
    return classic_config(envs, updates, final_return=False)


def best_seconds(compiled: Callable[..., Any], args: tuple, repeats: int) -> float:
    return min(timed(compiled, *args)[1] for _ in range(repeats))


def compiled_timing(
    fn: Callable[..., Any], args: tuple, repeats: int
) -> tuple[dict[str, float], Any]:
    """Compile ``jax.jit(fn)`` for ``args`` (timed), then its best run of ``repeats``; the
    timings, the kernels of the compiled program (``kernel_count``: for the rollout, its
    kernels per env step) and the output of a first, untimed run."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile(compiler_options=ppojax.compiler_options())
    compile_s = time.perf_counter() - start
    output = jax.block_until_ready(compiled(*args))
    return {
        "compile_s": round(compile_s, 2),
        "run_s": best_seconds(compiled, args, repeats),
        "kernels": sum(kernel_count(compiled.as_text()).values()),
    }, output


def update_parts(config: ppojax.PPOConfig) -> tuple[Any, Any, Any]:
    """The agent, its optimizer and a fresh TrainState of ``config``."""
    return make_agent(config), make_optimizer(config), init_state(config, jax.random.key(0))


def phases(envs: int, repeats: int = 5) -> dict[str, Any]:
    """One update at ``envs`` envs, phase by phase (see the module docstring); each phase's
    input is the previous phase's output."""
    config = classic(envs)
    agent, optimizer, state = update_parts(config)
    steps = config.batch_size

    def rollout(state: Any) -> Any:
        return collect_rollout(agent, config, state.params, rollout_start(state))

    def gae(state: Any, transitions: Any) -> Any:
        return make_batch(agent, config, state.params, transitions, state.hidden)

    def epochs(state: Any, batch: Any) -> Any:
        carry = OptimizerCarry(state.params, state.opt_state)
        return ppo_update(agent, config, optimizer, carry, batch, state.kl_coef, state.key)

    def whole(state: Any) -> Any:
        return update_step(agent, optimizer, config, state)

    timings = {}
    timings["rollout"], (_, transitions) = compiled_timing(rollout, (state,), repeats)
    timings["gae"], batch = compiled_timing(gae, (state, transitions), repeats)
    timings["epochs"], _ = compiled_timing(epochs, (state, batch), repeats)
    timings["update"], _ = compiled_timing(whole, (state,), repeats)
    parts = sum(timings[name]["run_s"] for name in ("rollout", "gae", "epochs"))
    return {
        "name": f"one update, 1 agent x {envs} envs",
        "envs": envs,
        "env_steps": steps,
        **{
            name: {
                "run_s": round(timing["run_s"], 5),
                "compile_s": timing["compile_s"],
                "steps_per_s": round(steps / timing["run_s"]),
                "share_of_parts": round(timing["run_s"] / parts, 3),
                "kernels": timing["kernels"],
            }
            for name, timing in timings.items()
        },
    }


@contextlib.contextmanager
def candidates_on(names: tuple[str, ...]) -> Iterator[None]:
    """The kernels candidates ``names`` on, and those of CUDA's and the TPU's defaults
    (``kernels.PLATFORM_DEFAULTS``) not among them off: an empty tuple is the plain program on
    every platform (``kernels.use()`` with no names would turn all of them on)."""
    off = tuple(name for name in kernels.PLATFORM_DEFAULTS if name not in names)
    with contextlib.ExitStack() as stack:
        if off:
            stack.enter_context(kernels.plain(*off))
        if names:
            stack.enter_context(kernels.use(*names))
        yield


def pallas_tile(tile: tuple[int, int, int] | None) -> Iterator[None]:
    """``ppojax.ppo.kernels.pallas_loss``'s tile (read while tracing) set to ``tile`` inside."""
    if tile is None:
        yield
        return
    names = ("BLOCK_ROWS", "BLOCKS_PER_PROGRAM", "NUM_WARPS")
    with contextlib.ExitStack() as stack:
        for name, value in zip(names, tile, strict=True):
            stack.enter_context(mock.patch.object(pallas_loss, name, value))
        yield


def minibatch_step(
    envs: int,
    repeats: int = 20,
    names: tuple[str, ...] = (),
    tile: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """One gradient step on one minibatch of the classic config at ``envs`` envs; with the
    kernels candidates ``names`` (the loss's: "pallas_ppo_loss") on while it is traced, and
    pallas_ppo_loss's ``tile`` (see PALLAS_TILES)."""
    config = classic(envs)
    agent, optimizer, state = update_parts(config)

    def first_batch(state: Any) -> Any:
        _, transitions = collect_rollout(agent, config, state.params, rollout_start(state))
        return make_batch(agent, config, state.params, transitions, state.hidden)

    batch = jax.jit(first_batch)(state)
    minibatch = jax.tree.map(
        lambda x: x[0], shuffle_into_minibatches(state.key, batch, config.num_minibatches)
    )
    carry = EpochCarry(OptimizerCarry(state.params, state.opt_state), jnp.bool_(False))

    def step(carry: EpochCarry, minibatch: Any) -> Any:
        loss_fn = ppo_loss_function(agent, config, state.kl_coef)
        return gradient_step(loss_fn, optimizer, None, config.divergence_guard, carry, minibatch)

    with candidates_on(names), pallas_tile(tile):
        lowered = jax.jit(step).lower(carry, minibatch)
    compiled = lowered.compile(compiler_options=ppojax.compiler_options())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    seconds = best_seconds(compiled, (carry, minibatch), repeats)
    samples = jax.tree.leaves(minibatch)[0].shape[0]
    accessed = float(cost.get("bytes accessed", float("nan")))
    counts = kernel_count(compiled.as_text())
    return {
        "name": f"one minibatch step, 1 agent x {envs} envs"
        + (f", {'+'.join(names)}" if names else "")
        + (f", tile {tile}" if tile else ""),
        "candidates": list(names),
        "tile": list(tile) if tile else None,
        "samples": samples,
        "kernels": sum(counts.values()),
        "kernels_by_opcode": counts,
        "flops": float(cost.get("flops", float("nan"))),
        "bytes_accessed": accessed,
        "bytes_per_sample": round(accessed / samples, 1),
        "run_s": round(seconds, 6),
        "achieved_bytes_per_s": round(accessed / seconds),
        "note": "XLA's cost analysis; run_s is one step's best of "
        f"{repeats} dispatches from Python (dispatch included)",
    }


def largest_difference(a: Any, b: Any) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


BFLOAT16 = "compute_dtype=bfloat16"  # a candidate set's name for the config option
PLAIN_PROGRAMS: dict[tuple[int, int], tuple[Any, float]] = {}


def candidate_pair(envs: int, updates: int, names: tuple[str, ...], pairs: int) -> dict[str, Any]:
    """The plain program against the one with the candidates ``names`` (kernels candidates,
    or BFLOAT16 for the config's ``compute_dtype``): compiled apart (the kernels candidates are
    read while tracing), then ``pairs`` alternating runs of each."""
    config = classic(envs, updates)
    key = jax.random.key(0)
    options = ppojax.compiler_options()

    def compile_now(config: ppojax.PPOConfig) -> tuple[Any, float]:
        start = time.perf_counter()
        # a new function each time: jit's cache would otherwise return the other's trace
        compiled = (
            jax.jit(lambda k: ppojax.train(config, k)).lower(key).compile(compiler_options=options)
        )
        return compiled, time.perf_counter() - start

    if (envs, updates) not in PLAIN_PROGRAMS:  # compiled once for all the sets of a work
        with candidates_on(()):  # without CUDA's defaults too
            PLAIN_PROGRAMS[envs, updates] = compile_now(config)
    plain, plain_compile = PLAIN_PROGRAMS[envs, updates]
    chosen_config = config.replace(compute_dtype="bfloat16") if BFLOAT16 in names else config
    with candidates_on(tuple(name for name in names if name != BFLOAT16)):
        chosen, chosen_compile = compile_now(chosen_config)
    seconds: dict[str, list[float]] = {"plain": [], "candidate": []}
    outputs = {}
    for repeat in range(pairs):
        order = ("plain", "candidate") if repeat % 2 == 0 else ("candidate", "plain")
        for which in order:
            compiled = plain if which == "plain" else chosen
            start = time.perf_counter()
            outputs[which] = jax.block_until_ready(compiled(key))
            seconds[which].append(time.perf_counter() - start)
    steps = config.num_updates * config.batch_size
    plain_rate = steps / min(seconds["plain"])
    chosen_rate = steps / min(seconds["candidate"])
    return {
        "name": f"{'+'.join(names)}, 1 agent x {envs} envs",
        "candidates": list(names),
        "envs": envs,
        "updates": config.num_updates,
        "plain_steps_per_s": round(plain_rate),
        "candidate_steps_per_s": round(chosen_rate),
        "candidate_over_plain": round(chosen_rate / plain_rate, 3),
        "plain_run_s": [round(s, 4) for s in seconds["plain"]],
        "candidate_run_s": [round(s, 4) for s in seconds["candidate"]],
        "plain_compile_s": round(plain_compile, 2),
        "candidate_compile_s": round(chosen_compile, 2),
        "largest_parameter_difference": largest_difference(
            outputs["candidate"].state.params, outputs["plain"].state.params
        ),
        "median_ratio_of_pairs": round(
            statistics.median(
                p / c for p, c in zip(seconds["plain"], seconds["candidate"], strict=True)
            ),
            3,
        ),
    }


# Candidates of the LMs' programs, which these env PPO parts never trace (a decoded token's
# attention: benchmarks/decode_program.py counts it)
LM_CANDIDATES = ("pallas_decode_attention",)


def candidate_sets() -> list[tuple[str, ...]]:
    """Each kernels candidate of env PPO alone, and bfloat16 encoders (a pair of candidates
    that each earn their 10% is measured together before both become stand-ins)."""
    names = [name for name in kernels.CANDIDATES if name not in LM_CANDIDATES]
    return [(name,) for name in names] + [(BFLOAT16,)]
