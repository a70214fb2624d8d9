"""The workloads every arm plays: the quickstart's capitals env with a fixed tool latency, and a chain env of 1-6 turns
with log-normal latencies, each with its per-turn and per-episode token budgets and turn cap."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import envkit

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""
sys.path.insert(0, str(ROOT / "examples"))  # the quickstart's capitals env

from capitals import CAPITALS, CapitalsEnv  # noqa: E402

GROUP = 4
"""Episodes per task (GRPO's ``num_generations``)."""

WORLD = {
    **CAPITALS,
    "Germany": "Berlin",
    "Italy": "Rome",
    "Egypt": "Cairo",
    "Chile": "Santiago",
    "Norway": "Oslo",
    "Spain": "Madrid",
    "Cuba": "Havana",
}


class EndsOnMalformedCall(envkit.ToolEnv):
    """An assistant turn holding a tool call that does not parse ends the episode as its final answer, as in TRL's loop.

    TRL's ``parse_response`` falls back to plain text when a call does not parse, and a reply without tool calls ends
    TRL's episode; envkit's :class:`~envkit.ToolEnv` answers the call with an ``Error: could not parse tool call`` tool
    message and the episode goes on (the model may retry). With ``malformed_ends_episode`` (the benchmark's default,
    ``--malformed end``) both arms play the same turns; ``--malformed answer`` keeps envkit's own rule, which plays
    more turns than TRL's loop on the same model.
    """

    malformed_ends_episode = True

    def step(self, action):
        if self.malformed_ends_episode and isinstance(action, dict) and action.get("malformed_tool_calls"):
            action = {"role": "assistant", "content": action.get("content") or ""}  # TRL: the text is the answer
        return super().step(action)


class LatencyCapitals(EndsOnMalformedCall, CapitalsEnv):
    """The README's capitals env with a fixed tool latency (simulated I/O)."""

    latency_s = 0.0

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name, e.g. "France".
        """
        if self.latency_s:
            time.sleep(self.latency_s)
        if country not in CAPITALS:
            raise envkit.ToolError(f"unknown country {country!r}")
        return CAPITALS[country]


class ChainEnv(EndsOnMalformedCall):
    """The heterogeneous workload: follow a chain of 0-5 countries, one lookup per turn, then list their capitals.

    The task seed decides the chain (so 1-6 assistant turns, and a final answer whose length grows with the chain) and
    the latency of each lookup (log-normal, median 20 ms, sigma 1). Each lookup's result names the next country or
    says the chain is over, so a model that follows the protocol makes exactly ``hops`` calls whatever it looked up.
    """

    max_turns = 6
    median_latency_s = 0.02
    sigma = 1.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        rng = self.np_random
        self.hops = int(rng.integers(0, 6))
        self.chain = [str(c) for c in rng.choice(sorted(WORLD), size=self.hops, replace=False)]
        self.latencies = [self.median_latency_s * math.exp(self.sigma * z) for z in rng.standard_normal(8)]
        self.calls = 0
        if not self.hops:
            return [{"role": "user", "content": "No capitals to find today. Just say done."}], {}
        return [{"role": "user", "content": f"Find the capitals, starting with {self.chain[0]}."}], {}

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country; the result also names the next country to look up.

        Args:
            country: The country's English name, e.g. "France".
        """
        k = self.calls
        self.calls += 1
        time.sleep(self.latencies[min(k, len(self.latencies) - 1)])
        capital = WORLD.get(country, "unknown")
        if k + 1 < self.hops:
            return f"{capital}. Next: {self.chain[k + 1]}."
        return f"{capital}. That was the last one."

    def score(self) -> float:
        last = self.messages[-1]
        if last["role"] != "assistant":
            return 0.0
        if not self.chain:
            return 1.0
        return sum(WORLD[c] in (last.get("content") or "") for c in self.chain) / len(self.chain)

    def oracle(self):
        done = sum(1 for m in self.messages if m["role"] == "tool")
        if done < self.hops:
            call = {
                "type": "function",
                "function": {"name": "lookup_capital", "arguments": {"country": self.chain[done]}},
            }
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        if not self.chain:
            return {"role": "assistant", "content": "Done."}
        return {"role": "assistant", "content": "The capitals are " + ", ".join(WORLD[c] for c in self.chain) + "."}


def capitals_class(latency_s: float) -> type[LatencyCapitals]:
    """The capitals env with every lookup taking ``latency_s``."""
    return type("Capitals", (LatencyCapitals,), {"latency_s": latency_s})


@dataclasses.dataclass(frozen=True)
class Workload:
    """One workload: its env class (built on demand), turn cap and token budgets, the same in every arm."""

    name: str
    env: Callable[[], type[envkit.ToolEnv]]
    max_turns: int
    per_turn: int
    """Token budget of one assistant turn (every arm)."""
    total: int
    """Token budget of one episode's completion: model and env tokens after the prompt (every arm)."""


WORKLOADS = {
    "instant": Workload("instant", lambda: capitals_class(0.0), 4, 40, 160),
    "latency50ms": Workload("latency50ms", lambda: capitals_class(0.05), 4, 40, 160),
    "hetero": Workload("hetero", lambda: ChainEnv, 6, 40, 320),
}
