"""ppojax.runtime.launches' small readings of a compiled module's text: the kernels of the
entry and its loops, not what runs fused or is never called; and a program's size."""

import jax
import jax.numpy as jnp

from ppojax.runtime.launches import kernel_count, program_size

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


def test_kernel_count_counts_the_entry_and_its_loops_not_fused_or_unused_code():
    # entry: copy, custom-call (the while is control flow, no kernel); the loop's body and
    # condition: dot, fusion, compare; not the tanh inside the fusion, nor the computation no
    # one calls
    assert kernel_count(HLO) == {"compare": 1, "copy": 1, "custom-call": 1, "dot": 1, "fusion": 1}


class Compiled:
    """The one method of jax.stages.Compiled that program_size reads."""

    def __init__(self, text: str) -> None:
        self.text = text

    def as_text(self) -> str:
        return self.text


def test_program_size_counts_fusions_and_lines():
    # one fusion instruction (the fused computation's header is no call of it); 32 lines
    assert program_size(Compiled(HLO)) == {"fusions": 1, "instructions": 32}


def test_a_loop_of_a_real_program_is_counted_once_per_trip():
    def loop(x):
        return jax.lax.fori_loop(0, 100, lambda i, y: jnp.tanh(y @ y), x)

    compiled = jax.jit(loop).lower(jnp.ones((8, 8))).compile()
    counts = kernel_count(compiled.as_text())
    # the loop's body's few kernels count once, not once per trip (100)
    assert "while" not in counts
    assert 1 < sum(counts.values()) < 20
