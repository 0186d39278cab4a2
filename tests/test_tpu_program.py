"""Compiling for a TPU without one (ppojax.runtime.deviceless_tpu) and counting what it would
run (ppojax.runtime.launches, loop trips read from the loops' conditions): the trip reading on
HLO written by hand, the ops of a small PPO program compiled for one v5e chip, exactly, and
docs/tpu.md's table against benchmarks/results/tpu_program.json.

The compiled test needs libtpu (``pip install "ppojax[tpu-aot]"``) and skips without it,
unless ``PPOJAX_REQUIRE_TPU_AOT`` is set (set it where the extra is installed, so that the
test cannot skip there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from benchmark_script import run_benchmark

import ppojax
from ppojax.runtime import deviceless, deviceless_tpu, launches

ROOT = Path(__file__).resolve().parents[1]

# As libtpu writes loops: no trip count; the condition compares the tuple's element 0 with a
# constant, the body adds 1 to it, the loop's tuple starts it at a copy of a constant. The
# first loop runs 3..10 (7 trips); the second counts down (not read: one trip). Before them,
# an async copy into on-chip memory (S(1)), as libtpu prefetches
TPU_HLO = """HloModule tpu, is_scheduled=true

%body (arg: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg = (s32[]{:T(128)}, f32[4]{0:T(256)}) parameter(0)
  %one = s32[]{:T(128)} constant(1)
  %i = s32[]{:T(128)} get-tuple-element(%arg), index=0
  %x = f32[4]{0:T(256)} get-tuple-element(%arg), index=1
  %next = s32[]{:T(128)} add(%i, %one)
  %y = f32[4]{0:T(256)S(1)} sine(%x)
  ROOT %t = (s32[]{:T(128)}, f32[4]{0:T(256)}) tuple(%next, %y)
}

%cond (arg.1: (s32[], f32[4])) -> pred[] {
  %arg.1 = (s32[]{:T(128)}, f32[4]{0:T(256)}) parameter(0)
  %limit = s32[]{:T(128)} constant(10)
  %i.1 = s32[]{:T(128)} get-tuple-element(%arg.1), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i.1, %limit), direction=LT
}

%down (arg.2: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg.2 = (s32[]{:T(128)}, f32[4]{0:T(256)}) parameter(0)
  %one.2 = s32[]{:T(128)} constant(1)
  %i.2 = s32[]{:T(128)} get-tuple-element(%arg.2), index=0
  %x.2 = f32[4]{0:T(256)} get-tuple-element(%arg.2), index=1
  %next.2 = s32[]{:T(128)} subtract(%i.2, %one.2)
  ROOT %t.2 = (s32[]{:T(128)}, f32[4]{0:T(256)}) tuple(%next.2, %x.2)
}

%down_cond (arg.3: (s32[], f32[4])) -> pred[] {
  %arg.3 = (s32[]{:T(128)}, f32[4]{0:T(256)}) parameter(0)
  %zero.3 = s32[]{:T(128)} constant(0)
  %i.3 = s32[]{:T(128)} get-tuple-element(%arg.3), index=0
  ROOT %gt = pred[]{:T(512)} compare(%i.3, %zero.3), direction=GT
}

ENTRY %main (x.1: f32[4]) -> f32[4] {
  %x.1 = f32[4]{0:T(256)} parameter(0)
  %three = s32[]{:T(128)} constant(3)
  %start = s32[]{:T(128)} copy(%three)
  %cs = (f32[4]{0:T(256)S(1)}, f32[4]{0:T(256)}, u32[]{:S(2)}) copy-start(%x.1)
  %cd = f32[4]{0:T(256)S(1)} copy-done(%cs)
  %init = (s32[]{:T(128)}, f32[4]{0:T(256)}) tuple(%start, %cd)
  %loop = (s32[]{:T(128)}, f32[4]{0:T(256)}) while(%init), condition=%cond, body=%body
  %out = f32[4]{0:T(256)} get-tuple-element(%loop), index=1
  %init.2 = (s32[]{:T(128)}, f32[4]{0:T(256)}) tuple(%three, %out)
  %loop.2 = (s32[]{:T(128)}, f32[4]{0:T(256)}) while(%init.2), condition=%down_cond, body=%down
  ROOT %res = f32[4]{0:T(256)} get-tuple-element(%loop.2), index=1
}
"""


def test_trips_are_read_from_a_counting_loop_s_condition_and_only_with_the_flag():
    program = launches.count(TPU_HLO, trips_from_condition=True)
    # the counter's copy (4 + 4 B); the async copy, once: its destination written and as
    # much read (16 + 16 B)
    assert [(launch.opcode, launch.bytes) for launch in program.launches] == [
        ("copy", 8),
        ("copy-done", 32),
    ]
    up, down = program.loops
    assert (up.trips, down.trips) == (7, None)
    # a trip: the add, the sine (16 + 16 B) and the compare (4 + 4 + 1 B)
    assert up.launches_per_trip() == 3 and up.total_launches() == 21
    assert up.bytes_per_trip() == (4 + 4 + 4) + (16 + 16) + (4 + 4 + 1)
    assert [loop.trips for loop in launches.count(TPU_HLO).loops] == [None, None]


def test_unknown_targets_and_no_libtpu_name_the_extra(monkeypatch):
    with pytest.raises(deviceless_tpu.DevicelessTPUError, match="known targets: v5e, v6e"):
        deviceless_tpu.topology("v5e:1x1")
    monkeypatch.setattr(deviceless_tpu, "libtpu_installed", lambda: False)
    with pytest.raises(deviceless.DevicelessError, match=r"ppojax\[tpu-aot\]"):
        deviceless_tpu.compile_for(jnp.sin, (jnp.ones(3),), "v5e")


def needs_libtpu() -> None:
    if deviceless_tpu.libtpu_installed():
        return
    if os.environ.get("PPOJAX_REQUIRE_TPU_AOT"):
        pytest.fail("PPOJAX_REQUIRE_TPU_AOT is set and libtpu is not installed")
    pytest.skip('libtpu is not installed (pip install "ppojax[tpu-aot]")')


# The small program of tests/test_gpu_program.py compiled for one v5e chip and counted per
# jax version (the same with jax 0.10.2 and libtpu 0.0.42.1 on Python 3.11 and with jax
# 0.11.2 and libtpu 0.0.48.1 on 3.12; a change that splits or merges a fusion changes them)
SMALL_CONFIG = dict(
    env_id="CartPole-v1",
    num_envs=4,
    num_steps=32,
    total_timesteps=4 * 32 * 3,
    update_epochs=2,
    num_minibatches=2,
)
# ppojax.runtime.kernels.TPU_DEFAULTS in (the Pallas loss compiled by Mosaic, GAE's associative
# scan); with them off it counts 1,718, 27 and 112
EXPECTED = {
    version: {"per_update": 1410, "per_env_step": 21, "per_minibatch_step": 108}
    for version in ("0.10.2", "0.11.2")
}


def test_small_ppo_program_ops_on_one_v5e_chip():
    needs_libtpu()
    if jax.__version__ not in EXPECTED:
        pytest.fail(f"no op counts recorded for jax {jax.__version__}: count them and add")
    config = ppojax.PPOConfig(**SMALL_CONFIG)
    keys = jax.random.split(jax.random.key(0), 1)
    program = jax.vmap(ppojax.train, in_axes=(None, 0))  # a new function: traced again
    compiled = deviceless_tpu.compile_for(program, (config, keys), "v5e")
    assert deviceless_tpu.topology("v5e").devices[0].device_kind == "TPU v5 lite"
    counted = launches.count(compiled.as_text(), trips_from_condition=True)
    phases = launches.ppo_phases(counted, 3, 32, 2, 2)
    assert {part: phases[part]["launches"] for part in EXPECTED[jax.__version__]} == EXPECTED[
        jax.__version__
    ]
    # the TPU's defaults: one env step a trip (no "packed_steps"), no loop of GAE (its
    # associative scan), the loss and its gradient one Mosaic call per minibatch step
    assert phases["rollout"]["trips"] == 32 and phases["gae"]["loops"] == []
    assert phases["per_minibatch_step"]["by_opcode"]["custom-call"] == 1


def test_the_docs_table_is_the_one_tpu_program_py_makes_from_the_result_file(tmp_path):
    """docs/tpu.md's counts are generated, never typed: they equal what
    ``python benchmarks/tpu_program.py --readme docs/tpu.md`` writes from tpu_program.json."""
    page = ROOT / "docs" / "tpu.md"
    copy = tmp_path / "tpu.md"
    copy.write_text(page.read_text())
    run_benchmark("tpu_program", "--readme", str(copy))
    assert copy.read_text() == page.read_text(), (
        "run python benchmarks/tpu_program.py --readme docs/tpu.md"
    )
    report = json.loads((ROOT / "benchmarks" / "results" / "tpu_program.json").read_text())
    counted = {(row["program"], row["work"], row["target"]) for row in report["rows"]}
    assert {("ppojax", "1 agent x 8192 envs", target) for target in ("v5e", "v6e")} <= counted
    assert not [row for row in report["rows"] if "error" in row]
