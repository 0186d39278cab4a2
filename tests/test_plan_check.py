"""benchmarks/plan_check.py (the planner against a GPU's own figures) at its smoke size on the
CPU: it compiles the program the planner sizes, and runs it on its zero-filled inputs."""

import json

import pytest
from benchmark_script import run_benchmark

from ppojax.plan import StepShape, plan
from ppojax.rlhf.models.config import parse_config


@pytest.mark.slow
def test_the_smoke_check_runs_the_program_the_planner_sizes(tmp_path):
    out = tmp_path / "plan_check.json"
    run_benchmark("plan_check", "--smoke", "--steps", "2", "--out", str(out))
    run_benchmark("plan_check", "--smoke", "--remat-layers", "--steps", "1", "--out", str(out))
    rows = {row["key"]: row for row in json.loads(out.read_text())["tasks"]}
    # each run adds its row, keyed by its step: gpu.sh runs the two shapes as two commands
    assert sorted(rows) == [
        "smoke grpo 2x2 8+8 float32 lora0",
        "smoke grpo 2x2 8+8 float32 lora0 remat",
    ]
    row = rows["smoke grpo 2x2 8+8 float32 lora0"]
    assert rows["smoke grpo 2x2 8+8 float32 lora0 remat"]["step"]["remat_layers"]
    planned, ran = row["planned"], row["step"]
    assert planned["peak"] == (
        planned["arguments"] + planned["outputs"] - planned["aliased"] + planned["temporaries"]
    )
    step = StepShape(
        ran["algorithm"],
        ran["prompts"],
        ran["group_size"],
        ran["prompt_len"],
        ran["response_len"],
        dtype=ran["dtype"],
        num_minibatches=2,
    )
    found = plan(parse_config(row["model"]), step, "cpu", 1)  # the planner's own compile
    assert planned["peak"] == found.memory.peak
    assert planned["temporaries"] == found.memory.temporaries
    assert len(row["measured"]["step_s"]) == 2 and row["finite_metrics"]
    assert row["measured"]["ran"] and row["measured"]["error"] is None
    # the script sets the commands' memory fraction unless the caller did; a CPU keeps no
    # allocator limit, so no verdict against it
    assert row["budget"]["memory_fraction"] is not None
    assert row["budget"]["bytes_limit"] is None and row["budget"]["planned_fits"] is None
    assert row["device"] == "cpu" and row["estimate_s"] is None  # no peak known for a CPU
