"""Micro-benchmarks behind the profile findings in benchmarks/README.md.

    python benchmarks/micro.py [dots] [permutation] [rollout] [gradient-step]

dots           the update's dense layers as single XLA dots at 1 and 8 seeds: forward,
               weight gradient, actor and critic stacked into one batched dot, a block-diagonal
               128x128 layer, and a batched dot split in two independent halves
permutation    jax.random.permutation against ppojax's single-key sort, 512 and 8192 items
rollout        microseconds per env step of ppojax's rollout (4 CartPole envs), every
               stored field used
gradient-step  microseconds per minibatch step of ppojax's update at 1 and 8 seeds

Every case runs inside one jitted ``lax.scan`` of many repetitions, compiled once; the
figure is the fastest of 5 runs, in microseconds per repetition.
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp

import ppojax
from ppojax.ppo.rollout import collect_rollout, rollout_start
from ppojax.ppo.train import init_state, make_agent, make_batch
from ppojax.ppo.update import (
    EpochCarry,
    OptimizerCarry,
    gradient_step,
    make_optimizer,
    permutation,
    ppo_loss,
)


def fastest(function, *args, repeats: int, runs: int = 5) -> float:
    """Microseconds per repetition of ``function(*args)``, which runs ``repeats`` of them."""
    compiled = jax.jit(function).lower(*args).compile()
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - start)
    return best / repeats * 1e6


def looped(body, repeats: int):
    """``body(*arrays) -> array`` repeated in a scan; a scalar carry keeps every repetition."""

    def run(*arrays):
        def step(carry, _):
            out = body(*[array + carry for array in arrays])
            return carry + out.ravel()[0] * 1e-9, None

        return jax.lax.scan(step, jnp.float32(0), None, repeats)[0]

    return run


def dots() -> None:
    key = jax.random.key(0)
    rows = 128  # the classic config's minibatch
    x, g = jax.random.normal(key, (2, rows, 64))
    w = jax.random.normal(key, (64, 64))
    cases = {
        "forward [128,64]x[64,64]": (lambda x, w: x @ w, x, w),
        "weight gradient [128,64]^T x [128,64]": (lambda x, g: x.T @ g, x, g),
        "actor+critic stacked: [2,128,64]x[2,64,64]": (
            lambda x, w: jnp.einsum("kbi,kij->kbj", x, w),
            jnp.stack([x, g]),
            jnp.stack([w, w]),
        ),
        "block-diagonal actor+critic: [128,128]x[128,128]": (
            lambda x, w: x @ w,
            jnp.concatenate([x, g], 1),
            jax.random.normal(key, (128, 128)),
        ),
    }
    x8 = jax.random.normal(key, (8, rows, 64))
    w8 = jax.random.normal(key, (8, 64, 64))
    cases["8 seeds: [8,128,64]x[8,64,64]"] = (
        lambda x, w: jnp.einsum("kbi,kij->kbj", x, w),
        x8,
        w8,
    )
    cases["8 seeds as two independent halves [4,...]"] = (
        lambda x, w: (
            jnp.einsum("kbi,kij->kbj", x[:4], w[:4]) + jnp.einsum("kbi,kij->kbj", x[4:], w[4:])
        ),
        x8,
        w8,
    )
    for name, (body, *arrays) in cases.items():
        micro = fastest(looped(body, 2000), *arrays, repeats=2000)
        flops = 2 * sum(array.size for array in arrays[:1]) * arrays[1].shape[-1]
        print(f"dots  {name}: {micro:.1f} us, {flops / micro / 1e3:.0f} GFLOP/s", flush=True)


def permutations() -> None:
    for size in (512, 8192):
        for name, shuffle in (
            ("jax.random.permutation", jax.random.permutation),
            ("ppojax.ppo.update.permutation", permutation),
        ):

            def run(key, shuffle=shuffle, size=size):
                def step(total, step_key):
                    return total + shuffle(step_key, size)[:4].sum(), None

                return jax.lax.scan(step, jnp.int32(0), jax.random.split(key, 500))[0]

            micro = fastest(run, jax.random.key(0), repeats=500)
            print(f"permutation  {name}, {size} items: {micro:.1f} us", flush=True)


def rollout() -> None:
    config = ppojax.PPOConfig()
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    updates = 20

    def run(state):
        def body(carry, _):
            carry, transitions = collect_rollout(agent, config, state.params, carry)
            # every field, as the update reads them all (a sum of one would let XLA drop the
            # rest of the rollout's work)
            return carry, sum(
                leaf.sum().astype(jnp.float32) for leaf in jax.tree.leaves(transitions)
            )

        start = rollout_start(state)
        return jax.lax.scan(body, start, None, updates)[1].sum()

    micro = fastest(run, state, repeats=updates * config.num_steps)
    print(f"rollout  {config.num_envs} CartPole envs: {micro:.2f} us per env step", flush=True)


def gradient_steps() -> None:
    from ppojax.runtime import packing

    config = ppojax.PPOConfig()
    agent = make_agent(config)
    optimizer = make_optimizer(config)
    repeats = 400
    for seeds in (1, 8):

        def setup(key):
            state = init_state(config, key)
            start = rollout_start(state)
            _, transitions = collect_rollout(agent, config, state.params, start)
            batch = make_batch(agent, config, state.params, transitions)
            return state, jax.tree.map(lambda x: x[: config.minibatch_size], batch)

        states, minibatches = jax.jit(jax.vmap(setup))(jax.random.split(jax.random.key(0), seeds))

        def run(state, minibatch):
            loss = functools.partial(ppo_loss, agent, config, state.kl_coef)
            step = functools.partial(gradient_step, loss, optimizer, None)
            opt_state = packing.pack_subtrees(state.opt_state, state.params)  # as run_epochs
            start = EpochCarry(OptimizerCarry(state.params, opt_state), jnp.bool_(False))
            _, metrics = jax.lax.scan(lambda carry, _: step(carry, minibatch), start, None, repeats)
            return metrics["policy_loss"].sum()

        micro = fastest(jax.vmap(run), states, minibatches, repeats=repeats)
        print(f"gradient-step  {seeds} seed(s): {micro:.1f} us per minibatch step", flush=True)


def main() -> None:
    benchmarks = {
        "dots": dots,
        "permutation": permutations,
        "rollout": rollout,
        "gradient-step": gradient_steps,
    }
    for name in sys.argv[1:] or list(benchmarks):
        benchmarks[name]()


if __name__ == "__main__":
    main()
