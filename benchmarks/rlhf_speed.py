"""One RLHF step of ``ppojax.rlhf``, PPO and GRPO, on a GPT-2-small-shaped model: compile
seconds, seconds per step, response tokens/s and achieved TFLOP/s.

    python benchmarks/rlhf_speed.py [--steps 3] [--smoke]

The model is ``ppojax.rlhf.transformer`` at GPT-2 small's shape (12 layers, d_model 768, 12
heads, vocab 50257, untied ``lm_head``), context 64 prompt + 128 response tokens, float32,
randomly initialised. A step answers 64 responses: 64 prompts x 1 for PPO (with a critic, a
second model of the policy's shape that starts as its copy) and 8 prompts x 8 for GRPO (KL
in the loss, k3, GRPO's per-sequence mean, as benchmarks/rlhf.py runs it); it samples all
128 positions of each response through the model's KV cache, then trains one epoch of 4
minibatches. The reward is a rule on the sampled tokens (the fraction equal to one id), since
only time is measured. Prompts are random tokens, all real (no padding).

The step (``jax.jit(trainer.step)``) is lowered and compiled ahead of time, timed together
as ``compile_s``; then ``steps`` steps run, each on the previous step's state with its own
key and each waited for with ``block_until_ready``; ``step_s`` is their median (a slower
first run drops out from 3 steps on). Response tokens per step: responses x response_len,
every position sampled, since the step computes all of them wherever a response ends.

FLOPs per step, the common estimate of 2 N FLOPs per token position for a forward pass and
6 N for a forward and backward pass, each pass counted over the whole [prompt, response]
buffer of every response (the model computes every position, padding and positions after
EOS included), T = responses x (prompt_len + response_len) positions:

    FLOPs = N * T * (2 * forward_passes + 6 * trained_models * update_epochs)

- forward_passes: sampling (a prefill over the prompt and one-token decodes over the
  response: prompt_len + response_len positions), the policy's log-probs, the frozen
  reference's log-probs, and for PPO the critic's values: 3 for GRPO, 4 for PPO;
- trained_models, a forward and backward pass over every response per epoch: the policy, and
  for PPO the critic: 1 for GRPO, 2 for PPO.

So with update_epochs 1: GRPO 12 N T, PPO 20 N T (the critic has the policy's shape and N).

N is the policy's parameter count from its params pytree without the two embedding tables
(token and position): they are looked up, not multiplied. The untied ``lm_head`` (d_model x
vocab) is a matmul and is counted; N also holds the layer norms' and the value head's
parameters (0.03% of it). At GPT-2 small's shape N = 123,676,754 of 162,421,586
parameters. Not counted: the attention's score and weighted-sum products (4 x layers x 192 x
d_model per position and forward pass, about 3% of 2 N here, as every query sees all 192 key
slots), softmax, GELU, layer-norm arithmetic and the optimizer. The figure is model FLOPs
per second, a lower bound of the arithmetic done. float32 matmuls run at JAX's default
precision (TF32 on recent NVIDIA GPUs): compare with the TF32 peak.

``--smoke``: a tiny model (2 layers, d_model 32, 2 heads, vocab 64, prompt 8, response 8, 8
responses per step) that runs in seconds on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import machine

from ppojax.rlhf import RLHFConfig, make_trainer, transformer


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The model's dims and one step's shapes."""

    num_layers: int
    d_model: int
    num_heads: int
    vocab_size: int
    prompt_len: int
    response_len: int
    responses: int  # per step: prompts x group_size, the same for both algorithms

    @property
    def max_len(self) -> int:
        return self.prompt_len + self.response_len


GPT2_SMALL = Sizes(12, 768, 12, 50257, 64, 128, 64)
SMOKE = Sizes(2, 32, 2, 64, 8, 8, 8)
GROUP_SIZES = {"ppo": 1, "grpo": 8}
UPDATE_EPOCHS = 1
NUM_MINIBATCHES = 4
TARGET_TOKEN = 7  # the reward counts this id
FIRST_PROMPT_TOKEN = 3  # prompts avoid RLHFConfig's pad_id 0 and eos_id 2


def target_fraction(prompts, prompt_mask, responses, response_mask) -> jax.Array:
    """The fraction of each response's real tokens equal to TARGET_TOKEN, [B]."""
    hits = ((responses == TARGET_TOKEN) & response_mask).sum(axis=1)
    return hits / jnp.maximum(response_mask.sum(axis=1), 1)


def step_config(algorithm: str, sizes: Sizes) -> RLHFConfig:
    """One epoch of NUM_MINIBATCHES minibatches; GRPO with benchmarks/rlhf.py's settings."""
    settings = dict(
        algorithm=algorithm,
        group_size=GROUP_SIZES[algorithm],
        response_len=sizes.response_len,
        update_epochs=UPDATE_EPOCHS,
        num_minibatches=NUM_MINIBATCHES,
        kl_coef=0.1,
    )
    if algorithm == "grpo":
        settings.update(kl_in="loss", kl_estimator="k3", loss_aggregation="grpo")
    return RLHFConfig(**settings)


def flop_params(params: dict) -> int:
    """N: every parameter of ``params`` except the embedding tables (the leaves named
    ``*embedding``), which are looked up, not multiplied."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    return sum(
        leaf.size
        for path, leaf in leaves
        if not str(getattr(path[-1], "key", "")).endswith("embedding")
    )


def step_flops(config: RLHFConfig, n: int, sizes: Sizes) -> float:
    """The module docstring's count: N * T * (2 * forward_passes + 6 * trained_models *
    update_epochs)."""
    forward_passes = 3 + config.needs_critic  # sampling, policy, reference (+ critic)
    trained_models = 1 + config.needs_critic  # policy (+ critic)
    positions = sizes.responses * sizes.max_len
    return float(n) * positions * (2 * forward_passes + 6 * trained_models * config.update_epochs)


def build_step(algorithm: str, sizes: Sizes, key: jax.Array):
    """The trainer, its initial state, the prompts and their mask, and N."""
    lm = transformer(
        sizes.vocab_size, sizes.max_len, sizes.d_model, sizes.num_heads, sizes.num_layers
    )
    config = step_config(algorithm, sizes)
    critic = lm.critic_apply if config.needs_critic else None
    trainer = make_trainer(config, lm.policy_apply, [target_fraction], critic, kv_cache=lm.kv_cache)
    init_key, prompt_key = jax.random.split(key)
    params = lm.init(init_key)
    # The critic starts as a copy of the policy; the model's value head is zero at init.
    state = trainer.init(params, init_key, params if config.needs_critic else None)
    shape = (sizes.responses // config.group_size, sizes.prompt_len)
    prompts = jax.random.randint(prompt_key, shape, FIRST_PROMPT_TOKEN, sizes.vocab_size)
    return trainer, state, prompts, jnp.ones(shape, bool), flop_params(params)


def measure(algorithm: str, sizes: Sizes, steps: int, key: jax.Array) -> dict:
    """Compile one step ahead of time, then ``steps`` timed steps; one result row."""
    build_key, run_key = jax.random.split(key)
    trainer, state, prompts, mask, n = build_step(algorithm, sizes, build_key)
    step_keys = list(jax.random.split(run_key, steps))
    start = time.perf_counter()
    compiled = jax.jit(trainer.step).lower(state, prompts, mask, step_keys[0]).compile()
    compile_s = time.perf_counter() - start
    seconds = []
    for step_key in step_keys:
        start = time.perf_counter()
        state, _ = jax.block_until_ready(compiled(state, prompts, mask, step_key))
        seconds.append(time.perf_counter() - start)
    # The rates come from the reported step_s, so a row's figures agree with each other.
    step_s = round(float(np.median(seconds)), 5)
    flops = step_flops(trainer.config, n, sizes)
    return {
        "name": f"rlhf {algorithm} step, GPT-2-small shape",
        "algorithm": algorithm,
        "params": n,
        "prompts": int(prompts.shape[0]),
        "group_size": trainer.config.group_size,
        "prompt_len": sizes.prompt_len,
        "response_len": sizes.response_len,
        "compile_s": round(compile_s, 2),
        "step_s": step_s,
        "response_tokens_per_s": round(sizes.responses * sizes.response_len / step_s, 1),
        # 4 significant digits: the smoke model's figure is far below 1
        "tflop_per_s": float(f"{flops / step_s / 1e12:.4g}"),
        "shape": {
            "num_layers": sizes.num_layers,
            "d_model": sizes.d_model,
            "num_heads": sizes.num_heads,
            "vocab_size": sizes.vocab_size,
            "max_len": sizes.max_len,
        },
    }


def rlhf_step_times(smoke: bool = False, steps: int = 3) -> list[dict]:
    """A PPO row and a GRPO row (see the module docstring for every figure); ``smoke``: the
    tiny model."""
    sizes = SMOKE if smoke else GPT2_SMALL
    key = jax.random.key(0)
    return [measure(algorithm, sizes, steps, key) for algorithm in GROUP_SIZES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per algorithm (3)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, seconds on a CPU")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    rows = rlhf_step_times(smoke=args.smoke, steps=args.steps)
    print(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
