#!/usr/bin/env bash
# The GPU benchmarks, on a machine with a CUDA GPU and no network (shared/GPU.md): its own
# python3 with jax, flax, optax, chex and matplotlib, plus the wheels benchmarks/gpu_wheels.sh
# put in .whl/ (gymnax, rejax and what they import), installed into /tmp/site.
#
#   bash benchmarks/gpu.sh            (a) and (b) (about 10-13 minutes: more than one 10-minute
#                                     device command; run the parts apart there)
#   bash benchmarks/gpu.sh learning   (a) benchmarks/learning.py: the 9 gymnax tasks and the 4
#                                     MinAtar games with a CNN, 4 seeds, 6 jobs at once ->
#                                     benchmarks/results/learning.json and .png (~6-8 min)
#   bash benchmarks/gpu.sh speed      (b) benchmarks/gpu.py: ppojax vs rejax steps/s ->
#                                     benchmarks/results/gpu.json and .png (~4-5 min)
#   bash benchmarks/gpu.sh inside     (c) gpu.py --parts inside: one update split into phases,
#                                     a minibatch step's kernels and bytes, each kernels
#                                     candidate and bfloat16 on and off -> gpu.json's
#                                     "inside" (~6-8 min; rows saved as they come)
#   bash benchmarks/gpu.sh rlhf       (d) gpu.py --parts rlhf: ppojax.rlhf's PPO and GRPO steps
#                                     at GPT-2-small shape -> gpu.json's "rlhf" (~3 min)
#   bash benchmarks/gpu.sh plan       (e) plan_check.py, for each of PLAN_SHAPES ("small
#                                     large"): Qwen2.5-0.5B's GRPO step (8 x 8, 512 + 1024,
#                                     bf16), then Qwen2.5-1.5B's with --remat-layers, from zero
#                                     weights, the planner's bytes, verdict and time estimate
#                                     against memory_stats, the budget and the measured step
#                                     -> benchmarks/results/plan_check.json, a row each (~5 min
#                                     each: PLAN_SHAPES=large runs the second apart)
#
# Whatever the part, `ppojax doctor --json` runs first (DOCTOR_TIMEOUT seconds): each kernel a
# run here would use, checked on this GPU against its plain form and timed, its verdict stored
# for the parts after it -> benchmarks/results/doctor.json, the device's name in it.
#
# Each part runs under its own timeout (LEARNING_TIMEOUT, SPEED_TIMEOUT seconds; LEARNING_TASKS
# and LEARNING_JOBS change (a)'s tasks, space-separated, and its processes) and writes its
# JSON as it goes, so a part cut off keeps what it finished. With $OUT set (the device tool's
# folder of files to bring back) the results and this script's log are copied there as they
# are written (flat names, 7 files). PPOJAX_COMMIT=<hash> records the commit where the
# checkout has no .git. From the repository root or anywhere in it.
# To try the script on a CPU: SMOKE=1 (tiny sizes, results in /tmp/ppojax-smoke, no GPU
# needed), PYTHON=<an interpreter with gymnax and rejax>, NO_WHEELS=1 (use its packages).
# Each process preallocates XLA_PYTHON_CLIENT_MEM_FRACTION of the GPU: 0.9 unless it is set,
# as the training commands set it (ppojax.runtime.memory), the budget `ppojax plan` judges by.
set -uo pipefail
cd "$(dirname "$0")/.."
USER_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-}"
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
# learning.py's jobs share one GPU: unless the user set a fraction, each gets 0.9 / jobs there
LEARNING_ENV=()
[[ -z "$USER_FRACTION" ]] && LEARNING_ENV=(env -u XLA_PYTHON_CLIENT_MEM_FRACTION)
PART="${1:-all}"
LEARNING_TIMEOUT="${LEARNING_TIMEOUT:-540}"
SPEED_TIMEOUT="${SPEED_TIMEOUT:-330}"
INSIDE_TIMEOUT="${INSIDE_TIMEOUT:-520}"
RLHF_TIMEOUT="${RLHF_TIMEOUT:-300}"
PLAN_TIMEOUT="${PLAN_TIMEOUT:-480}"
DOCTOR_TIMEOUT="${DOCTOR_TIMEOUT:-300}"
LEARNING_JOBS="${LEARNING_JOBS:-6}"
ALL_TASKS="CartPole-v1 Acrobot-v1 Pendulum-v1 MountainCarContinuous-v0 MountainCar-v0
    Asterix-MinAtar Breakout-MinAtar Freeway-MinAtar SpaceInvaders-MinAtar
    Asterix-MinAtar:cnn Breakout-MinAtar:cnn Freeway-MinAtar:cnn SpaceInvaders-MinAtar:cnn"
read -r -a TASKS <<<"$(echo ${LEARNING_TASKS:-$ALL_TASKS})"
PYTHON="${PYTHON:-python3}"
SMOKE_FLAG=()
[[ -n "${SMOKE:-}" ]] && SMOKE_FLAG=(--smoke)
RESULTS=benchmarks/results
[[ -n "${SMOKE:-}" ]] && RESULTS=/tmp/ppojax-smoke
case "$PART" in
    all | learning | speed | inside | rlhf | plan) ;;
    *) echo "usage: bash benchmarks/gpu.sh [all|learning|speed|inside|rlhf|plan]" >&2; exit 2 ;;
esac
MIRROR=()
if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    MIRROR=(--mirror "$OUT")
    exec > >(tee -a "$OUT/gpu-sh.log") 2>&1
fi
began=$(date +%s)

# The carried wheels, without their dependencies (the machine has the rest).
if [[ -z "${NO_WHEELS:-}" ]]; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "no wheels in .whl/: run bash benchmarks/gpu_wheels.sh where a registry is" \
            "reachable, and carry .whl" >&2
        exit 1
    fi
    rm -rf /tmp/site
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl; then
        echo "pip failed; unpacking the wheels instead (they are zip files)" >&2
        "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' \
            .whl/*.whl || exit 1
    fi
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi

SMOKE="${SMOKE:-}" "$PYTHON" - <<'PY' || exit 1
import importlib.metadata as metadata
import os
import subprocess

import jax

if not os.environ.get("SMOKE"):
    assert jax.default_backend() == "gpu", f"no GPU visible to JAX: {jax.devices()}"
try:
    driver = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30,
    ).stdout.strip()
except (OSError, subprocess.SubprocessError):
    driver = "nvidia-smi not found"
print(f"GPU: {jax.devices()[0].device_kind} x {jax.device_count()}; nvidia-smi: {driver}")
names = ("jax", "jaxlib", "flax", "optax", "chex", "gymnax", "gymnasium", "rejax", "distrax")
print("versions:", ", ".join(f"{name} {metadata.version(name)}" for name in names))
import gymnax, rejax  # noqa: E401,F401  (fail here, not halfway through a part)
PY
echo "set up in $(($(date +%s) - began)) s"

status=0
# The kernels' checks on this device first: the parts below then run the forms that passed.
mkdir -p "$RESULTS"
echo "== doctor: timeout ${DOCTOR_TIMEOUT} s"
timeout -k 15 "$DOCTOR_TIMEOUT" "$PYTHON" -m ppojax doctor --json "$RESULTS/doctor.json" || {
    status=$?
    echo "ppojax doctor stopped (exit $status: 1 is a plain form failing, 124 the timeout);" \
        "going on" >&2
}
[[ -n "${OUT:-}" && -f "$RESULTS/doctor.json" ]] && cp -f "$RESULTS/doctor.json" "$OUT/"
echo "doctor done at $(($(date +%s) - began)) s"
if [[ "$PART" == all || "$PART" == learning ]]; then
    echo "== (a) learning: timeout ${LEARNING_TIMEOUT} s"
    timeout -k 15 "$LEARNING_TIMEOUT" "${LEARNING_ENV[@]}" "$PYTHON" benchmarks/learning.py \
        "${SMOKE_FLAG[@]}" \
        --tasks "${TASKS[@]}" --seeds 4 --jobs "$LEARNING_JOBS" "${MIRROR[@]}" || {
        status=$?
        echo "learning.py stopped (exit $status: 124 is the timeout); going on" >&2
    }
    if [[ "$status" != 0 && -f "$RESULTS/learning.json" ]]; then
        # the figure of what finished, when the run was cut off before drawing it
        "$PYTHON" benchmarks/learning.py --plot-only --out "$RESULTS/learning.json" || true
        [[ -n "${OUT:-}" ]] && cp -f "$RESULTS/learning.png" "$OUT/" 2>/dev/null
    fi
    echo "(a) done at $(($(date +%s) - began)) s"
fi
if [[ "$PART" == all || "$PART" == speed ]]; then
    echo "== (b) speed: timeout ${SPEED_TIMEOUT} s"
    timeout -k 15 "$SPEED_TIMEOUT" "$PYTHON" benchmarks/gpu.py "${SMOKE_FLAG[@]}" "${MIRROR[@]}" || {
        code=$?
        status=$code
        echo "gpu.py stopped (exit $code: 124 is the timeout)" >&2
    }
    echo "(b) done at $(($(date +%s) - began)) s"
fi
for part in inside rlhf; do
    [[ "$PART" == "$part" ]] || continue
    limit=$INSIDE_TIMEOUT
    [[ "$part" == rlhf ]] && limit=$RLHF_TIMEOUT
    echo "== $part: timeout ${limit} s"
    timeout -k 15 "$limit" "$PYTHON" benchmarks/gpu.py --parts "$part" "${SMOKE_FLAG[@]}" \
        "${MIRROR[@]}" || {
        status=$?
        echo "gpu.py --parts $part stopped (exit $status: 124 is the timeout)" >&2
    }
    echo "$part done at $(($(date +%s) - began)) s"
done
if [[ "$PART" == plan ]]; then
    for shape in ${PLAN_SHAPES:-small large}; do
        echo "== plan $shape: timeout ${PLAN_TIMEOUT} s"
        timeout -k 15 "$PLAN_TIMEOUT" "$PYTHON" benchmarks/plan_check.py --shape "$shape" \
            "${SMOKE_FLAG[@]}" "${MIRROR[@]}" || {
            status=$?
            echo "plan_check.py --shape $shape stopped (exit $status: 124 is the timeout," \
                "1 a step that did not run)" >&2
        }
        echo "plan $shape done at $(($(date +%s) - began)) s"
    done
fi
if [[ -n "${OUT:-}" ]]; then
    for file in doctor.json learning.json learning.png gpu.json gpu.png plan_check.json; do
        [[ -f "$RESULTS/$file" ]] && cp -f "$RESULTS/$file" "$OUT/"
    done
    ls -la "$OUT"
fi
exit "$status"
