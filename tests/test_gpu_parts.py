"""benchmarks/gpu_parts.py: the kernel count reads a compiled module as intended, and a
candidate pair compares two programs that train alike."""

import sys
from pathlib import Path

import pytest
from tolerance import EPS, TRAINING_ULPS

ROOT = Path(__file__).resolve().parent.parent

# the shape of XLA's compiled text (jax 0.10): computations, then ENTRY; a while loop's body
HLO = """HloModule jit_f, is_scheduled=true, entry_computation_layout={(f32[4,4]{1,0})->f32[]}

%fused_computation (param_0.1: f32[4,4]) -> f32[4,4] {
  %param_0.1 = f32[4,4]{1,0} parameter(0)
  ROOT %tanh.2 = f32[4,4]{1,0} tanh(%param_0.1)
}

%body (arg_tuple.1: (s32[], f32[4,4])) -> (s32[], f32[4,4]) {
  %arg_tuple.1 = (s32[], f32[4,4]{1,0}) parameter(0)
  %get-tuple-element.5 = f32[4,4]{1,0} get-tuple-element(%arg_tuple.1), index=1
  %dot.0 = f32[4,4]{1,0} dot(%get-tuple-element.5, %get-tuple-element.5), lhs_contracting_dims={1}
  %fusion.1 = f32[4,4]{1,0} fusion(%dot.0), kind=kLoop, calls=%fused_computation
  ROOT %tuple.1 = (s32[], f32[4,4]{1,0}) tuple(%get-tuple-element.5, %fusion.1)
}

%cond (arg_tuple.2: (s32[], f32[4,4])) -> pred[] {
  %arg_tuple.2 = (s32[], f32[4,4]{1,0}) parameter(0)
  ROOT %compare.1 = pred[] compare(%arg_tuple.2, %arg_tuple.2), direction=LT
}

%unused (p: f32[]) -> f32[] {
  ROOT %p = f32[] negate(%p)
}

ENTRY %main.3 (x.1: f32[4,4]) -> f32[] {
  %x.1 = f32[4,4]{1,0} parameter(0)
  %constant.2 = s32[] constant(0)
  %tuple.2 = (s32[], f32[4,4]{1,0}) tuple(%constant.2, %x.1)
  %while.0 = (s32[], f32[4,4]{1,0}) while(%tuple.2), condition=%cond, body=%body
  %copy.3 = f32[4,4]{1,0} copy(%x.1)
  ROOT %custom-call.1 = f32[] custom-call(%copy.3), custom_call_target="__cublas$gemm"
}
"""


@pytest.fixture(scope="module")
def gpu_parts():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_parts imports its sibling gpu.py
    try:
        import gpu_parts

        yield gpu_parts
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_kernel_count_counts_the_entry_and_its_loops_not_fused_or_unused_code(gpu_parts):
    # entry: while, copy, custom-call; the loop's body and condition: dot, fusion, compare;
    # not the tanh inside the fusion, nor the computation no one calls
    assert gpu_parts.kernel_count(HLO) == {
        "compare": 1,
        "copy": 1,
        "custom-call": 1,
        "dot": 1,
        "fusion": 1,
        "while": 1,
    }


def test_a_candidate_pair_times_two_programs_that_train_alike(gpu_parts):
    pair = gpu_parts.candidate_pair(4, 2, ("gather_once",), pairs=1)
    # gather_once trains as the plain program: parameters of order 1 within TRAINING_ULPS
    # (float32 ulps that two differently fused programs may accumulate over a few Adam steps)
    assert pair["largest_parameter_difference"] <= TRAINING_ULPS * EPS
    assert pair["plain_steps_per_s"] > 0 and pair["candidate_steps_per_s"] > 0
    ratio = pair["candidate_steps_per_s"] / pair["plain_steps_per_s"]
    assert pair["candidate_over_plain"] == pytest.approx(ratio, abs=1e-3)


def test_a_minibatch_step_row_traces_the_step_with_the_candidate(gpu_parts, monkeypatch):
    traced = []
    real = gpu_parts.ppo_loss_function

    def recording(agent, config, kl_coef):
        tile = (pallas_ppo.BLOCK_ROWS, pallas_ppo.BLOCKS_PER_PROGRAM, pallas_ppo.NUM_WARPS)
        traced.append((gpu_parts.kernels.stand_in("pallas_ppo_loss"), tile))
        return real(agent, config, kl_coef)

    pallas_ppo = gpu_parts.pallas_ppo
    shipped = (pallas_ppo.BLOCK_ROWS, pallas_ppo.BLOCKS_PER_PROGRAM, pallas_ppo.NUM_WARPS)
    monkeypatch.setattr(gpu_parts, "ppo_loss_function", recording)
    plain = gpu_parts.minibatch_step(16, repeats=1)
    pallas = gpu_parts.minibatch_step(16, 1, ("pallas_ppo_loss",), (16, 2, 8))
    # the candidate and the tile are on while the step is traced, then off
    assert traced == [(False, shipped), (True, (16, 2, 8))]
    assert not gpu_parts.kernels.stand_in("pallas_ppo_loss")
    assert (pallas_ppo.BLOCK_ROWS, pallas_ppo.BLOCKS_PER_PROGRAM, pallas_ppo.NUM_WARPS) == shipped
    assert (plain["candidates"], pallas["candidates"]) == ([], ["pallas_ppo_loss"])
    assert (plain["tile"], pallas["tile"]) == (None, [16, 2, 8])
    assert "pallas_ppo_loss" in pallas["name"] and pallas["kernels"] > 0


def test_the_bfloat16_pair_turns_no_kernels_candidate_on(gpu_parts, monkeypatch):
    traced = []
    real = gpu_parts.ppojax.train

    def recording(config, key):
        traced.append([gpu_parts.kernels.stand_in(n) for n in gpu_parts.kernels.CANDIDATES])
        return real(config, key)

    monkeypatch.setattr(gpu_parts.ppojax, "train", recording)
    gpu_parts.PLAIN_PROGRAMS.clear()
    gpu_parts.candidate_pair(4, 2, (gpu_parts.BFLOAT16,), pairs=1)
    assert traced and not any(any(flags) for flags in traced)
