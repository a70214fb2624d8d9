"""The quickstart's example (docs/get-started/quickstart.md), with five countries and an oracle: a tool env where the
agent looks up a capital and tells the user.

Try it: ``envkit play examples/capitals.py:CapitalsEnv --seed 3``. The answer must name the right capital and no
other: a reply that lists every capital does not win (``envkit validate examples/capitals.py:CapitalsEnv``, check 15).
"""

import re

import envkit

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa"}


class CapitalsEnv(envkit.ToolEnv):
    max_turns = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.country = sorted(CAPITALS)[self.np_random.integers(len(CAPITALS))]
        return [{"role": "user", "content": f"What is the capital of {self.country}?"}], {}

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name, e.g. "France".
        """
        if country not in CAPITALS:
            raise envkit.ToolError(f"unknown country {country!r}")
        return CAPITALS[country]

    def score(self) -> float:  # in [0, 1]: did the final answer name the capital, and no other?
        last = self.messages[-1]
        named = set(re.findall(r"\w+", last["content"] or "")) & set(CAPITALS.values())
        return float(last["role"] == "assistant" and named == {CAPITALS[self.country]})

    def oracle(self):
        if self.messages[-1]["role"] == "user":
            return {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "lookup_capital", "arguments": {"country": self.country}}}
                ],
            }
        return {"role": "assistant", "content": f"The capital is {self.messages[-1]['content']}."}
