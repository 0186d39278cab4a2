"""benchmarks/compile_ablation.py: each variant changes the traced program, and only while it
is on."""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ablation():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports its siblings compare and machine
    try:
        import compile_ablation

        yield compile_ablation
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def program(ablation, variant: str) -> str:
    config = ablation.CONFIGS["cartpole"].replace(total_timesteps=2 * 512)
    text = ablation.ppojax_lowering(config, 1, variant).as_text()
    return re.sub(r"loc\(.*?\)|#loc.*", "", text)  # source locations differ by variant


def test_each_variant_changes_the_program_and_is_undone_after(ablation):
    shipped = program(ablation, "as shipped")
    texts = {name: program(ablation, name) for name in ablation.VARIANTS if name != "as shipped"}
    assert program(ablation, "as shipped") == shipped  # every patch was undone
    assert all(text != shipped for text in texts.values())
    assert len(set(texts.values())) == len(texts)  # and each changes something else
    # what the guard adds: the update's finite check and the selects that skip a step; the
    # bootstrap: a third pass of the critic
    guarded = texts["with divergence guard"]
    assert guarded.count("is_finite") > shipped.count("is_finite")
    assert guarded.count("select") > shipped.count("select")
    assert shipped.count("dot_general") > texts["no truncation bootstrap"].count("dot_general")
