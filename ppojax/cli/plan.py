"""``ppojax plan``: size a post-training step on a target before renting it.

    ppojax plan --model qwen2.5-0.5b --algorithm grpo --prompts 8 --group-size 8 \\
        --prompt-len 512 --response-len 1024 --target h100 --devices 1 --search

``--model`` is a config.json, a model folder holding one, or a built-in shape
(``ppojax.rlhf.models.shapes.PUBLISHED``). The h100 and h200 targets compile XLA's CUDA
program on this machine (``pip install "ppojax[gpu-aot]"``); v5e, v6e and v5p compile libtpu's
for a TPU slice (``pip install "ppojax[tpu-aot]"``), ``--devices`` counting chips (v5e-8 and
v6e-8 are 8 chips, v5p-8 is 4); ``cpu`` compiles for this process's CPU devices. Prints
bytes per device by part, launches, a step-time estimate and the verdict (against the memory
a training command's process gets, ``memory_fraction``) and, when it does not fit, the flags
to try; ``--json FILE`` writes them too. Exit status 1 when the
step does not fit, 2 on a bad flag or config.json value (checked before the compile).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ppojax.cli.values import Parser, parse_bool, parse_float, parse_int

STEP_FLAGS = (
    "algorithm",
    "prompts",
    "group_size",
    "prompt_len",
    "response_len",
    "lora_rank",
    "dtype",
    "update_epochs",
    "num_minibatches",
    "logit_chunk",
)


def build_parser() -> Parser:
    from ppojax.plan.planner import ALGORITHMS, DTYPES, StepShape
    from ppojax.rlhf.core.sharding import SAMPLE_LAYOUTS

    default = StepShape()
    parser = Parser(prog="ppojax plan", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", required=True, help="config.json, a model folder or a built-in shape"
    )
    parser.add_argument("--algorithm", choices=ALGORITHMS, default=default.algorithm)
    parser.add_argument("--dtype", choices=DTYPES, default=default.dtype)
    parser.add_argument(
        "--sample-layout",
        choices=SAMPLE_LAYOUTS,
        default=default.sample_layout,
        help="how sampling lays out the policy (ppojax rlhf's flag): replicated, tensor, fsdp "
        "(the training layout) or auto (replicated where its peak fits, else tensor)",
    )
    for name in STEP_FLAGS:
        if name not in ("algorithm", "dtype"):
            parser.add_argument(
                "--" + name.replace("_", "-"),
                type=parse_int,
                default=getattr(default, name),
                help=f"({getattr(default, name)})",
            )
    parser.add_argument(
        "--lora-targets",
        default=",".join(default.lora_targets),
        help=f"layers with adapters ({','.join(default.lora_targets)})",
    )
    parser.add_argument(
        "--remat-layers",
        action="store_true",
        help="rematerialize each decoder layer in the loss (RLHFConfig.remat_layers)",
    )
    parser.add_argument(
        "--master-weights",
        type=parse_bool,
        default=True,
        help="float32 params and Adam moments under --dtype bfloat16, as the commands keep "
        "them (true); false: the bf16-only state, which loses small updates",
    )
    parser.add_argument("--target", default="h100", help="h100, h200, v5e, v6e, v5p or cpu (h100)")
    parser.add_argument(
        "--devices",
        type=parse_int,
        default=1,
        help="GPUs or TPU chips in one FSDP mesh (1); v5e-8 and v6e-8 are 8 chips, v5p-8 is 4",
    )
    parser.add_argument(
        "--memory-gib", type=parse_float, help="memory per device, > 0 (the spec's)"
    )
    parser.add_argument(
        "--headroom",
        type=parse_float,
        help="share of the memory kept free, in [0, 1) (0.1: a training command preallocates "
        "0.9 of it, or XLA_PYTHON_CLIENT_MEM_FRACTION where that is set)",
    )
    parser.add_argument(
        "--search",
        action="store_true",
        help="find the largest --prompts and, for a step that does not fit, compile each "
        "lever that could make it fit",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the plan as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError, RuntimeError) as error:
        sys.stderr.write(f"ppojax plan: error: {error}\n")
        return 2


def check_flags(args) -> None:
    """The memory flags and a TPU target's slice and libtpu, checked before anything compiles
    (a compile takes minutes)."""
    from ppojax.plan.planner import PlanError, check_count, tpu_mesh
    from ppojax.plan.sizing import is_number
    from ppojax.plan.targets import TPU_TARGETS

    if args.target.lower() in TPU_TARGETS:
        check_count("devices", args.devices)
        tpu_mesh(args.target.lower(), args.devices)

    if args.memory_gib is not None and not (is_number(args.memory_gib) and args.memory_gib > 0):
        raise PlanError(
            f"--memory-gib must be a number > 0 (GiB per device), got {args.memory_gib}"
        )
    if args.headroom is not None and not (is_number(args.headroom) and 0 <= args.headroom < 1):
        raise PlanError(
            f"--headroom must be in [0, 1) (the share of memory kept free), got {args.headroom}"
        )


def run(args) -> int:
    import jax

    from ppojax.plan.planner import StepShape
    from ppojax.plan.sizing import GIB, plan

    check_flags(args)

    # the plan runs no device: JAX must not try to start a GPU (the CUDA plugin is only the
    # compiler here), and a cpu plan wants the CPU devices it names
    jax.config.update("jax_platforms", "cpu")
    if args.target == "cpu" and args.devices > 1:
        from ppojax.runtime.compiling import use_cpu_devices

        use_cpu_devices(args.devices)
    step = StepShape(
        **{name: getattr(args, name) for name in STEP_FLAGS},
        lora_targets=tuple(part for part in args.lora_targets.split(",") if part),
        remat_layers=args.remat_layers,
        master_weights=args.master_weights,
        sample_layout=args.sample_layout,
    )
    memory = None if args.memory_gib is None else int(args.memory_gib * GIB)
    found = plan(
        args.model,
        step,
        args.target.lower(),
        args.devices,
        device_memory=memory,
        headroom=args.headroom,
        search=args.search,
    )
    print(found.report())
    if args.json is not None:
        args.json.write_text(json.dumps(found.to_dict(), indent=2) + "\n")
    return 0 if found.fits else 1
