"""benchmarks/text_e2e.py at toy size: every stage (a model folder made from nothing, ``ppojax
sft``, ``ppojax rlhf --algorithm grpo``, sampled pairs and ``ppojax dpo``) runs, the held-out
sums stay out of training, and the result file, its plot and the final model folders come out
well-formed. That it learns is the benchmark's to show (benchmarks/results/text_e2e.json)."""

import json

import pytest
from benchmark_script import run_benchmark

from ppojax.rlhf import from_pretrained

STAGES = {"sft", "grpo", "dpo"}


def read_jsonl(path):
    return [json.loads(line) for line in path.open()]


@pytest.mark.heavy
def test_the_pipeline_at_toy_size_writes_a_well_formed_result(tmp_path):
    out, work = tmp_path / "results" / "text_e2e.json", tmp_path / "work"
    run_benchmark("text_e2e", "--toy", "--seeds", "1", "--work", str(work), "--out", str(out))
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["command"].startswith("python benchmarks/text_e2e.py --toy")
    assert {"cpu", "cores", "jax"} <= set(result["machine"]) and result["versions"]
    sizes = result["sizes"]
    (row,) = result["seeds"]
    assert row["seed"] == 0
    assert set(row["accuracy"]) == STAGES == set(result["mean_accuracy"])
    assert all(0 <= value <= 1 for value in row["accuracy"].values())
    assert row["dpo_pairs"] >= sizes["dpo_batch"]
    assert len(row["grpo_scores"]) == sizes["grpo_steps"]
    assert all(len(row["examples"][stage]) == 4 for stage in STAGES)
    # the split: every a+b once, the held-out ones in no training file
    train = read_jsonl(work / "seed0" / "prompts.jsonl")
    held = read_jsonl(work / "seed0" / "held_out.jsonl")
    sft = {row["prompt"] for row in read_jsonl(work / "seed0" / "sft.jsonl")}
    assert len(train) + len(held) == 10_000 and len(held) == sizes["held_out"]
    assert not {r["prompt"] for r in held} & ({r["prompt"] for r in train} | sft)
    assert {"prompt": "What is 12+7?", "answer": "19"} in train + held
    assert row["examples"]["sft"][0][0] == held[0]["prompt"]
    pairs = read_jsonl(work / "seed0" / "pairs.jsonl")
    assert all(pair["chosen"] != pair["rejected"] for pair in pairs)
    for stage in STAGES:
        (final,) = (work / "seed0" / stage).glob("*/final")
        lm = from_pretrained(final)
        assert lm.config.model_type == "llama" and lm.config.num_layers == sizes["layers"]
        assert lm.tokenizer.decode(lm.tokenizer.encode("What is 12+7?")) == "What is 12+7?"
