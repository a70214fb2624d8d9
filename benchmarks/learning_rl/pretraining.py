"""Synthetic pretraining for in-context copying and recall, before the warm start.

A pretrained LLM arrives at fine-tuning able to copy what its context holds (induction heads, Olsson et al. 2022)
and to recall the value a key was given earlier (associative recall, Arora et al. 2023). A randomly initialised tiny
model does not, and the warm starts showed it: after a failed call it retried with wrong numbers although the
error message printed the right ones just before (A), and it copied the operand of a chain's step approximately,
15 as 19 (B). This pretraining gives every seed's model those two skills on text that has nothing of the tasks in
it, so that the experiments measure what the arms learn on top of them, as they would with a real pretrained model:

- **copying**: a span of random tokens, some unrelated random tokens, and the span again;
- **recall**: ``key = value;`` pairs (keys of random letters, values integers of one to four digits), then some of
  the keys again with ``=``, each followed by its value.

Loss falls only on what the context determines (the repeated span after its first token, each recalled value), so
the model is not taught a distribution of random tokens. Sequences are packed to about :data:`SEQUENCE_TOKENS`,
the length of an episode, so copies span the distances they span in the tasks.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

import numpy as np

SEQUENCE_TOKENS = 512
"""Length of one packed pretraining sequence (an A or B episode renders to 400-700 tokens)."""
IGNORE = -100
"""Label of a token the loss skips (``transformers``' convention)."""


@dataclass
class Example:
    """One packed sequence: its token ids and labels (:data:`IGNORE` where the context does not determine the
    token)."""

    input_ids: list[int]
    labels: list[int]


class CopyAndRecall:
    """Random copying and recall sequences in ``tokenizer``'s ids (see the module's docstring), deterministic in
    ``seed``."""

    def __init__(self, tokenizer: Any, seed: int) -> None:
        self.tokenizer = tokenizer
        self.rng = np.random.default_rng(seed)
        special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
        self.pool = np.array([i for i in range(len(tokenizer)) if i not in special])

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def copying(self) -> Example:
        """A span of 4-32 random tokens, 0-64 unrelated ones, and the span again (loss on the repeat after its
        first token, which nothing before announces)."""
        rng = self.rng
        span = rng.choice(self.pool, size=int(rng.integers(4, 33))).tolist()
        gap = rng.choice(self.pool, size=int(rng.integers(0, 65))).tolist()
        ids = span + gap + span
        labels = [IGNORE] * (len(span) + len(gap) + 1) + span[1:]
        return Example(ids, labels)

    def recall(self) -> Example:
        """2-12 ``key = value;`` pairs, then 1-6 of the keys with ``=`` and (loss) each one's value."""
        rng = self.rng
        count = int(rng.integers(2, 13))
        keys: list[str] = []
        while len(keys) < count:
            key = "".join(rng.choice(list(string.ascii_lowercase), size=int(rng.integers(1, 4))))
            if key not in keys:
                keys.append(key)
        values = [str(int(rng.integers(0, 10 ** int(rng.integers(1, 5))))) for _ in keys]
        values = [f"-{v}" if rng.random() < 0.1 else v for v in values]
        ids = self._encode(" ".join(f"{k} = {v};" for k, v in zip(keys, values, strict=True)))
        labels = [IGNORE] * len(ids)
        for i in rng.choice(count, size=int(rng.integers(1, min(count, 6) + 1)), replace=False):
            query, answer = self._encode(f" {keys[i]} ="), self._encode(f" {values[i]};")
            ids += query + answer
            labels += [IGNORE] * len(query) + answer
        return Example(ids, labels)

    def sequence(self) -> Example:
        """Copying and recall examples in random order, packed to :data:`SEQUENCE_TOKENS`."""
        ids: list[int] = []
        labels: list[int] = []
        while len(ids) < SEQUENCE_TOKENS:
            example = self.copying() if self.rng.random() < 0.5 else self.recall()
            ids += example.input_ids
            labels += example.labels
        return Example(ids[:SEQUENCE_TOKENS], labels[:SEQUENCE_TOKENS])


def target_accuracy(model: Any, examples: list[Example]) -> float:
    """The fraction of labelled tokens of ``examples`` that ``model`` predicts exactly (greedy, teacher-forced)."""
    import torch

    model.eval()
    right = total = 0
    with torch.no_grad():
        for example in examples:
            logits = model(input_ids=torch.tensor([example.input_ids])).logits[0, :-1]
            labels = torch.tensor(example.labels[1:])
            mask = labels != IGNORE
            right += int((logits.argmax(-1)[mask] == labels[mask]).sum())
            total += int(mask.sum())
    return right / total if total else 0.0


def pretrain_copy_and_recall(
    model: Any,
    tokenizer: Any,
    steps: int,
    seed: int,
    *,
    batch_size: int = 16,
    learning_rate: float = 3e-3,
    warmup_steps: int = 20,
    probe_sequences: int = 32,
) -> dict[str, Any]:
    """``steps`` AdamW steps on :class:`CopyAndRecall` sequences (learning rate warmed up linearly, then along a
    cosine to 0); returns the exact-match accuracy on the labelled tokens of fresh sequences before and after, and
    the steps run. The model is left in eval mode."""
    import torch
    from transformers import get_cosine_schedule_with_warmup

    probe = CopyAndRecall(tokenizer, seed + 1_000_003)
    held_out = [probe.sequence() for _ in range(probe_sequences)]
    before = target_accuracy(model, held_out)
    data = CopyAndRecall(tokenizer, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

    schedule = get_cosine_schedule_with_warmup(optimizer, warmup_steps, steps)
    model.train()
    for _ in range(steps):
        batch = [data.sequence() for _ in range(batch_size)]
        loss = model(
            input_ids=torch.tensor([e.input_ids for e in batch]), labels=torch.tensor([e.labels for e in batch])
        ).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return {"steps": steps, "accuracy_before": before, "accuracy_after": target_accuracy(model, held_out)}
