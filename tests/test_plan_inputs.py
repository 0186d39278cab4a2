"""What ``ppojax plan`` and the model loaders check before anything compiles: every config.json
value (one line naming the field and the file, exit status 2), the memory flags, the memory
share the training commands give a process and the plan judges against, and the levers a
report names when a step does not fit. No test here compiles: the planner's ``measure`` (the
compile) is replaced by one that fails the test if it is reached, or by fixed numbers."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import replace

import pytest

from ppojax.checks import ConfigError
from ppojax.cli.commands import main
from ppojax.plan import PlanError, StepShape, plan, sizing
from ppojax.plan.sizing import GIB, Memory, Plan, levers
from ppojax.rlhf.models import from_pretrained, read_config
from ppojax.rlhf.models.config import parse_config
from ppojax.runtime.memory import FRACTION_VARIABLE, memory_fraction, use_memory_fraction

LLAMA = {  # Llama-2-7B's shape
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024}
GPT2 = {**GPT2, "vocab_size": 50257}
GEMMA2 = {
    "model_type": "gemma2",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "vocab_size": 256000,
}

# (the config.json, what the one line must say)
BAD_CONFIGS = [
    ({**LLAMA, "hidden_size": "4096"}, "'hidden_size' must be a positive int, got '4096' (str)"),
    ({**LLAMA, "num_key_value_heads": 7}, "'num_key_value_heads' 7 must divide"),
    ({**LLAMA, "num_attention_heads": 30}, "'num_attention_heads' 30 must divide 'hidden_size'"),
    ({**LLAMA, "num_hidden_layers": 0}, "'num_hidden_layers' must be a positive int, got 0"),
    ({**LLAMA, "vocab_size": 0}, "'vocab_size' must be a positive int, got 0"),
    ({**LLAMA, "vocab_size": -32000}, "'vocab_size' must be a positive int, got -32000"),
    ({**LLAMA, "num_hidden_layers": True}, "'num_hidden_layers' must be a positive int, got True"),
    ({**LLAMA, "intermediate_size": 11008.0}, "got 11008.0 (float); write 11008"),
    ({**LLAMA, "head_dim": "128"}, "'head_dim' must be a positive int, got '128' (str)"),
    ({**LLAMA, "max_position_embeddings": 0}, "'max_position_embeddings' must be a positive"),
    ({**LLAMA, "rms_norm_eps": "1e-5"}, "'rms_norm_eps' must be a number > 0, got '1e-5'"),
    ({**LLAMA, "model_type": "mistral", "sliding_window": -1}, "'sliding_window' must be a"),
    ({k: v for k, v in LLAMA.items() if k != "model_type"}, "has no 'model_type'; add"),
    ({k: v for k, v in LLAMA.items() if k != "vocab_size"}, "has no 'vocab_size'"),
    ({**LLAMA, "model_type": "phi3"}, "model_type 'phi3' is not supported"),
    ({**GPT2, "n_head": 5}, "'n_head' 5 must divide 'n_embd' 768"),
    ({**GPT2, "n_layer": "12"}, "'n_layer' must be a positive int, got '12' (str)"),
    ({**GEMMA2, "num_key_value_heads": 3}, "'num_key_value_heads' 3 must divide"),
    ({**GEMMA2, "num_hidden_layers": 0}, "'num_hidden_layers' must be a positive int, got 0"),
    ([LLAMA], "must hold a JSON object"),
]


@pytest.fixture
def no_compile(monkeypatch):
    """The planner's compile, replaced by a failure: what is checked must stop before it."""

    def measure(*args):
        raise AssertionError("the plan compiled a step its inputs should have stopped")

    monkeypatch.setattr(sizing, "measure", measure)


def plan_command(capsys, *argv: str) -> tuple[int, str]:
    """``ppojax plan`` with ``argv`` on the cpu target: its exit status and its stderr."""
    status = main(["plan", "--target", "cpu", *argv])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(("raw", "says"), BAD_CONFIGS)
def test_each_bad_config_json_gets_one_line_and_exit_2(raw, says, tmp_path, capsys, no_compile):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    status, err = plan_command(capsys, "--model", str(path))
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("ppojax plan: error: "), err
    assert says in err and str(path) in err, err


@pytest.mark.parametrize(("raw", "says"), BAD_CONFIGS[:4])
def test_the_loaders_get_the_same_checks(raw, says, tmp_path):
    """``from_pretrained`` reads config.json through the same parser, before any weights."""
    (tmp_path / "config.json").write_text(json.dumps(raw))
    for load in (read_config, from_pretrained):
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
            load(tmp_path)


def test_the_config_error_names_the_field():
    with pytest.raises(ConfigError) as info:
        parse_config({**LLAMA, "num_key_value_heads": 7})
    assert info.value.field == "num_key_value_heads"
    # what is given is read as given: head_dim frees the heads from dividing the width
    config = parse_config(
        {**LLAMA, "num_attention_heads": 30, "num_key_value_heads": 10, "head_dim": 128}
    )
    assert (config.num_heads, config.head_dim) == (30, 128)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--memory-gib", "-5"], "--memory-gib must be a number > 0 (GiB per device), got -5.0"),
        (["--memory-gib", "0"], "--memory-gib must be a number > 0"),
        (["--memory-gib", "nan"], "--memory-gib must be a number > 0"),
        (["--memory-gib", "inf"], "--memory-gib must be a number > 0"),
        (["--headroom", "1"], "--headroom must be in [0, 1)"),
        (["--headroom", "-0.1"], "--headroom must be in [0, 1)"),
    ],
)
def test_the_memory_flags_are_checked_before_the_compile(flags, says, tmp_path, capsys, no_compile):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    status, err = plan_command(capsys, "--model", str(path), *flags)
    assert status == 2 and err.count("\n") == 1 and says in err, err


def test_plan_checks_its_memory_arguments_before_the_compile(no_compile):
    with pytest.raises(PlanError, match=r"--headroom must be in \[0, 1\)"):
        plan("qwen2.5-0.5b", headroom=1.0)
    with pytest.raises(PlanError, match="device_memory must be a number of bytes > 0"):
        plan("qwen2.5-0.5b", device_memory=-1)


def test_the_training_commands_set_the_memory_fraction_unless_the_user_did(monkeypatch):
    assert use_memory_fraction(environ := {}) == "0.9" and environ == {FRACTION_VARIABLE: "0.9"}
    mine = {FRACTION_VARIABLE: "0.5"}
    assert use_memory_fraction(mine) == "0.5" and mine == {FRACTION_VARIABLE: "0.5"}
    assert memory_fraction({}) == 0.9 and memory_fraction(mine) == 0.5
    assert memory_fraction({FRACTION_VARIABLE: "lots"}) == 0.9
    for command, fraction in (("plan", None), ("train", "0.9"), ("rlhf", "0.9"), ("sft", "0.9")):
        monkeypatch.delenv(FRACTION_VARIABLE, raising=False)
        with pytest.raises(SystemExit):
            main([command, "--help"])  # the fraction is set before the command's parser runs
        assert os.environ.get(FRACTION_VARIABLE) == fraction, command
    monkeypatch.setenv(FRACTION_VARIABLE, "0.6")
    with pytest.raises(SystemExit):
        main(["dpo", "--help"])
    assert os.environ[FRACTION_VARIABLE] == "0.6"  # the user's, kept


def fixed_measure(peak: int):
    """A stand-in for the planner's compile: every step peaks at ``peak`` bytes."""
    memory = Memory(0, 0, 0, 0, 0, peak, 0, 0, peak)
    return lambda *args: (memory, 10, 1 << 30, (), 1.0, 0, "")


def test_the_plan_judges_against_the_memory_a_training_process_gets(monkeypatch, capsys):
    monkeypatch.setattr(sizing, "measure", fixed_measure(60 * GIB))
    monkeypatch.delenv(FRACTION_VARIABLE, raising=False)
    found = plan("qwen2.5-0.5b", target="h100")
    assert found.headroom == 0.1 and found.usable == int(0.9 * found.device_memory)
    assert found.fits  # 60 GiB of 71.2; JAX's default 75% (59.3 GiB) would not hold it
    text = found.report()
    assert "less 10% headroom: the 0.9 a training command preallocates" in text
    assert FRACTION_VARIABLE in text
    monkeypatch.setenv(FRACTION_VARIABLE, "0.75")
    assert not plan("qwen2.5-0.5b", target="h100").fits
    found = plan("qwen2.5-0.5b", target="h100", headroom=0.05)
    assert "a training command preallocates 0.75" in found.report()
    assert "--headroom 0.25 judges against" in found.report()
    assert main(["plan", "--model", "qwen2.5-0.5b"]) == 1  # the budget the command judges by
    assert "less 25% headroom" in capsys.readouterr().out


def fake_plan(step: StepShape, devices: int = 1, largest: int | None = None) -> Plan:
    """A plan of ``step`` that needs twice the memory there is."""
    memory = Memory(0, 0, 0, 0, 0, 2 * GIB, 0, 0, 2 * GIB)
    return Plan("m", step, "h100", devices, memory, 1, 1, (), None, GIB, 0.1, 1.0, largest)


def test_a_step_that_does_not_fit_names_the_flags_to_try():
    grpo = StepShape("grpo", prompts=8, group_size=8)
    assert levers(fake_plan(grpo)) == [
        "--remat-layers  (recompute each layer in the backward pass, not keep it)",
        "--prompts 4  (fewer prompts a step; --search finds the largest)",
        "--lora-rank 16  (adapters: no gradients or Adam moments of the weights)",
        "--devices 2  (the state and the batch split over more GPUs)",
    ]
    text = fake_plan(grpo).report()
    assert "does NOT fit" in text and "to make it fit, try adding" in text
    assert text.endswith("  --devices 2  (the state and the batch split over more GPUs)")
    # what is on already is not offered again; the searched prompts are named as found
    both = replace(grpo, remat_layers=True, lora_rank=16)
    found = [lever.split("  ")[0] for lever in levers(fake_plan(both, largest=4))]
    assert found == ["--prompts 4", "--devices 2"]
    assert [lever.split("  ")[0] for lever in levers(fake_plan(both, largest=0))] == ["--devices 2"]
    # prompts that more devices cannot split are rounded to a count they can
    odd = replace(grpo, prompts=3, num_minibatches=1)
    assert levers(fake_plan(odd))[-1].startswith("--devices 2 --prompts 2  ")
    sft = StepShape("sft", prompts=1)  # no remat, no LoRA, no fewer than one row
    assert [lever.split("  ")[0] for lever in levers(fake_plan(sft))] == ["--devices 2 --prompts 2"]
    fits = replace(fake_plan(grpo), device_memory=4 * GIB)
    assert fits.fits and "to make it fit" not in fits.report()


def test_the_estimate_costs_launches_and_collectives_and_remat_costs_a_forward():
    from ppojax.plan.estimate import estimate, step_flops, token_flops
    from ppojax.plan.planner import StepShape
    from ppojax.rlhf.models.shapes import model_config

    config = model_config("qwen2.5-0.5b")
    step = StepShape("grpo", 8, 8, 512, 1024)
    # 1e6 launches at 2 us: 2 s, more than the compute (~0.1 s on 8 H100s) and the HBM
    # bytes (none left once the 450 GB the collectives move are taken out); the collectives
    # at 450 GB/s add 1 s: 3 s a step, 64 x 1024 response tokens over 8 GPUs
    found = estimate(config, step, "h100", 8, moved=450e9, launched=10**6, collective=450e9)
    assert found.compute < 0.5 and found.memory == 0.0
    assert found.launches == pytest.approx(2.0) and found.collectives == pytest.approx(1.0)
    assert found.step == pytest.approx(3.0)
    assert found.tokens_per_second == pytest.approx(64 * 1024 / 8 / 3.0)
    alone = estimate(config, step, "h100", 1, moved=0, launched=0, collective=0)
    assert alone.collectives == 0.0 and alone.step == alone.compute
    # remat_layers: one more forward of the trunk (every token, no head) per update epoch
    remat = dataclasses.replace(step, remat_layers=True)
    trunk = step.rows * 1536 * token_flops(config, 1536, logits=False)
    extra = step_flops(config, remat) - step_flops(config, step)
    assert extra == pytest.approx(step.update_epochs * trunk, rel=1e-12)


def test_the_names_moved_out_of_ppojax_rlhf_are_deprecated_aliases():
    """The planner moved to ``ppojax.plan`` and the one-turn batch became ``EpisodeBatch``:
    the old names still work for a release, each with a DeprecationWarning naming where it
    lives now; an unknown name is still an AttributeError."""
    import ppojax.plan
    import ppojax.rlhf
    from ppojax.rlhf.core.update import EpisodeBatch

    for name in ("plan", "Plan", "PlanError", "StepShape"):
        with pytest.warns(DeprecationWarning, match=f"use ppojax.plan.{name}"):
            assert getattr(ppojax.rlhf, name) is getattr(ppojax.plan, name)
    with pytest.warns(DeprecationWarning, match="use ppojax.rlhf.core.update.EpisodeBatch"):
        assert ppojax.rlhf.RLHFBatch is EpisodeBatch
    with pytest.raises(AttributeError, match="no attribute 'plans'"):
        ppojax.rlhf.plans  # noqa: B018
