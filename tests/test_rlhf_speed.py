"""benchmarks/rlhf_speed.py at its smoke size: both rows well-formed, and their rates follow
from their step time and shapes by the counts the script's docstring states."""

import json
import math

import jax
import pytest
from benchmark_script import run_benchmark

from ppojax.rlhf import transformer

KEYS = {
    "name",
    "algorithm",
    "params",
    "prompts",
    "group_size",
    "prompt_len",
    "response_len",
    "compile_s",
    "step_s",
    "response_tokens_per_s",
    "tflop_per_s",
    "shape",
}


@pytest.mark.heavy
def test_the_smoke_rows_are_well_formed_and_their_rates_follow_from_step_s():
    printed = run_benchmark("rlhf_speed", "--smoke", "--steps", "1").stdout
    rows = json.loads(printed)["rows"]
    assert [row["algorithm"] for row in rows] == ["ppo", "grpo"]
    assert [row["group_size"] for row in rows] == [1, 8]
    shape = rows[0]["shape"]
    lm = transformer(
        shape["vocab_size"],
        shape["max_len"],
        shape["d_model"],
        shape["num_heads"],
        shape["num_layers"],
    )
    total = sum(leaf.size for leaf in jax.tree.leaves(jax.eval_shape(lm.init, jax.random.key(0))))
    embeddings = (shape["vocab_size"] + shape["max_len"]) * shape["d_model"]
    passes = {"ppo": 20, "grpo": 12}  # 2 x forward passes + 6 x trained models, one epoch
    for row in rows:
        assert set(row) == KEYS
        assert row["shape"] == shape
        assert row["params"] == total - embeddings
        for key in ("compile_s", "step_s", "response_tokens_per_s", "tflop_per_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["algorithm"], key, row[key])
        responses = row["prompts"] * row["group_size"]
        assert responses == rows[0]["prompts"] * rows[0]["group_size"]
        tokens = responses * row["response_len"]
        assert math.isclose(row["response_tokens_per_s"], tokens / row["step_s"], rel_tol=1e-3)
        positions = responses * (row["prompt_len"] + row["response_len"])
        flops = passes[row["algorithm"]] * row["params"] * positions
        assert math.isclose(row["tflop_per_s"], flops / row["step_s"] / 1e12, rel_tol=1e-3)
