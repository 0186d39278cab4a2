#!/usr/bin/env bash
# The wheels benchmarks/gpu.sh installs on the GPU machine, which has no network: gymnax and
# rejax with what they import that the machine lacks (shared/GPU.md lists what it has: jax,
# flax, optax, chex, matplotlib, seaborn, transformers, torch, so numpy, absl, PyYAML, six
# too). Run it where a package registry is reachable, from anywhere in the checkout; it fills
# the git-ignored folder .whl/ of the checkout (about 8 MB) with cp312 manylinux wheels, each
# without its dependencies, then checks that the folder holds exactly one version of each.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Versions: gymnax 1.0.1 wants gymnasium >=1.1,<1.4; gymnasium needs farama-notifications and
# cloudpickle; rejax 0.1.3 needs distrax, whose unpinned tfp-nightly resolved to the nightly
# below (the one the dev venv holds); tfp imports decorator, gast, dm-tree, cloudpickle;
# dm-tree uses wrapt.
WHEELS=(
    gymnax==1.0.1
    gymnasium==1.3.0
    farama-notifications==0.0.6
    cloudpickle==3.1.3
    rejax==0.1.3
    distrax==0.1.9
    tfp-nightly==0.26.0.dev20261027
    dm-tree==0.1.10
    gast==0.7.0
    decorator==5.3.1
    wrapt==2.5.2
)

rm -rf .whl
mkdir -p .whl
for wheel in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$wheel"
done

# One wheel per name, and each at the version asked for.
python3 - "${WHEELS[@]}" <<'PY'
import pathlib
import re
import sys

def norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()

wanted = {norm(spec.split("==")[0]): spec.split("==")[1] for spec in sys.argv[1:]}
found = {}
for path in sorted(pathlib.Path(".whl").glob("*.whl")):
    name, version = path.name.split("-")[:2]
    found.setdefault(norm(name), []).append(version)
problems = [f"{name}: {found.get(name)} (wanted {v})" for name, v in wanted.items()
            if found.get(name) != [v]]
problems += [f"{name}: not asked for" for name in found if name not in wanted]
size = sum(p.stat().st_size for p in pathlib.Path(".whl").glob("*.whl")) / 2**20
print(f".whl: {sum(map(len, found.values()))} wheels, {size:.1f} MiB")
if problems:
    sys.exit("wheels do not match: " + "; ".join(problems))
PY
