"""Kernel launches and HBM bytes per decoded token of LM sampling, compiled for an H100
without one, beside the minimum a token must move (the weights and the KV cache read once).

    JAX_PLATFORMS=cpu python benchmarks/decode_program.py [--models builtin qwen2.5-0.5b ...]
        [--unroll 1 2 4] [--out benchmarks/results/decode_program.json]
    python benchmarks/decode_program.py --table     benchmarks/README.md's table, from the file

Each model's sampling loop (``ppojax.rlhf.models.decode_cost``: draw a token, feed it through
the decoder's KV cache) is compiled for one H100 (``ppojax.runtime.deviceless``, the CUDA
plugin of ``pip install "ppojax[gpu-aot]"``) and one trip of its loop counted
(``ppojax.runtime.launches``). Counted without autotuning: a GPU's own compile picks its gemms
(and their split-K partials) and may differ. ``--unroll N``: the same loop with N tokens a
trip (``jax.lax.scan``'s unroll), each model's row holding the per-token figures of each N.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import RESULTS, failure, markdown_table, record, write_json

from ppojax.rlhf.models.decode_cost import decode_cost
from ppojax.rlhf.models.shapes import model_config
from ppojax.rlhf.models.transformer import builtin_config

# The sampling shape of the planner's fit targets (docs/rlhf.md): 64 rows, 512 prompt and 1024
# response positions, bfloat16; the small built-in model at test size, float32
REAL = {"dtype": "bfloat16", "rows": 64, "prompt_len": 512, "response_len": 1024}
SMALL = {"dtype": "float32", "rows": 4, "prompt_len": 8, "response_len": 8}
MODELS = ("builtin", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")


def config_of(name: str):
    """The built-in transformer of tests/test_gpu_program.py's shape, or a published shape."""
    if name == "builtin":
        return builtin_config(256, 64, 64, 4, 2), SMALL
    return model_config(name), REAL


def row(name: str, unroll: int) -> dict:
    config, shape = config_of(name)
    started = time.perf_counter()
    cost = decode_cost(config, target="h100", unroll=unroll, **shape)
    return {
        "model": name,
        **shape,
        "layers": cost.layers,
        "unroll": unroll,
        "launches_per_token": cost.launches,
        "launches_per_layer_per_token": round(cost.launches_per_layer, 2),
        "bytes_per_token": cost.bytes,
        "minimum_bytes": cost.minimum,
        "weight_bytes": cost.weights,
        "cache_bytes": cost.cache,
        "over_minimum": round(cost.over_minimum, 3),
        "launches_by_opcode": cost.by_opcode,
        "compile_seconds": round(time.perf_counter() - started, 1),
    }


def table(result: dict) -> str:
    """A row per model, one token a trip: launches a token and a layer, bytes a token against
    the minimum."""
    header = ["model", "launches / token", "a layer", "bytes / token", "minimum", "x minimum"]
    rows = [
        [
            found["model"],
            f"{found['launches_per_token']:g}",
            f"{found['launches_per_layer_per_token']:.1f}",
            size(found["bytes_per_token"]),
            size(found["minimum_bytes"]),
            f"{found['over_minimum']:.2f}",
        ]
        for found in result["rows"]
        if "error" not in found and found["unroll"] == 1
    ]
    return markdown_table(header, rows)


def size(count: float) -> str:
    return f"{count / 1e9:.3g} GB" if count >= 1e9 else f"{count / 1e6:.3g} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--unroll", nargs="+", type=int, default=[1])
    parser.add_argument("--out", type=Path, default=RESULTS / "decode_program.json")
    parser.add_argument("--table", action="store_true", help="print the file's table")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    result = {
        **record(__file__, sys.argv[1:]),
        "target": "h100",
        "note": (
            "one trip of the sampling loop per token, counted from the optimized HLO of a "
            "deviceless H100 compile without autotuning (a GPU's autotuned program may "
            "differ); minimum = every weight and the whole KV cache read once"
        ),
        "rows": [],
    }
    for name in args.models:
        for unroll in args.unroll:
            try:
                result["rows"].append(row(name, unroll))
            except Exception as error:  # a failed row is kept, the others still run
                result["rows"].append({"model": name, "unroll": unroll, "error": failure(error)})
            write_json(args.out, result)
            print(result["rows"][-1], flush=True)
    if any("error" in found for found in result["rows"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
