"""Compiling for a GPU without one (ppojax.runtime.deviceless) and counting what it would run
(ppojax.runtime.launches): the counting on HLO written by hand, the targets' specs, the
launches of a small PPO program compiled for the H200, exactly, and the planner
(ppojax.plan.plan) on one and two H100s.

The compiled tests need JAX's CUDA plugin (``pip install "ppojax[gpu-aot]"``) and skip
without it, unless ``PPOJAX_REQUIRE_GPU_AOT`` is set (CI sets it where it installed the
plugin, so that they cannot skip there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmark_script import run_benchmark

import ppojax
from ppojax.plan import PlanError, StepShape, plan
from ppojax.plan.estimate import step_flops
from ppojax.rlhf.models.config import parse_config
from ppojax.runtime import compiling, deviceless, kernels, launches

ROOT = Path(__file__).resolve().parents[1]

# 10 trips of a loop whose body launches an increment, an add and a copy and whose condition
# launches a compare; then a gemm in the entry
HAND_HLO = """HloModule hand, is_scheduled=true

%fused_add (p0: f32[4], p1: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  %p1 = f32[4]{0} parameter(1)
  ROOT %add = f32[4]{0} add(%p0, %p1)
}

%body (arg: (s32[], f32[4])) -> (s32[], f32[4]) {
  %arg = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%arg), index=0
  %x = f32[4]{0} get-tuple-element(%arg), index=1
  %next = s32[] fusion(%i), kind=kLoop, calls=%fused_increment
  %y = f32[4]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  %z = f32[4]{0} copy(%y)
  ROOT %t = (s32[], f32[4]{0}) tuple(%next, %z)
}

%cond (arg.1: (s32[], f32[4])) -> pred[] {
  %arg.1 = (s32[], f32[4]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%arg.1), index=0
  ROOT %lt = pred[] fusion(%i.1), kind=kLoop, calls=%fused_less
}

ENTRY %main (x.1: f32[4], w.1: bf16[4,8]) -> (f32[8], f32[4]) {
  %x.1 = f32[4]{0} parameter(0)
  %w.1 = bf16[4,8]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%zero, %x.1)
  %loop = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body, backend_config=TRIPS
  %out = f32[4]{0} get-tuple-element(%loop), index=1
  %mm = f32[8]{0} custom-call(%out, %w.1), custom_call_target="__cublas$gemm"
  ROOT %r = (f32[8]{0}, f32[4]{0}) tuple(%mm, %out)
}
""".replace("TRIPS", '{"known_trip_count":{"n":"10"}}')


def test_launches_and_bytes_of_hand_written_hlo():
    program = launches.count(HAND_HLO)
    # the gemm: reads f32[4] (16 B) and bf16[4,8] (64 B), writes f32[8] (32 B)
    assert [(launch.opcode, launch.bytes) for launch in program.launches] == [
        ("custom-call", 16 + 64 + 32)
    ]
    (loop,) = program.loops
    assert loop.trips == 10
    # increment s32 -> s32 (8 B), add of f32[4] twice -> f32[4] (48 B), copy (32 B), compare
    # s32 -> pred (5 B)
    assert [launch.bytes for launch in loop.launches] == [8, 48, 32, 5]
    assert loop.launches_per_trip() == 4 and loop.bytes_per_trip() == 93
    assert program.total_launches() == 1 + 10 * 4
    assert program.total_bytes() == 112 + 10 * 93
    assert program.by_opcode() == {"copy": 10, "custom-call": 1, "fusion": 30}


def test_a_fusion_counts_the_slices_it_reads_and_the_update_it_writes_in_place():
    """A rollout's store of one step into its [T, ...] buffer and GAE's read of one step: the
    GPU touches the slice, not the buffer."""
    hlo = """HloModule slices

%store (buffer: f32[128,64], index: s32[], row: f32[1,64]) -> f32[128,64] {
  %buffer = f32[128,64]{1,0} parameter(0)
  %row = f32[1,64]{1,0} parameter(2)
  %twice = f32[1,64]{1,0} add(%row, %row)
  %index = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %dus = f32[128,64]{1,0} dynamic-update-slice(%buffer, %twice, %index, %zero)
}

%load (table: f32[128,64], i: s32[], other: f32[64]) -> (f32[1,64], f32[64]) {
  %table = f32[128,64]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %slice = f32[1,64]{1,0} dynamic-slice(%table, %i, %z), dynamic_slice_sizes={1,64}
  %other = f32[64]{0} parameter(2)
  %neg = f32[64]{0} negate(%other)
  ROOT %pair = (f32[1,64]{1,0}, f32[64]{0}) tuple(%slice, %neg)
}

ENTRY %main (b: f32[128,64], k: s32[], r: f32[1,64], o: f32[64]) -> f32[128,64] {
  %b = f32[128,64]{1,0} parameter(0)
  %k = s32[] parameter(1)
  %r = f32[1,64]{1,0} parameter(2)
  %o = f32[64]{0} parameter(3)
  %stored = f32[128,64]{1,0} fusion(%b, %k, %r), kind=kLoop, calls=%store
  %loaded = (f32[1,64]{1,0}, f32[64]{0}) fusion(%b, %k, %o), kind=kLoop, calls=%load
  ROOT %done = f32[128,64]{1,0} copy(%stored)
}
"""
    program = launches.count(hlo)
    # store: index 4 B, row 256 B read, 256 B written; load: a 256 B slice, index 4 B and
    # 256 B read, 512 B written; the copy: 32 KiB read and written
    assert [launch.bytes for launch in program.launches] == [516, 1028, 2 * 128 * 64 * 4]


def test_a_custom_call_updating_an_operand_in_place_is_not_counted_written_whole():
    """The decode kernel's KV cache, aliased to its result (``output_to_operand_aliasing``):
    read (its operand), not written whole; its other result is."""
    hlo = """HloModule aliased

ENTRY %m (q: f32[4,16], c: f32[4,8,16]) -> (f32[4,16], f32[4,8,16]) {
  %q = f32[4,16]{1,0} parameter(0)
  %c = f32[4,8,16]{2,1,0} parameter(1)
  ROOT %k = (f32[4,16]{1,0}, f32[4,8,16]{2,1,0}) custom-call(%q, %c), ALIASED
}
""".replace("ALIASED", 'custom_call_target="k", output_to_operand_aliasing={{1}: (1, {})}')
    # q (256 B) and the cache (2 KiB) read, the output (256 B) written
    assert [launch.bytes for launch in launches.count(hlo).launches] == [256 + 2048 + 256]


def test_a_fusion_sees_through_bitcasts_to_an_in_place_update_and_counts_the_rows_it_gathers():
    """A sampling loop's KV cache, bitcast to the layout its attention reads and updated in
    place, writes one position; an embedding lookup reads the rows of its tokens, not the
    table."""
    hlo = """HloModule views

%store (cache: f32[4,8,2,16], row: f32[4,2,1,16], at: s32[]) -> f32[4,2,8,16] {
  %cache = f32[4,8,2,16]{3,1,2,0} parameter(0)
  %view = f32[4,2,8,16]{3,2,1,0} bitcast(%cache)
  %row = f32[4,2,1,16]{3,2,1,0} parameter(1)
  %at = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = f32[4,2,8,16]{3,2,1,0} dynamic-update-slice(%view, %row, %zero, %zero, %at, %zero)
}

%lookup (table: f32[100,16], ids: s32[4,1]) -> f32[4,16] {
  %table = f32[100,16]{1,0} parameter(0)
  %ids = s32[4,1]{1,0} parameter(1)
  ROOT %rows = f32[4,16]{1,0} gather(%table, %ids), offset_dims={1}, slice_sizes={1,16}
}

ENTRY %m (c: f32[4,8,2,16], r: f32[4,2,1,16], a: s32[], t: f32[100,16], i: s32[4,1]) -> f32[4,16] {
  %c = f32[4,8,2,16]{3,1,2,0} parameter(0)
  %r = f32[4,2,1,16]{3,2,1,0} parameter(1)
  %a = s32[] parameter(2)
  %t = f32[100,16]{1,0} parameter(3)
  %i = s32[4,1]{1,0} parameter(4)
  %stored = f32[4,2,8,16]{3,2,1,0} fusion(%c, %r, %a), kind=kLoop, calls=%store
  ROOT %looked = f32[4,16]{1,0} fusion(%t, %i), kind=kLoop, calls=%lookup
}
"""
    # store: the row (512 B) and the index (4 B) read, the row written; lookup: 4 rows of 16
    # floats read (256 B), the 16 B of ids, the 256 B result written
    assert [launch.bytes for launch in launches.count(hlo).launches] == [1028, 528]


def test_calls_are_inlined_a_conditional_counts_its_largest_branch_and_unknown_trips_once():
    hlo = """HloModule more

%small (a: f32[2]) -> f32[2] {
  %a = f32[2]{0} parameter(0)
  ROOT %f = f32[2]{0} fusion(%a), kind=kLoop, calls=%x
}

%large (b: f32[2]) -> f32[2] {
  %b = f32[2]{0} parameter(0)
  %g = f32[2]{0} fusion(%b), kind=kLoop, calls=%x
  ROOT %h = f32[2]{0} copy(%g)
}

%called (c: f32[2]) -> f32[2] {
  %c = f32[2]{0} parameter(0)
  ROOT %k = f32[2]{0} fusion(%c), kind=kLoop, calls=%x
}

%body (d: f32[2]) -> f32[2] {
  %d = f32[2]{0} parameter(0)
  ROOT %m = f32[2]{0} fusion(%d), kind=kLoop, calls=%x
}

%cond (e: f32[2]) -> pred[] {
  %e = f32[2]{0} parameter(0)
  ROOT %n = pred[] fusion(%e), kind=kLoop, calls=%x
}

ENTRY %main (p: s32[], q: f32[2]) -> f32[2] {
  %p = s32[] parameter(0)
  %q = f32[2]{0} parameter(1)
  %branch = f32[2]{0} conditional(%p, %q, %q), branch_computations={%small, %large}
  %called.1 = f32[2]{0} call(%branch), to_apply=%called
  ROOT %loop = f32[2]{0} while(%called.1), condition=%cond, body=%body
}
"""
    program = launches.count(hlo)
    assert [launch.name for launch in program.launches] == ["g", "h", "k"]
    (loop,) = program.loops
    assert loop.trips is None
    assert [launch.name for launch in loop.launches] == ["m", "n"]
    assert program.total_launches() == 3 + 2  # the unknown loop once


def test_shape_bytes_and_operands():
    assert launches.shape_bytes("f32[8,16]{1,0}") == 512
    assert launches.shape_bytes("(s32[], bf16[3]{0}, pred[2,2]{1,0})") == 4 + 6 + 4
    assert launches.shape_bytes("token[]") == 0
    assert launches.operand_names("%a, %b.1), kind=kLoop, calls=%c") == ["a", "b.1"]
    assert launches.operand_names("f32[2]{0} %a, s32[] %b), x=1") == ["a", "b"]
    assert launches.operand_names("), kind=kLoop") == []


def block(name: str, trips: int, own: int, loops: list | None = None) -> launches.Block:
    """A block whose own launches move 10 bytes each."""
    own_launches = [launches.Launch(f"{name}{i}", "fusion", 10) for i in range(own)]
    return launches.Block(name, trips, own_launches, loops or [])


def test_ppo_phases_name_the_loops_by_their_trips_and_order():
    minibatch = block("minibatch", 2, 7)
    epochs = block("epochs", 3, 1, [minibatch])
    update = block("update", 5, 4, [block("rollout", 8, 3), block("gae", 8, 2), epochs])
    program = block("main", 1, 6, [block("init", 64, 1), update])
    phases = launches.ppo_phases(program, updates=5, num_steps=8, epochs=3, minibatches=2)
    assert phases["per_env_step"]["launches"] == 3
    assert phases["rollout"]["launches"] == 24
    assert phases["gae"] == {"loops": [8], "launches": 16, "bytes": 160}
    assert phases["per_minibatch_step"]["launches"] == 7
    assert phases["epochs"]["launches"] == 3 * (1 + 2 * 7)
    assert phases["per_update"]["launches"] == 4 + 24 + 16 + 45
    assert phases["rest"] == {"launches": 4, "bytes": 40}
    assert phases["whole_program"]["launches"] == 6 + 64 + 5 * 89
    # epochs and minibatches as one loop of epochs x minibatches trips
    flat = block("update", 5, 0, [block("rollout", 8, 3), block("steps", 6, 7)])
    phases = launches.ppo_phases(block("main", 1, 0, [flat]), 5, 8, 3, 2)
    assert phases["per_minibatch_step"]["launches"] == 7
    assert phases["gae"]["loops"] == []
    # a rollout in 2 chunks of 4 steps, 1 launch a chunk besides its steps' 3
    chunked = block("update", 5, 0, [block("chunks", 2, 1, [block("rollout", 4, 3)]), epochs])
    phases = launches.ppo_phases(block("main", 1, 0, [chunked]), 5, 8, 3, 2)
    assert phases["rollout"]["launches"] == 2 * (1 + 4 * 3)
    assert phases["per_env_step"]["launches"] == 26 / 8
    # 4 steps unrolled a trip: 2 trips of 12 launches, then GAE's loop of 8 trips
    unrolled = block("update", 5, 0, [block("rollout", 2, 12), block("gae", 8, 2), epochs])
    phases = launches.ppo_phases(block("main", 1, 0, [unrolled]), 5, 8, 3, 2)
    assert phases["rollout"]["launches"] == 24 and phases["per_env_step"]["launches"] == 3
    assert phases["gae"]["loops"] == [8]
    with pytest.raises(ValueError, match="no loop of 4 updates"):
        launches.ppo_phases(program, updates=4, num_steps=8, epochs=3, minibatches=2)


def test_spec_files_unknown_targets_and_newer_fields():
    assert 'name: "NVIDIA H200 141GB HBM3e"' in deviceless.spec_text("h200")
    h100 = deviceless.spec_text("h100")
    assert 'device_description_str: "NVIDIA H100 80GB HBM3 (deviceless)"' in h100
    assert "memory_bandwidth: 3352320000000" in h100
    with pytest.raises(deviceless.DevicelessError, match="known targets: h100, h200"):
        deviceless.spec_text("b200")
    stripped = deviceless.without_newer_fields(deviceless.spec_text("h200"))
    assert "collective_memory_granularity" not in stripped
    removed = set(deviceless.spec_text("h200").splitlines()) - set(stripped.splitlines())
    assert removed == {"  collective_memory_granularity: 2097152"}


def test_no_plugin_names_the_extra(monkeypatch):
    monkeypatch.setattr(deviceless, "plugin_installed", lambda: False)
    with pytest.raises(deviceless.DevicelessError, match=r"ppojax\[gpu-aot\]"):
        deviceless.compile_for(jnp.sin, (jnp.ones(3),), "h200")


def needs_plugin() -> None:
    if deviceless.plugin_installed():
        return
    if os.environ.get("PPOJAX_REQUIRE_GPU_AOT"):
        pytest.fail("PPOJAX_REQUIRE_GPU_AOT is set and JAX's CUDA plugin is not installed")
    pytest.skip('JAX\'s CUDA plugin is not installed (pip install "ppojax[gpu-aot]")')


def test_train_prints_nothing_of_the_plugin_on_a_machine_without_a_gpu(tmp_path):
    """Without JAX_PLATFORMS, the CUDA plugin installed and no GPU, ``ppojax train`` runs on
    the CPU without the plugin's "Unable to load cuDNN" traceback."""
    needs_plugin()
    if compiling.accelerator_present():
        pytest.skip("an accelerator's device node exists: JAX may start its plugin here")
    env = {name: value for name, value in os.environ.items() if name != "JAX_PLATFORMS"}
    tiny = ["--num-envs", "4", "--num-steps", "8", "--total-timesteps", "64"]
    tiny += ["--update-epochs", "1", "--num-minibatches", "1", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "ppojax", "train", "CartPole-v1", *tiny, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "final return" in done.stdout
    for printed in ("plugin configuration error", "Traceback", "cuDNN"):
        assert printed not in done.stderr, done.stderr


@pytest.mark.parametrize("target", ["h200", "h100"])
def test_a_sort_and_a_loop_compile_for_each_target(target):
    """The H100 spec as published fails on a sort ("invalid device ordinal"); renamed, it
    compiles, as the H200's does."""
    needs_plugin()

    def f(x: jax.Array) -> jax.Array:
        return jnp.sort(jax.lax.fori_loop(0, 7, lambda i, c: jnp.sin(c) * 2.0, x))

    compiled = deviceless.compile_for(f, (jax.ShapeDtypeStruct((1024,), jnp.float32),), target)
    program = launches.count(compiled.as_text())
    assert [loop.trips for loop in program.walk()[1:]] == [7]
    assert "sort(" in compiled.as_text()


# The small PPO program's launches on the H200 target per jax version (counted with
# ppojax.runtime.launches; a change that splits or merges a fusion changes them), by default
# (ppojax.runtime.kernels.CUDA_DEFAULTS: the loss in one Triton kernel per minibatch step,
# kernels.STEPS_PER_TRIP env steps a trip of the rollout's loop, so 32 steps make 2 trips)
# and with the CUDA defaults turned off
SMALL_CONFIG = dict(
    env_id="CartPole-v1",
    num_envs=4,
    num_steps=32,
    total_timesteps=4 * 32 * 3,
    update_epochs=2,
    num_minibatches=2,
)
EXPECTED = {
    "0.10.2": {"per_env_step": 5.875, "per_minibatch_step": 34},  # Python 3.11's jax
    "0.11.2": {"per_env_step": 5.75, "per_minibatch_step": 38},  # Python 3.12's and 3.13's
}
EXPECTED_PLAIN = {
    "0.10.2": {"per_env_step": 17, "per_minibatch_step": 59},
    "0.11.2": {"per_env_step": 20, "per_minibatch_step": 60},
}


def small_program_phases() -> dict:
    config = ppojax.PPOConfig(**SMALL_CONFIG)
    keys = jax.random.split(jax.random.key(0), 1)
    program = jax.vmap(ppojax.train, in_axes=(None, 0))  # a new function: traced again
    compiled = deviceless.compile_for(program, (config, keys), "h200")
    return launches.ppo_phases(launches.count(compiled.as_text()), 3, 32, 2, 2)


@pytest.mark.parametrize("cuda_defaults", [True, False])
def test_small_ppo_program_launches_on_the_h200(cuda_defaults):
    needs_plugin()
    if jax.__version__ not in EXPECTED:
        pytest.fail(f"no launch counts recorded for jax {jax.__version__}: count them and add")
    if cuda_defaults:
        phases, expected = small_program_phases(), EXPECTED[jax.__version__]
    else:
        with kernels.plain(*kernels.CUDA_DEFAULTS):
            phases = small_program_phases()
        expected = EXPECTED_PLAIN[jax.__version__]
    counted = {part: phases[part]["launches"] for part in expected}
    assert counted == expected
    steps_per_trip = kernels.STEPS_PER_TRIP if cuda_defaults else 1
    assert phases["rollout"]["trips"] == 32 // steps_per_trip and phases["epochs"]["trips"] == 2
    # by default the loss and its gradient are one Triton custom call per minibatch step
    custom_calls = phases["per_minibatch_step"]["by_opcode"].get("custom-call", 0)
    assert custom_calls == (1 if cuda_defaults else 0)


def test_the_readme_table_is_the_one_gpu_program_py_makes_from_the_result_file(tmp_path):
    """The README's counts are generated, never typed: they equal what
    ``python benchmarks/gpu_program.py --readme README.md`` writes from gpu_program.json, and
    the file holds the four works for the three programs on both targets."""
    copy = tmp_path / "README.md"
    copy.write_text((ROOT / "README.md").read_text())
    run_benchmark("gpu_program", "--readme", str(copy))
    assert copy.read_text() == (ROOT / "README.md").read_text(), (
        "run python benchmarks/gpu_program.py --readme README.md"
    )
    report = json.loads((ROOT / "benchmarks" / "results" / "gpu_program.json").read_text())
    counted = {(row["program"], row["work"], row["target"]) for row in report["rows"]}
    works = ("1 agent x 4 envs", "1 agent x 8192 envs", "1 agent x 65536 envs")
    works += ("2048 agents x 4 envs",)
    assert counted == {
        (program, work, target)
        for program in ("ppojax", "rejax", "purejaxrl")
        for work in works
        for target in deviceless.TARGETS
    }
    assert not [row for row in report["rows"] if "error" in row]


FAKE_PPO = """import sys

import gymnax
from wrappers import SIBLING


def make_train(config):
    env, _ = gymnax.make(config["ENV_NAME"])
    on_path = any(entry.endswith("purejaxrl") for entry in sys.path)
    raise RuntimeError(f"loaded {SIBLING} {type(env).__name__} on_path={on_path}")
"""


def test_purejaxrl_s_ppo_py_loads_by_path_with_its_sibling_and_the_five_value_step(tmp_path):
    """``--purejaxrl DIR``: DIR/purejaxrl/ppo.py is loaded from its file, finds its sibling
    wrappers.py by the name it imports it by, and its ``gymnax.make`` gives gymnax's legacy
    step; the checkout's folder never goes on sys.path. (Its ``make_train`` here fails on
    purpose, before any compile: the row records the error, so no CUDA plugin is needed.)"""
    source = tmp_path / "checkout" / "purejaxrl"
    source.mkdir(parents=True)
    (source / "wrappers.py").write_text('SIBLING = "wrappers.py"\n')
    (source / "ppo.py").write_text(FAKE_PPO)
    out = tmp_path / "gpu_program.json"
    args = ["--purejaxrl", str(tmp_path / "checkout"), "--programs", "purejaxrl", "--smoke"]
    args += ["--targets", "h200", "--works", "1 agent x 4 envs", "--out", str(out)]
    done = run_benchmark("gpu_program", *args, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["error"] == "RuntimeError: loaded wrappers.py LegacyStep on_path=False"


# A Qwen2-shaped model of one layer whose embedding (1024 x 16 = 16Ki elements) is the one
# leaf large enough for FSDP to split
TINY_QWEN2 = {
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


def test_on_two_h100s_the_sharded_leaves_halve_and_three_cannot_split_them():
    needs_plugin()
    config = parse_config(TINY_QWEN2)
    one, two = plan(config, GRPO, "h100", 1), plan(config, GRPO, "h100", 2)
    # only the embedding (1024 x 16 = 16Ki elements) is large enough to be split
    embedding = 1024 * 16 * 4
    assert one.memory.parameters - two.memory.parameters == embedding // 2
    assert one.memory.optimizer - two.memory.optimizer == embedding
    assert one.device_memory == 84942979072  # the spec's device_memory_size
    for found in (one, two):
        e = found.estimate
        assert e.compute == pytest.approx(step_flops(config, GRPO) / found.devices / 495e12)
        # the collectives' bytes at NVLink's 450 GB/s, the rest at HBM's, launches at 2 us
        collective = e.collectives * 450e9
        assert (collective > 0) == (found.devices > 1)  # the FSDP gathers of two devices
        assert e.memory == pytest.approx((found.bytes_moved - collective) / 3.35232e12)
        assert e.launches == pytest.approx(found.launches * 2e-6) and found.launches > 0
        assert e.step == pytest.approx(max(e.compute, e.memory, e.launches) + e.collectives)
    # decoding per token: the sampling loop (one trip a response token) divided by its trips,
    # against the weights read once (18,768 float32 parameters: the 1024 x 16 embedding, one
    # layer's 2,368, the final norm's 16) and the KV cache read once (4 rows x 7 positions x
    # keys and values of 1 head x 8, float32)
    decode = next(loop for loop in one.loops if loop.trips == GRPO.response_len)
    d = one.decoding
    assert (d.launches, d.bytes) == (decode.launches / 3, decode.bytes / 3) and d.layers == 1
    assert d.minimum == 18768 * 4 + 4 * 7 * 2 * 8 * 4
    # on two devices each reads every weight (gathered) and half the rows' cache
    assert two.decoding.minimum == 18768 * 4 + 4 * 7 * 2 * 8 * 4 / 2
    assert "decoding, per token" in one.report()
    with pytest.raises(PlanError, match="--devices 3: tensor .*embed.* of shape \\(1024, 16\\)"):
        plan(config, replace(GRPO, prompts=3, num_minibatches=3), "h100", 3)


def test_on_two_h100s_a_decoded_token_s_attention_kernel_runs_on_each_device_s_rows():
    """TINY_QWEN2 with heads of 32 (64 wide), whose decoded token's attention the Pallas
    kernel takes ("pallas_decode_attention", a CUDA default): split over two H100s it runs on
    each device's rows (shard_map), where XLA's partitioner would gather the cache whole for
    it. Measured on jax 0.10.2: 34 launches and 1,816,753 bytes a token against the plain
    form's 38 and 1,822,561 (the attention alone in the kernel: 36 and 1,819,869; without
    shard_map: 39 and 1,997,665), the collectives the same."""
    needs_plugin()
    config = parse_config({**TINY_QWEN2, "hidden_size": 64, "intermediate_size": 64})
    step = replace(GRPO, prompts=4, response_len=12)  # a cache of 16 positions
    kernel = plan(config, step, "h100", 2)
    with kernels.plain("pallas_decode_attention"):
        plain_ = plan(config, step, "h100", 2)
    assert kernel.decoding.launches < plain_.decoding.launches
    # The cache gathered whole onto each device for the kernel cost 9.6% more bytes a token
    # (1,997,665 against 1,822,561 on jax 0.10.2), and its all-gather over 12 tokens would add
    # about a quarter to the step's collectives; 1% admits what a jax version moves besides
    # around the kernel (jax 0.11.2: 1,030,225 bytes against the plain 1,029,889, and 0.28%
    # more in collectives; jax 0.10.2: fewer bytes, the same collectives).
    assert kernel.decoding.bytes <= 1.01 * plain_.decoding.bytes
    assert kernel.estimate.collectives <= 1.01 * plain_.estimate.collectives


def test_on_two_h100s_replicated_sampling_decodes_with_no_collective_where_fsdp_gathers():
    """The sampling copy resharded once a step (``sharding.SAMPLE_LAYOUTS``): replicated,
    each device decodes its own rows and a decoded token moves no byte between devices;
    under the training layout ("fsdp") it gathers the split embedding again every token."""
    needs_plugin()
    config = parse_config(TINY_QWEN2)
    replicated = plan(config, replace(GRPO, sample_layout="replicated"), "h100", 2)
    fsdp = plan(config, replace(GRPO, sample_layout="fsdp"), "h100", 2)
    assert replicated.decoding.collective_bytes == 0
    # at least the embedding's missing half gathered a token (1024 x 16 float32 / 2)
    assert fsdp.decoding.collective_bytes >= 1024 * 16 * 4 / 2
    assert replicated.decoding.minimum == fsdp.decoding.minimum  # both read every weight
    # "auto" replicates what fits, and says so
    auto = plan(config, GRPO, "h100", 2)
    assert auto.step.sample_layout == "replicated" and auto.decoding.collective_bytes == 0
    assert "collectives per decoded token: 0 B (replicated" in auto.report()
    tensor = plan(config, replace(GRPO, sample_layout="tensor"), "h100", 2)
    assert tensor.decoding.minimum < replicated.decoding.minimum  # half the weights a device


def all_gathered(hlo: str) -> list[tuple[str, int]]:
    """(dtype, elements) of every array an all-gather of ``hlo`` produces."""
    import re

    found = []
    for line in hlo.splitlines():
        head = re.search(r"= (.*?) all-gather(?:-start)?\(", line)
        if head is None:
            continue
        arrays = re.findall(r"([a-z]+\d*)\[([\d,]*)\]", head.group(1))
        for dtype, dims in arrays[len(arrays) // 2 :] if "-start" in line else arrays:
            found.append((dtype, int(np.prod([int(d) for d in dims.split(",") if d]))))
    return found


def test_a_bf16_step_on_two_h100s_gathers_the_bf16_copy_never_the_float32_masters():
    """FSDP's gathers move the compute copy: the masters are cast on their shards, then
    gathered where a layer uses them; the gradients' global norm is reduced per leaf (a
    concatenation of the split leaves gathered every float32 gradient whole)."""
    needs_plugin()
    from ppojax.plan.planner import compile_program, program, target_mesh

    config = parse_config(TINY_QWEN2)
    step = replace(GRPO, dtype="bfloat16", sample_layout="fsdp")
    mesh = target_mesh("h100", 2)
    hlo = compile_program(program(config, step, mesh), "h100", mesh).as_text()
    gathered = all_gathered(hlo)
    embedding = 1024 * 16  # the one leaf split (TINY_QWEN2)
    assert ("bf16", embedding) in gathered
    assert not [(dtype, n) for dtype, n in gathered if dtype == "f32" and n >= embedding]


# One decoded token of the built-in transformer (2 layers, 64 wide, 4 heads, vocab 256, float32)
# for 4 rows of 8 prompt + 8 response positions on the H100 target, per jax version: one trip
# of the sampling loop (ppojax.rlhf.models.decode_cost), counted exactly, since the same jax
# compiles the same program; a change to the decoder that splits or merges a fusion, or moves
# more bytes a token, changes them. The default program (CUDA's defaults in, a decoded token's
# attention one Pallas kernel a layer: "pallas_decode_attention") and the plain one.
DECODE_EXPECTED = {
    "0.10.2": {"launches": 38, "bytes": 650613},  # Python 3.11's jax
}
DECODE_PLAIN_EXPECTED = {
    "0.10.2": {"launches": 47, "bytes": 730941},  # Python 3.11's jax
    "0.11.2": {"launches": 48, "bytes": 731741},  # Python 3.12's and 3.13's
}


def test_decoding_a_token_of_the_small_transformer_launches_and_bytes_on_the_h100():
    needs_plugin()
    from ppojax.rlhf.models.decode_cost import decode_cost
    from ppojax.rlhf.models.transformer import builtin_config

    if jax.__version__ not in DECODE_PLAIN_EXPECTED:
        pytest.fail(f"no decode counts recorded for jax {jax.__version__}: count them and add")
    config = builtin_config(256, 64, 64, 4, 2)
    shape = {"rows": 4, "prompt_len": 8, "response_len": 8, "target": "h100"}
    cost = decode_cost(config, "float32", **shape)
    with kernels.plain("pallas_decode_attention"):
        plain = decode_cost(config, "float32", **shape)
    assert {"launches": plain.launches, "bytes": plain.bytes} == DECODE_PLAIN_EXPECTED[
        jax.__version__
    ]
    if jax.__version__ in DECODE_EXPECTED:
        assert {"launches": cost.launches, "bytes": cost.bytes} == DECODE_EXPECTED[jax.__version__]
    # the kernel takes a layer's scores, softmax (max, sum, division) and weighted values, and
    # writes the token's keys and values into the cache: at least 2 launches a layer fewer
    # (jax 0.10.2: 47 -> 38), the [rows, heads, 16] scores and weights no longer written and
    # read back
    assert cost.launches <= plain.launches - 2 * 2 and cost.bytes < plain.bytes
    # the minimum: 136,832 float32 parameters (embeddings 256 x 64 and 64 x 64; a layer's two
    # LayerNorms 2 x 128, c_attn 64 x 192, c_proj 64 x 64 + 64, c_fc 64 x 256 + 256, the MLP's
    # c_proj 256 x 64 + 64; the final LayerNorm 128; lm_head 64 x 256 + 256) and the cache's
    # 4 rows x 16 positions x 2 layers x keys and values of 4 heads x 16
    layer = 2 * 128 + 64 * 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64
    assert cost.weights == (256 * 64 + 64 * 64 + 2 * layer + 128 + 64 * 256 + 256) * 4
    assert cost.cache == 4 * 16 * 2 * 2 * 4 * 16 * 4
    assert cost.launches_per_layer == cost.launches / 2


def test_the_decode_table_is_the_one_decode_program_py_prints_from_the_result_file():
    """benchmarks/README.md's per-token table is generated from decode_program.json, never
    typed, and the file holds a row of every model, each without an error."""
    printed = run_benchmark("decode_program", "--table").stdout
    assert printed.strip() in (ROOT / "benchmarks" / "README.md").read_text()
    report = json.loads((ROOT / "benchmarks" / "results" / "decode_program.json").read_text())
    assert {row["model"] for row in report["rows"]} >= {"builtin", "qwen2.5-0.5b", "qwen2.5-7b"}
    assert not [row for row in report["rows"] if "error" in row]
    assert "without autotuning" in report["note"]
