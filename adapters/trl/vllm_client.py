"""Generation through TRL's own vLLM server client (``trl vllm-serve``), so TRL's weight sync applies to what
envkit generates: the backend ``envkit train --use-vllm --vllm-mode server`` uses."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envkit.backends.base import Generation, request_budgets, request_seeds


class TRLClientBackend:
    """Generate through TRL's vLLM server (``trl vllm-serve``) with its client, from token-id prompts.

    Used by ``envkit train --use-vllm --vllm-mode server``: the trainer's own client, so TRL's weight sync applies.
    Every :class:`envkit.backends.SamplingParams` knob is sent (the server records processed logprobs when started
    with ``--logprobs-mode processed_logprobs``, as TRL asks).
    """

    def __init__(self, client: Any, eos_token_ids: list[int], max_concurrency: int = 64) -> None:
        self.client = client
        self.eos_token_ids = set(eos_token_ids)
        self.max_concurrency = max_concurrency

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Any,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Any]:
        """One request per token budget for the whole batch; with ``seeds`` (one per prompt) one concurrent request
        per prompt (with its own budget).

        A request carries one sampling seed and one budget for all its prompts, and the members of a GRPO group are
        identical prompts: sharing a seed would give them identical samples, so seeded prompts go one per request.
        """
        if not prompts:
            return []
        row_seeds = request_seeds(sampling, seeds, len(prompts))
        budgets = request_budgets(sampling, max_new_tokens, len(prompts))
        if all(seed is None for seed in row_seeds):
            results: list[Any] = [None] * len(prompts)
            for budget in sorted(set(budgets)):
                rows = [i for i, n in enumerate(budgets) if n == budget]
                batch = dataclasses.replace(sampling, max_new_tokens=budget)
                for i, generation in zip(
                    rows, self._request([list(prompts[i]) for i in rows], batch, None), strict=True
                ):
                    results[i] = generation
            return results
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            batches = pool.map(
                lambda row: self._request([list(row[0])], dataclasses.replace(sampling, max_new_tokens=row[2]), row[1]),
                zip(prompts, row_seeds, budgets, strict=True),
            )
            return [generation for batch in batches for generation in batch]

    def _request(self, prompts: list[list[int]], sampling: Any, seed: int | None) -> list[Any]:
        extra: dict[str, Any] = {}
        if seed is not None:
            extra["seed"] = seed
        if sampling.stop:
            extra["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            extra["stop_token_ids"] = list(sampling.stop_token_ids)
        output = self.client.generate(
            prompts,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or 0,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            generation_kwargs=extra or None,
        )
        stops = self.eos_token_ids | set(sampling.stop_token_ids or [])
        generations = []
        for tokens, logprobs in zip(output["completion_ids"], output["logprobs"], strict=True):
            values = [float(step[0]) if isinstance(step, list) else float(step) for step in logprobs]
            stopped = bool(tokens) and tokens[-1] in stops
            cut = len(tokens) >= sampling.max_new_tokens and not stopped
            generations.append(Generation(list(tokens), values, "length" if cut else "stop"))
        return generations


def trl_server_backend(trainer: Any, eos_token_ids: list[int]) -> TRLClientBackend:
    """The backend for a GRPOTrainer in vLLM server mode: its own vLLM client."""
    client = getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None)
    if client is None:
        raise RuntimeError("the trainer uses vLLM but has neither an in-process engine nor a server client")
    return TRLClientBackend(client, eos_token_ids)
