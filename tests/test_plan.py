"""The planner (ppojax.plan.plan, ``ppojax plan``): its numbers against the CPU backend's own
``memory_analysis`` of the same step built from real arrays, the FLOP count by hand, the
search for the largest step and the errors (the H100 path over an FSDP mesh of two is in
tests/test_gpu_program.py, with the other tests that need JAX's CUDA plugin).

One tiny Qwen2-shaped config (1 layer, width 16, 1024 tokens) keeps every compile small; the
planner caches what it measured, so the tests that ask for the same step share its compile.
"""

from __future__ import annotations

import json
from dataclasses import replace

import jax
import jax.numpy as jnp
import pytest

from ppojax.cli.commands import main
from ppojax.plan import PlanError, StepShape, plan
from ppojax.plan.estimate import step_flops, token_flops
from ppojax.plan.planner import abstract_lm, rl_config, token_reward
from ppojax.plan.sizing import largest_fitting
from ppojax.rlhf import make_trainer
from ppojax.rlhf.core.sharding import make_mesh, shard_trainer
from ppojax.rlhf.models.config import parse_config
from ppojax.rlhf.models.shapes import abstract_params, model_config

TINY = {
    "model_type": "qwen2",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}
GRPO = StepShape(
    "grpo",
    prompts=2,
    group_size=2,
    prompt_len=4,
    response_len=3,
    dtype="float32",
    update_epochs=1,
    num_minibatches=2,
)


@pytest.fixture
def tiny_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def test_the_plan_is_the_cpu_backends_memory_analysis_of_the_real_step():
    """The step built from shapes alone compiles to the program of the step built from real
    params (the same buffers, byte for byte), and the state's parts are its leaves' bytes."""
    config = parse_config(TINY)
    planned = plan(config, GRPO, "cpu", 1)

    lm = abstract_lm(config, "float32")
    params = lm.module.init(jax.random.key(1), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1)))
    trainer = make_trainer(
        rl_config(GRPO, config), lm.policy_apply, token_reward, kv_cache=lm.kv_cache
    )
    sharded = shard_trainer(trainer, make_mesh(1))
    state = sharded.init(params, jax.random.key(2))
    prompts = jnp.ones((GRPO.prompts, GRPO.prompt_len), jnp.int32)
    mask = jnp.ones(prompts.shape, bool)
    compiled = sharded.step.lower(state, prompts, mask, jax.random.key(3)).compile()
    real = compiled.memory_analysis()

    m = planned.memory
    held = m.parameters + m.reference + m.critic + m.optimizer
    assert held + m.inputs == real.argument_size_in_bytes
    assert (m.outputs, m.temporaries, m.aliased) == (
        real.output_size_in_bytes,
        real.temp_size_in_bytes,
        real.alias_size_in_bytes,
    )
    arguments, outputs = real.argument_size_in_bytes, real.output_size_in_bytes
    assert m.peak == arguments + outputs - m.aliased + m.temporaries
    weights = sum(leaf.size * 4 for leaf in jax.tree.leaves(params))
    assert m.parameters == m.reference == weights and m.critic == 0
    assert m.optimizer == 2 * weights + 4  # Adam's two moments and its int32 count
    # the batch [2, 4] as int32 and bool, beta, the step and the key
    assert m.inputs == 2 * 4 * 4 + 2 * 4 + 4 + 4 + 8
    assert planned.estimate is None and planned.fits and planned.largest_prompts is None
    # sampling's loop takes one trip a response token; the loops' launches are the step's
    assert GRPO.response_len in [loop.trips for loop in planned.loops]
    assert sum(loop.launches for loop in planned.loops) < planned.launches


def test_flops_by_hand():
    config = parse_config(TINY)
    # per token over 8 keys: q, o 16x16 each and k, v 16x8 each (768), the MLP 3 x 16 x 32
    # (1536), the tied head 1024 x 16 (16384): 2 x 18688 = 37376, attention 4 x 16 x 8 = 512
    assert token_flops(config, 8) == 37376 + 512
    assert token_flops(config, 8, logits=False) == 2 * (768 + 1536) + 512
    step = StepShape(
        "grpo",
        prompts=2,
        group_size=3,
        prompt_len=5,
        response_len=3,
        update_epochs=2,
        logit_chunk=0,
    )
    full = 6 * 8 * (37376 + 512)  # 6 rows of 8 tokens
    sampled = 6 * 5 * (37376 + 512) + 6 * 3 * (37376 + 512)
    # sampling, policy and reference log-probs, 2 epochs of forward + backward (3 forwards)
    assert step_flops(config, step) == sampled + 2 * full + 2 * 3 * full
    lora = replace(step, lora_rank=4)
    assert step_flops(config, lora) == sampled + 2 * full + 2 * 2 * full
    # in chunks the head (2 x 16384 a token) runs at the 6 x 3 response tokens only, and in
    # the update 4 times: forward, its recomputation, backward (2)
    trunk, head = 6 * 8 * (2 * (768 + 1536) + 512), 6 * 3 * 2 * 16384
    chunked = replace(step, logit_chunk=4096)
    assert step_flops(config, chunked) == sampled + 2 * (trunk + head) + 2 * (3 * trunk + 4 * head)


def test_largest_fitting_doubles_then_bisects():
    asked = []

    def fits(prompts: int) -> bool:
        asked.append(prompts)
        return prompts <= 37

    assert largest_fitting(fits, 4, 2, limit=1000) == 36
    assert asked == [4, 8, 16, 32, 64, 48, 40, 36, 38]
    asked.clear()
    assert largest_fitting(fits, 40, 4, limit=1000) == 36
    assert asked == [40, 20, 28, 32, 36]
    assert largest_fitting(lambda prompts: False, 8, 2) == 0
    assert largest_fitting(lambda prompts: True, 8, 2, limit=100) == 100


def test_the_search_finds_the_largest_step_by_compiling(tiny_json):
    """With exactly the memory 2 rows take, the search from 2 compiles 4 (too large), then 3
    (too large: more rows, more bytes) and answers 2."""
    sft = StepShape("sft", prompts=2, prompt_len=4, response_len=3, dtype="float32")
    two = plan(tiny_json, sft, "cpu")
    memory = two.memory.peak
    found = plan(tiny_json, sft, "cpu", device_memory=memory, headroom=0.0, search=True)
    assert found.largest_prompts == 2 and found.fits
    assert "largest prompts per step that fit: 2" in found.report()
    roomy = plan(tiny_json, sft, "cpu", device_memory=2 * memory, headroom=0.5, search=True)
    assert roomy.largest_prompts == 2  # headroom 0.5 of twice the memory: the same bytes


@pytest.mark.heavy
def test_the_search_compiles_each_lever_of_a_step_that_does_not_fit(tiny_json):
    """One byte short of GRPO's peak: the search compiles each lever (the largest prompts,
    remat, LoRA) and tells which fit; two devices cannot be planned in a one-CPU process."""
    peak = plan(tiny_json, GRPO, "cpu").memory.peak
    short = plan(tiny_json, GRPO, "cpu", device_memory=peak - 1, headroom=0.0, search=True)
    assert not short.fits and short.largest_prompts == 1
    checked = {c.lever.split("  ")[0]: c for c in short.checked}
    assert set(checked) == {"--remat-layers", "--prompts 1", "--lora-rank 16", "--devices 2"}
    assert checked["--prompts 1"].fits and checked["--prompts 1"].peak < peak
    assert checked["--lora-rank 16"].peak < peak  # no Adam moments or gradients of the weights
    for lever in ("--remat-layers", "--lora-rank 16", "--prompts 1"):
        assert checked[lever].fits == (checked[lever].peak <= peak - 1)
    assert "this process has 1 CPU device" in checked["--devices 2"].error
    text = short.report()
    assert "add one of (each compiled, --search)" in text
    assert "  --prompts 1  (the largest that fits, searched): fits, peak" in text


def test_errors_name_the_flag(tiny_json, tmp_path):
    with pytest.raises(PlanError, match="--target 'tpu9' is unknown"):
        plan(tiny_json, GRPO, "tpu9")
    with pytest.raises(PlanError, match="--prompts 3 cannot be split over --devices 2"):
        plan(tiny_json, replace(GRPO, prompts=3), "cpu", 2)
    with pytest.raises(PlanError, match="--devices 2: this process has 1 CPU device"):
        plan(tiny_json, GRPO, "cpu", 2)
    with pytest.raises(PlanError, match="--num-minibatches 3 must divide --prompts 2"):
        plan(tiny_json, replace(GRPO, num_minibatches=3), "cpu")
    with pytest.raises(PlanError, match="more than the model's context"):
        plan(tiny_json, replace(GRPO, response_len=61), "cpu")
    with pytest.raises(PlanError, match="--algorithm 'a2c'"):
        StepShape("a2c")
    with pytest.raises(PlanError, match="--group-size must be >= 2 for grpo"):
        StepShape("grpo", group_size=1)
    with pytest.raises(ValueError, match="built-in shape"):
        plan(tmp_path / "absent.json", GRPO, "cpu")


def test_the_command_prints_the_plan_and_fails_when_it_does_not_fit(tiny_json, tmp_path, capsys):
    out = tmp_path / "plan.json"
    flags = ["plan", "--model", str(tiny_json), "--target", "cpu", "--dtype", "float32"]
    flags += ["--algorithm", "grpo", "--prompts", "2", "--group-size", "2", "--prompt-len", "4"]
    flags += ["--response-len", "3", "--update-epochs", "1", "--num-minibatches", "2"]
    assert main([*flags, "--json", str(out)]) == 0  # the first test's step, already compiled
    printed = capsys.readouterr().out
    assert "verdict: fits" in printed and "peak" in printed
    written = json.loads(out.read_text())
    assert written["fits"] and written["memory"] == plan(tiny_json, GRPO, "cpu").memory.__dict__
    assert main([*flags, "--memory-gib", "0.0001"]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main([*flags, "--target", "a100"]) == 2
    assert "--target 'a100' is unknown" in capsys.readouterr().err
    for argv, usage in ((["plan", "--help"], "usage: ppojax plan"), (["--help"], "plan ")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0 and usage in capsys.readouterr().out


def test_the_built_in_shapes_have_the_published_parameter_counts():
    """Each built-in config's parameters (from shapes alone) are the count its Hugging Face
    repo publishes for the safetensors it holds."""
    published = {
        "qwen2.5-0.5b": 494_032_768,
        "qwen2.5-1.5b": 1_543_714_304,
        "qwen2.5-7b": 7_615_616_512,
        "llama-3.1-8b": 8_030_261_248,
    }
    for name, count in published.items():
        params = abstract_params(model_config(name), jnp.bfloat16)
        assert sum(leaf.size for leaf in jax.tree.leaves(params)) == count, name
