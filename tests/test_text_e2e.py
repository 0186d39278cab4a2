"""benchmarks/text_e2e.py at toy size: every stage (a model folder made from nothing, ``ppojax
sft``, ``ppojax rlhf --algorithm grpo``, sampled pairs and ``ppojax dpo``) runs, and the result
file, its plot and the final model folders come out well-formed. That it learns is the
benchmark's to show (benchmarks/results/text_e2e.json)."""

import importlib.util
import json
import sys
from pathlib import Path

from ppojax.rlhf import from_pretrained

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    """benchmarks/text_e2e.py as a module (registered, so its dataclass can find it)."""
    spec = importlib.util.spec_from_file_location("text_e2e", ROOT / "benchmarks" / "text_e2e.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["text_e2e"] = module
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_at_toy_size_writes_a_well_formed_result(tmp_path):
    e2e = load_script()
    out = tmp_path / "results" / "text_e2e.json"
    e2e.main(["--toy", "--seeds", "1", "--work", str(tmp_path / "work"), "--out", str(out)])
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["command"].startswith("python benchmarks/text_e2e.py --toy")
    assert {"cpu", "cores", "jax"} <= set(result["machine"]) and result["versions"]
    assert result["sizes"]["sft_steps"] == e2e.TOY.sft_steps
    (row,) = result["seeds"]
    assert row["seed"] == 0
    assert set(row["accuracy"]) == set(e2e.STAGES) == set(result["mean_accuracy"])
    assert all(0 <= value <= 1 for value in row["accuracy"].values())
    assert row["dpo_pairs"] >= e2e.TOY.dpo_batch
    assert len(row["grpo_scores"]) == e2e.TOY.grpo_steps
    assert all(len(row["examples"][stage]) == 4 for stage in e2e.STAGES)
    _, held = e2e.problems(e2e.TOY.held_out)
    assert row["examples"]["sft"][0][0] == held[0]["prompt"]
    pairs = [json.loads(line) for line in (tmp_path / "work/seed0/pairs.jsonl").open()]
    assert all(pair["chosen"] != pair["rejected"] for pair in pairs)
    for stage in ("sft", "grpo", "dpo"):
        (final,) = (tmp_path / "work" / "seed0" / stage).glob("*/final")
        lm = from_pretrained(final)
        assert lm.config.model_type == "llama" and lm.config.num_layers == e2e.TOY.layers
        assert lm.tokenizer.decode(lm.tokenizer.encode("What is 12+7?")) == "What is 12+7?"


def test_the_split_keeps_held_out_sums_out_of_training():
    e2e = load_script()
    train, held = e2e.problems(256)
    assert len(train) + len(held) == 10_000 and len(held) == 256
    assert not {row["prompt"] for row in train} & {row["prompt"] for row in held}
    assert {"prompt": "What is 12+7?", "answer": "19"} in train + held
