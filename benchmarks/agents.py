"""GRPO on the number-guessing game from nothing: does a tiny model learn to read the env?

    python benchmarks/agents.py [--seeds 4] [--steps 1500] [--values 4] [--turns 2]
                                [--out benchmarks/results/agents.json]

A 1-layer transformer (d_model 32) starts from random weights, with no SFT, and trains by
``make_episode_trainer`` (GRPO, 16 groups of 4 episodes per step, every episode at most
``--turns`` turns of 2 tokens) on ``NumberGuessing(--values, --turns)``, the seeds vmapped in
one compiled call. Before and after, 1024 held-out episodes per seed (drawn from keys apart
from training's) sampled at temperature 1: success rate, turns, model tokens, and the success rate
with every reply replaced by HIGHER (the same secrets and keys): a policy that reads the
replies loses by it, one that ignores them does not.

The yardstick: a policy that ignores the env's replies guesses a fixed sequence and wins at
most min(turns, values) / values of the episodes; binary search wins
min(1, (2^turns - 1) / values). A success rate above the first is only reachable by reading
the replies. Writes ``--out`` (a JSON file).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import RESULTS, record, rounded, write_json

from ppojax.rlhf import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_episode_trainer
from ppojax.rlhf.core.episodes import rollout_episodes
from ppojax.rlhf.core.turns import EpisodeLayout
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.models.transformer import transformer

EPISODES = 64
GROUP = 4
TURN_LEN = 2
HELD_OUT = 1024


@dataclasses.dataclass(frozen=True)
class Blindfolded(g.NumberGuessing):
    """The same game, but every reply is HIGHER whatever the guess: the rewards are the
    game's, the replies carry no information."""

    def step(self, state, response):
        state, reply, reward, done = super().step(state, response)
        return state, reply._replace(tokens=jnp.full_like(reply.tokens, g.HIGHER)), reward, done


def evaluate(lm, params, env, settings, key):
    """Success rate, mean turns and mean model tokens of HELD_OUT sampled episodes, and the
    success rate on the same resets and keys with the replies blindfolded."""
    episodes = rollout_episodes(lm.kv_cache, params, env, key, HELD_OUT, settings)
    blind_env = Blindfolded(env.num_values, env.max_turns)
    blind = rollout_episodes(lm.kv_cache, params, blind_env, key, HELD_OUT, settings)
    return {
        "success": (episodes.rewards.sum(axis=1) > 0).mean(),
        "success_blindfolded": (blind.rewards.sum(axis=1) > 0).mean(),
        "turns": episodes.num_turns.mean(),
        "model_tokens": episodes.model_mask.sum(axis=1).mean(),
    }


def run(seeds: int, steps: int, values: int, turns: int) -> dict:
    env = g.NumberGuessing(num_values=values, max_turns=turns)
    config = RLHFConfig(
        pad_id=g.PAD,
        eos_id=g.EOS,
        response_len=TURN_LEN,
        algorithm="grpo",
        group_size=GROUP,
        update_epochs=1,
        num_minibatches=1,
        learning_rate=3e-3,
        kl_coef=0.0,
    )
    length = EpisodeLayout(env.prompt_len, TURN_LEN, env.reply_len, turns).length
    lm = transformer(g.VOCAB_SIZE, length, d_model=32, num_heads=2, num_layers=1)
    trainer = make_episode_trainer(
        config, lm.policy_apply, env, EPISODES, turns, kv_cache=lm.kv_cache
    )
    settings = trainer.settings

    def one_seed(key):
        init_key, train_key, eval_key = jax.random.split(key, 3)
        state = trainer.init(lm.init(init_key), init_key)
        before = evaluate(lm, state.params["policy"], env, settings, eval_key)
        state, metrics = jax.lax.scan(trainer.step, state, jax.random.split(train_key, steps))
        after = evaluate(lm, state.params["policy"], env, settings, eval_key)
        return before, after, metrics["episodes/return"]

    keys = jax.random.split(jax.random.key(0), seeds)
    started = time.perf_counter()
    before, after, curve = jax.block_until_ready(jax.jit(jax.vmap(one_seed))(keys))
    seconds = time.perf_counter() - started
    per_seed = {
        stage: {name: [rounded(v) for v in np.asarray(values)] for name, values in part.items()}
        for stage, part in (("before", before), ("after", after))
    }
    window = max(1, steps // 10)
    return {
        "settings": {
            "values": values,
            "turns": turns,
            "turn_len": TURN_LEN,
            "episodes_per_step": EPISODES,
            "group_size": GROUP,
            "steps": steps,
            "seeds": seeds,
            "model": "transformer d_model 32, 2 heads, 1 layer, from random weights",
        },
        "ceiling_ignoring_replies": rounded(min(turns, values) / values),
        "binary_search": rounded(min(1.0, (2**turns - 1) / values)),
        "held_out": per_seed,
        "train_return_by_tenth": [
            rounded(v)
            for v in np.asarray(curve).mean(axis=0)[: window * 10].reshape(10, -1).mean(1)
        ],
        "wall_seconds_with_compile": rounded(seconds, 1),
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--values", type=int, default=4)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "agents.json")
    args = parser.parse_args(argv)
    if not 2 <= args.values <= 10:
        parser.error("--values must be 2 to 10: a turn of 2 tokens holds one digit and EOS")
    result = run(args.seeds, args.steps, args.values, args.turns)
    document = {**record(__file__, argv), **result}
    write_json(args.out, document)
    print({k: document[k] for k in ("ceiling_ignoring_replies", "binary_search", "held_out")})


if __name__ == "__main__":
    main(sys.argv[1:])
