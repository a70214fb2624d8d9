"""Generation with an in-process ``vllm.LLM`` (:class:`VLLMBackend`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envkit.backends.base import Generation, SamplingParams, _request_seeds


@dataclass
class VLLMBackend:
    """Generate with an in-process ``vllm.LLM`` from token-id prompts (``TokensPrompt``).

    Build the engine with ``logprobs_mode="processed_logprobs"`` to get logprobs after temperature/top-k/top-p
    (what TRL's importance sampling expects); vLLM's default is raw logprobs.
    """

    llm: Any

    @property
    def max_model_len(self) -> int | None:
        """The engine's context length."""
        try:
            return int(self.llm.llm_engine.model_config.max_model_len)
        except AttributeError:
            return None

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, seeds: list[int] | None = None
    ) -> list[Generation]:
        """One ``llm.generate`` call for the whole batch, one vLLM ``SamplingParams`` (with its seed) per prompt."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            VSamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k else -1,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                max_tokens=sampling.max_new_tokens,
                stop=sampling.stop,
                stop_token_ids=sampling.stop_token_ids,
                seed=seed,
                logprobs=0,
                skip_special_tokens=False,
            )
            for seed in _request_seeds(sampling, seeds, len(prompts))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [
                float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens, strict=False)
            ]
            generations.append(
                Generation(tokens, logprobs, "length" if completion.finish_reason == "length" else "stop")
            )
        return generations
