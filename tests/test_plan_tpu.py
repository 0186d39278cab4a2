"""The planner's targets beyond the GPU's: the committed chip table (ppojax.plan.targets) and
how a chip count maps to a TPU slice, the estimate on a TPU by hand, the published figures the
report prints, the one-line errors of a TPU target without libtpu or past its largest slice,
and a tiny GRPO step planned on two v5e chips.

The compiled test needs libtpu (``pip install "ppojax[tpu-aot]"``) and skips without it,
unless ``PPOJAX_REQUIRE_TPU_AOT`` is set (tests/test_tpu_program.py's rule)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from benchmark_script import run_benchmark
from test_plan import GRPO, TINY
from test_plan_inputs import fake_plan
from test_tpu_program import needs_libtpu

from ppojax.cli.commands import main
from ppojax.plan import StepShape, plan, planner
from ppojax.plan.estimate import estimate, step_flops
from ppojax.plan.published import RECIPES, THROUGHPUT
from ppojax.plan.sizing import estimate_lines, levers
from ppojax.plan.targets import CHIPS, TPU_TARGETS, tpu_slice
from ppojax.rlhf.models.config import parse_config
from ppojax.rlhf.models.shapes import model_config
from ppojax.runtime import deviceless_tpu


def test_a_chip_count_takes_the_smallest_slice_that_holds_it():
    assert TPU_TARGETS == ("v5e", "v6e", "v5p")
    assert [tpu_slice("v5e", n) for n in (1, 4, 5, 8, 9, 16)] == [
        "v5e:2x2",
        "v5e:2x2",
        "v5e:2x4",
        "v5e:2x4",
        "v5e:4x4",
        "v5e:4x4",
    ]
    assert tpu_slice("v6e", 8) == "v6e:2x4"
    assert tpu_slice("v5p", 4) == "v5p:2x2x1"  # v5p-8: 4 chips of 2 TensorCores
    with pytest.raises(ValueError, match=r"--devices 9: the largest v5p slice .* 8 chips"):
        tpu_slice("v5p", 9)


def test_the_chip_table_halves_the_published_both_ways_link_figures():
    # NVLink 900 GB/s both ways; ICI 400 (v5e), 800 (v6e), 4800 Gbps = 600 GB/s (v5p)
    links = {name: chip.link_bandwidth for name, chip in CHIPS.items()}
    assert links == {"h100": 450e9, "h200": 450e9, "v5e": 200e9, "v6e": 400e9, "v5p": 300e9}
    assert all(chip.source.startswith("https://") for chip in CHIPS.values())
    assert CHIPS["v5e"].hbm_bytes == 16 * 10**9 and CHIPS["h100"].hbm_bytes is None
    assert CHIPS["h100"].launch_seconds == 2e-6 and CHIPS["v5e"].launch_seconds == 0.0


def test_the_estimate_on_a_tpu_by_hand():
    config = model_config("qwen2.5-0.5b")
    step = StepShape("grpo", 8, 8, 512, 1024)
    # on 8 v5e chips: 2,038 GB moved of which 400 GB in collectives; HBM 819 GB/s -> 2 s, the
    # collectives at 200 GB/s -> 2 s; a million launches cost nothing on a TPU; the compute
    # is the FLOPs over 8 chips at 197 TFLOP/s (about 1 s)
    found = estimate(config, step, "v5e", 8, moved=2038e9, launched=10**6, collective=400e9)
    assert found.memory == pytest.approx(2.0) and found.collectives == pytest.approx(2.0)
    assert found.launches == 0.0
    assert found.compute == pytest.approx(step_flops(config, step) / 8 / 197e12)
    assert found.compute < 2.0 and found.step == pytest.approx(4.0)
    assert found.tokens_per_second == pytest.approx(64 * 1024 / 8 / 4.0)
    # float32 gets the bf16 peak on a TPU (bf16 passes), TF32's on an H100
    f32 = StepShape("grpo", 8, 8, 512, 1024, dtype="float32")
    tpu = estimate(config, f32, "v5e", 1, moved=0)
    assert tpu.compute == pytest.approx(step_flops(config, f32) / 197e12)
    gpu = estimate(config, f32, "h100", 1, moved=0)
    assert gpu.compute == pytest.approx(step_flops(config, f32) / 495e12)


def test_the_report_prints_the_published_figures_beside_the_estimate():
    assert all(t.source.startswith("https://") for t in THROUGHPUT)
    assert all("https://" in r.source for r in RECIPES)
    grpo = StepShape("grpo", prompts=16, group_size=8)
    p = fake_plan(grpo, devices=16)
    # ten million launches at 2 us: 20 s, more than the compute (about 3 s on 16 H100s)
    e = estimate(model_config("llama-3.1-8b"), grpo, "h100", 16, moved=0, launched=10**7)
    named = estimate_lines(dataclasses.replace(p, model="llama-3.1-8b"), e)
    assert named[0].startswith("step time ESTIMATE: 20 s") and "us -> 20 s" in named[0]
    # 16 x 8 responses of 1024 tokens over 16 GPUs in 20 s: 410 a second each
    assert named[1] == "  410 response tokens/s per device at that time"
    assert named[2].startswith("  published: NeMo RL, grpo on 16 x h100 (same count): 1,562")
    assert "on-policy, 97.7 s a step" in named[2] and "1-step off-policy" in named[3]
    eight = estimate_lines(dataclasses.replace(p, model="llama-3.1-8b", devices=8), e)
    assert "16 x h100 (not 8): 1,562" in eight[2]
    assert len(estimate_lines(p, e)) == 2  # model "m": nothing published
    on_tpu = levers(dataclasses.replace(p, target="v5e", devices=4))[-1]
    assert on_tpu == "--devices 8  (the state and the batch split over more chips)"


def test_a_tpu_target_without_libtpu_or_past_its_slices_is_one_line_and_exit_2(
    tmp_path, monkeypatch, capsys
):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))

    def no_compile(*args):
        raise AssertionError("compiled before the flags were checked")

    monkeypatch.setattr(planner, "compile_program", no_compile)
    monkeypatch.setattr(deviceless_tpu, "libtpu_installed", lambda: False)
    flags = ["plan", "--model", str(config), "--dtype", "float32"]
    assert main([*flags, "--target", "v5e", "--devices", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--target v5e" in err and 'ppojax[tpu-aot]"' in err
    assert main([*flags, "--target", "v5p", "--devices", "16"]) == 2
    assert "--devices 16: the largest v5p slice" in capsys.readouterr().err
    assert main([*flags, "--target", "v6e", "--devices", "0"]) == 2
    assert "--devices must be an int >= 1" in capsys.readouterr().err


def test_a_grpo_step_planned_on_two_v5e_chips():
    needs_libtpu()
    config = parse_config(TINY)
    p = plan(config, GRPO, "v5e", 2)
    mesh = planner.target_mesh("v5e", 2)
    assert [d.device_kind for d in mesh.devices.flat] == ["TPU v5 lite"] * 2
    assert p.device_memory == 16 * 10**9 and p.usable == int(16e9 * 0.9)
    # the decode loop's trips were read from its condition (TPU HLO records none)
    assert GRPO.response_len in [loop.trips for loop in p.loops]
    assert p.decoding is not None and p.estimate.launches == 0.0
    assert 0 < p.memory.peak < p.usable and p.fits
    text = p.report()
    assert "on 2 x v5e (mesh data=1 x fsdp=2)" in text and "launches not costed" in text
    assert "counted from libtpu's program" in text and "autotuning" not in text
    assert "16e9" not in text and "14.901 GiB less 10% headroom)" in text


REFUSAL = (
    "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
    "temporaries (26.22G) exceeds available HBM (15.75G). HLO module: jit_step."
)  # libtpu's words for gemma-2-2b's GRPO step on v5e-8


def test_a_step_libtpu_refuses_for_the_chips_hbm_is_planned_as_not_fitting(monkeypatch):
    """libtpu checks a program's memory as it compiles: a refusal is the verdict "does not
    fit" with the temporaries it named and the levers, not a traceback."""
    import jax

    from ppojax.plan import sizing

    needs_libtpu()

    def refuse(*args):
        raise jax.errors.JaxRuntimeError(REFUSAL)

    monkeypatch.setattr(sizing, "compile_program", refuse)
    sizing.measured.cache_clear()  # a compile of the same step by another test is no answer
    try:
        p = plan(parse_config(TINY), GRPO, "v5e", 2)
    finally:
        sizing.measured.cache_clear()
    state = sum(getattr(p.memory, part) for part in planner.PARTS)
    assert p.memory.temporaries == int(26.22 * 1024**3) and p.memory.peak == state + (
        p.memory.temporaries
    )
    assert not p.fits and p.refused.startswith("RESOURCE_EXHAUSTED") and p.estimate is None
    text = p.report()
    assert (
        "libtpu refused to compile it (RESOURCE_EXHAUSTED" in text
        and "refused by libtpu after" in text
    )
    assert "verdict: does NOT fit: peak at least" in text and "--remat-layers" in text

    def other(*args):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(sizing, "compile_program", other)
    with pytest.raises(jax.errors.JaxRuntimeError, match="something else"):
        plan(parse_config(TINY), GRPO, "v5e", 2)  # any other failure is not a verdict
    sizing.measured.cache_clear()


def test_both_of_libtpus_refusals_give_the_memory_they_name():
    from ppojax.plan.sizing import refused_memory

    held = dict(parameters=2 * 1024**3, reference=1024**3, critic=0, optimizer=1024**3)
    first = refused_memory(RuntimeError(REFUSAL), held)
    assert first.temporaries == int(26.22 * 1024**3)
    second = refused_memory(
        RuntimeError("Ran out of memory in memory space hbm. Used 40.00G of 15.75G hbm."), held
    )  # the whole program's use: the temporaries are what the state leaves of it
    assert second.peak == 40 * 1024**3 and second.temporaries == 36 * 1024**3
    assert refused_memory(RuntimeError("INTERNAL: no"), held) is None


def test_the_tpu_table_prints_a_row_per_plan_and_the_recipes_sources(tmp_path):
    gib = 1024**3
    memory = dict(parameters=1 * gib, reference=1 * gib, critic=0, optimizer=2 * gib)
    memory |= dict(temporaries=6 * gib, peak=11 * gib)
    step = dict(lora_rank=16, prompts=8, group_size=8, prompt_len=512, response_len=1024)
    row = dict(key="k", model="gemma-2-2b", step=step, memory=memory, target="v5e", devices=8)
    row |= dict(usable=int(16e9 * 0.9), fits=True, compile_seconds=301.4, recipes=[1])
    row |= dict(estimate=dict(step=12.34, tokens_per_second=663.9))
    out = tmp_path / "plan_tpu.json"
    out.write_text(json.dumps({"tasks": [row]}))
    printed = run_benchmark("plan_tpu", "--table", "--out", str(out)).stdout.strip()
    lines = printed.splitlines()
    assert lines[0].startswith("| model | step | slice | state | temp. | peak | of | fits |")
    # state 1 + 1 + 0 + 2 GiB; 14.4e9 bytes usable is 13.41 GiB
    assert lines[2] == (
        "| gemma-2-2b | grpo LoRA r16 8 x 8, 512 + 1024 | v5e-8 (8 chips) | 4.00 | 6.00 | "
        "11.00 | 13.41 | yes | 12.3 | 664 | 301 | [2] |"
    )
    assert lines[-1].startswith("[2] Tunix (Kaggle hackathon): gemma-2-2b, gemma-3-1b on v5e-8")


def test_the_tpu_table_in_the_rlhf_guide_is_the_result_file_s():
    table = run_benchmark("plan_tpu", "--table").stdout.strip()
    guide = (Path(__file__).resolve().parents[1] / "docs" / "rlhf.md").read_text()
    assert table in guide, "docs/rlhf.md: rerun `python benchmarks/plan_tpu.py --docs`"
