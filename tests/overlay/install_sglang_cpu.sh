#!/usr/bin/env bash
# Build the CPU test environment for tests/overlay: a venv where `import sglang` (0.5.17,
# --no-deps) and this project's plugin entry point both resolve. Then run the tests with
#   SGLANG_DFLASH_SGLANG_SITE=<venv> python -m pytest tests/overlay
# Usage: tests/overlay/install_sglang_cpu.sh [VENV_DIR] (default /work/venvs/sglang-cpu)
set -euo pipefail
venv=${1:-/work/venvs/sglang-cpu}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
wheels=${SGLANG_DFLASH_WHEEL_CACHE:-$HOME/.cache/sglang-dflash/wheels}
# A plain venv: with system site-packages pip would take a machine-wide CPU-only torch as
# satisfying torch==2.13.0, and the PyPI torchvision wheel cannot load against it.
python3 -m venv "$venv"
# Plain PyPI resolution: ignore machine-local find-links that carry a CPU-only torch.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_CONSTRAINT || true
"$venv/bin/pip" install -q -r "$here/requirements-sglang-cpu.txt"
mkdir -p "$wheels"
whl=$(ls "$wheels"/sglang-0.5.17-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$whl" ]; then
  "$venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_34_x86_64 -d "$wheels" sglang==0.5.17
  whl=$(ls "$wheels"/sglang-0.5.17-*.whl | head -n1)
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$venv/bin/python" -m zipfile -e "$whl" "$site"
"$venv/bin/pip" install -q --no-deps -e "$repo"
"$venv/bin/python" -c 'import sglang.srt.speculative.dflash_worker_v2, sglang_dflash.plugin; print("sglang CPU env ready")'
