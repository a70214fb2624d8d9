#!/usr/bin/env bash
# Build the documentation site offline into docs/_build/html (open docs/_build/html/index.html).
# Warnings and unresolved cross-references fail the build (-W -n); --keep-going reports all of them first.
# The environment pages and the CLI reference are generated files: this checks them too (regenerate with
# `python scripts/gen_env_pages.py` / `python scripts/gen_cli_reference.py`). Extra arguments go to sphinx-build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENVKIT_VENV:-.venv}"
PYTHON="$VENV/bin/python"
"$PYTHON" -c 'import sphinx, myst_parser, furo' 2>/dev/null || {
    echo "the docs tools are missing: $PYTHON -m pip install -e '.[docs]' (or bash scripts/setup.sh)" >&2
    exit 2
}
"$PYTHON" scripts/gen_env_pages.py --check
"$PYTHON" scripts/gen_cli_reference.py --check
# No network: TRL's experimental-API warning is noise here, and HF libraries must not look for updates.
export TRL_EXPERIMENTAL_SILENCE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$PYTHON" -m sphinx -W -n --keep-going -b html -q docs docs/_build/html "$@"
echo "built docs/_build/html/index.html"
