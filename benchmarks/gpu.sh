#!/usr/bin/env bash
# The scaling benchmark on a CUDA GPU, in under 5 minutes; writes
# benchmarks/results/scaling-gpu.json and .png like the CPU run.
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
    --steps-per-point 8388608 --steps-per-seed 131072 --repeats 2
