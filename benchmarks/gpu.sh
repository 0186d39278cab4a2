#!/usr/bin/env bash
# The GPU benchmarks on a CUDA GPU, in under 10 minutes: ppojax's scaling over envs and seeds
# (benchmarks/results/scaling-gpu.json and .png), then ppojax against rejax at CartPole with
# 2,048 and 65,536 envs and Breakout-MinAtar with 1,024 (compile and run time,
# benchmarks/results/compare-gpu.json and .png). Each step's JSON is written as it goes, so a
# step cut off by its timeout keeps what it measured.
#   bash benchmarks/gpu.sh            (from the repository root, on a machine with a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv-gpu/bin/python ]]; then
    python3 -m venv .venv-gpu
    .venv-gpu/bin/pip install -q -e ".[bench]" "jax[cuda12]"
fi
.venv-gpu/bin/python - <<'PY'
import jax
assert jax.default_backend() == "gpu", f"no GPU visible to JAX: {jax.devices()}"
print(jax.devices())
PY
timeout 280 .venv-gpu/bin/python benchmarks/scaling.py --tag gpu \
    --envs 4 64 1024 4096 16384 65536 --seeds 1 4 16 64 256 \
    --steps-per-point 8388608 --steps-per-seed 131072 --repeats 2 || echo "scaling.py stopped (timeout or error); going on" >&2
timeout 280 .venv-gpu/bin/python benchmarks/compare.py --tag gpu \
    --configs cartpole-2048 cartpole-65536 breakout-1024 --pairs 3
