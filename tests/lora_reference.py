"""LoRA references for tests against vLLM servers: adapters saved with peft, teacher-forced logprobs, and the
logprobs a server returns for requests it batches together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def random_adapter(model_dir: Path, path: Path, *, zero: bool, seed: int = 0) -> Any:
    """Save a rank-8 LoRA adapter of the tiny model to ``path``: all-zero ``B`` (exactly the base) or random
    weights drawn with ``seed``; return the peft model (eager attention) for teacher forcing."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager")
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=bool(zero)
    )
    model = get_peft_model(base, config)
    model.save_pretrained(str(path))
    return model.eval()


def teacher_forced(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """The log-probability ``model`` gives each of ``tokens`` after ``prompt`` (one forward pass)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(1, ids[0, len(prompt) :, None])[:, 0].tolist()


def concurrent_drift(url: str, first: str, others: list[str], prompts: list[list[int]], reference: Any) -> float:
    """Send every prompt at once naming ``first`` and each of ``others`` (so the server batches them together);
    return the largest error of ``first``'s sampled logprobs against ``reference`` teacher-forced."""
    import asyncio

    import httpx

    async def one(client: httpx.AsyncClient, model: str, prompt: list[int], seed: int) -> dict[str, Any]:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": 12,
            "temperature": 1.0,
            "top_k": 0,
            "logprobs": 1,
            "return_token_ids": True,
            "seed": seed,
            "skip_special_tokens": False,
            "ignore_eos": True,
        }
        reply = await client.post(url + "/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]

    async def main() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=120) as client:
            jobs = [one(client, m, p, i) for i, p in enumerate(prompts) for m in (first, *others)]
            return (await asyncio.gather(*jobs))[0 :: 1 + len(others)]

    worst = 0.0
    for prompt, choice in zip(prompts, asyncio.run(main()), strict=True):
        expected = teacher_forced(reference, prompt, list(choice["token_ids"]))
        served = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        worst = max(worst, max(abs(a - b) for a, b in zip(served, expected, strict=True)))
    return worst
