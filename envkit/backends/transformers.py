"""Generation with a Hugging Face causal LM in this process (:class:`TransformersBackend`)."""

from __future__ import annotations

import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from envkit.backends.base import Generation, SamplingParams, TokenHook, request_budgets, request_seeds
from envkit.backends.registry import BackendOptions


@dataclass
class TransformersBackend:
    """Generate with a Hugging Face causal LM in this process.

    Prompts are left-padded into batches of at most ``max_batch_size``; generation runs in eval mode without
    gradients. A batch runs as wide as its longest prompt and every row pays for that width (the prefill's attention
    grows with its square), so on CPU, where that compute is the cost, a batch whose padding would exceed
    ``pad_tolerance`` is split into groups of similar length (:func:`length_groups`): one long prompt among many short
    ones (an episode whose history grew faster) runs apart instead of widening every row; equal lengths stay one
    batch. On an accelerator the default keeps one batch (there an extra call's decode steps probably cost more than
    padding does; not measured).

    Sampling follows :class:`SamplingParams` alone: nothing sampling-related is inherited from the model's
    ``generation_config`` (a shipped ``repetition_penalty`` or ``min_p`` would make the samples come from a
    distribution the trainer's loss does not model). Each row samples with a uniform number determined by its own
    request seed and position alone (:func:`row_uniforms`, :func:`sample_rows`), so the global RNG is never touched
    and a request's random draws do not depend on which other requests share its batch. Its logits can: a batch's
    width and padding change the float rounding of its matrix products, which now and then moves a draw across a
    token boundary (a near-uniform tiny model sampled 64 episodes at concurrency 64 twice, the batches formed by
    timing: one episode differed). The recorded logprob is of the distribution actually sampled from: after repetition
    penalty, temperature, top-k, top-p and min-p (transformers' own logits warpers).
    """

    model: Any
    tokenizer: Any
    max_batch_size: int = 256
    stop_token_ids: list[int] | None = None
    pad_tolerance: float | None = None
    """Padded tokens a batch may hold beyond its prompts' own, as a fraction of them (None: 0.1 on CPU, no limit on
    an accelerator); a batch over it is split into groups of similar length (:func:`length_groups`)."""
    token_hook: TokenHook | None = field(default=None, repr=False)
    """Told the tokens generated so far during a call (:class:`~envkit.backends.base.ReportsTokens`); None: nothing
    is counted, and a call costs what it did without it."""
    token_report_s: float = 0.25
    """With a :attr:`token_hook`, at most this often it is called during a call (and once at its end)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_options(cls, options: BackendOptions) -> TransformersBackend:
        """The model folder ``options.model`` loaded in this process, with ``options.tokenizer`` (``envkit eval
        --backend transformers``)."""
        from envkit.models.loading import load_model

        return cls(load_model(options.model), options.tokenizer)

    @property
    def max_model_len(self) -> int | None:
        """The model's context length, when its config says."""
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    def eos_ids(self) -> list[int]:
        """Token ids that end a turn: ``stop_token_ids``, else the tokenizer's and generation config's EOS ids."""
        if self.stop_token_ids:
            return list(self.stop_token_ids)
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(configured if isinstance(configured, list) else [configured])
        return sorted(i for i in ids if i is not None)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """Batched sampling; one :class:`Generation` per prompt. Without ``seeds``, ``sampling.seed`` (if set) seeds
        prompt ``i`` with ``request_seed(seed, i)``; with neither, each row draws a fresh random seed.
        ``max_new_tokens`` gives each prompt its own token budget: the batch runs to the largest, each row stops at
        its own (exactly the tokens that prompt gets alone with that budget)."""
        seeds = [s if s is not None else secrets.randbits(63) for s in request_seeds(sampling, seeds, len(prompts))]
        budgets = request_budgets(sampling, max_new_tokens, len(prompts))
        results: list[Generation | None] = [None] * len(prompts)
        hook = self.token_hook
        counter = _TokenCounter(hook, self.token_report_s) if hook is not None else None
        for group in length_groups([len(p) for p in prompts], self.max_batch_size, self._pad_tolerance()):
            outputs = self._generate_batch(
                [prompts[i] for i in group], sampling, [seeds[i] for i in group], [budgets[i] for i in group], counter
            )
            for index, output in zip(group, outputs, strict=True):
                results[index] = output
        if counter is not None:
            counter.report()
        return results  # type: ignore[return-value]  # every index is in exactly one group

    def _pad_tolerance(self) -> float:
        if self.pad_tolerance is not None:
            return self.pad_tolerance
        device = next(self.model.parameters()).device
        return DEFAULT_CPU_PAD_TOLERANCE if device.type == "cpu" else math.inf

    def _generate_batch(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seeds: list[int],
        budgets: list[int],
        counter: _TokenCounter | None = None,
    ) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        if not prompts:
            return []
        stops = sorted(set(self.eos_ids()) | set(sampling.stop_token_ids or []))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else stops[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        device = next(self.model.parameters()).device
        sampler = _RowSampler(sampling, seeds, [width - len(p) for p in prompts], device, budgets, stops[0])
        if counter is not None:
            counter.start_batch(len(prompts), stops, device)
        sampler.counter = counter
        # Greedy decoding of the one-hot scores our sampler returns: transformers adds no sampling of its own.
        config = GenerationConfig(
            max_new_tokens=max(budgets),
            do_sample=False,
            num_beams=1,
            eos_token_id=stops,
            pad_token_id=pad,
            return_dict_in_generate=True,
            stop_strings=sampling.stop or None,
        )
        was_training = self.model.training
        with self._lock, torch.no_grad():
            inherited, self.model.generation_config = self.model.generation_config, GenerationConfig()
            self.model.eval()
            try:
                output = self.model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    generation_config=config,
                    logits_processor=LogitsProcessorList([sampler]),
                    tokenizer=self.tokenizer if sampling.stop else None,
                )
            finally:
                self.model.generation_config = inherited
                if was_training:
                    self.model.train()
        new_tokens = output.sequences[:, width:].tolist()
        chosen = torch.stack(sampler.chosen, dim=1).tolist() if sampler.chosen else [[] for _ in prompts]
        logprobs = torch.stack(sampler.logprobs, dim=1).tolist() if sampler.logprobs else [[] for _ in prompts]
        stop_ids = set(stops)
        return [
            self._finish(tokens[:budget], picks, values, stop_ids, sampling, budget)
            for tokens, picks, values, budget in zip(new_tokens, chosen, logprobs, budgets, strict=True)
        ]

    def _finish(
        self,
        tokens: list[int],
        picks: list[int],
        values: list[float],
        stops: set[int],
        sampling: SamplingParams,
        budget: int,
    ) -> Generation:
        """Cut one row at its stop token or stop string (after it, transformers pads finished rows) or its token
        budget (``tokens`` holds at most ``budget``)."""
        longest = max((len(s) for s in sampling.stop or []), default=0)
        kept: list[int] = []
        for token, pick in zip(tokens, picks, strict=False):
            if token != pick:  # a padded step: the row had already finished
                return Generation(kept, values[: len(kept)], "stop")
            kept.append(token)
            if token in stops:
                return Generation(kept, values[: len(kept)], "stop")
            if longest:
                tail = self.tokenizer.decode(kept[-(4 * longest + 4) :], skip_special_tokens=False)
                if any(tail.endswith(s) for s in sampling.stop or []):
                    return Generation(kept, values[: len(kept)], "stop")
        return Generation(kept, values[: len(kept)], "length" if len(kept) >= budget else "stop")


DEFAULT_CPU_PAD_TOLERANCE = 0.1
"""On CPU, a batch's padded tokens may exceed its prompts' own by at most this fraction before it is split by length.
Measured (``benchmarks/README.md``, "Instant tools"): a second-turn batch of 106 prompts of 358-360 tokens and a few of
up to 443 took 0.55 s of CPU in one call, 0.34-0.35 s with the long ones apart."""


def length_groups(lengths: list[int], max_batch_size: int, pad_tolerance: float) -> list[list[int]]:
    """Indices of ``lengths`` (prompt lengths) in batches for left-padded generation.

    With an infinite ``pad_tolerance``: consecutive runs of at most ``max_batch_size``, in order. Otherwise the
    prompts are taken longest first, and a batch takes the next (shorter or equal) prompt while it has fewer than
    ``max_batch_size`` rows and its padded size, ``rows x longest``, stays within ``1 + pad_tolerance`` times the
    tokens its prompts really hold. Equal lengths share a batch (up to ``max_batch_size``).
    """
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be at least 1")
    if not pad_tolerance >= 0:
        raise ValueError(f"pad_tolerance must be a fraction >= 0 (or math.inf), got {pad_tolerance}")
    if math.isinf(pad_tolerance):
        return [
            list(range(start, min(start + max_batch_size, len(lengths))))
            for start in range(0, len(lengths), max_batch_size)
        ]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    width = real = 0
    for index in order:
        length = lengths[index]
        fits = len(current) < max_batch_size and (len(current) + 1) * width <= (1 + pad_tolerance) * (real + length)
        if current and fits:
            current.append(index)
            real += length
            continue
        if current:
            groups.append(current)
        current, width, real = [index], length, length
    if current:
        groups.append(current)
    return groups


class _RowSampler:
    """The last logits processor of a :class:`TransformersBackend` call: samples every row with its own generator.

    It applies the repetition penalty (over each row's own tokens, never its left padding), then transformers'
    temperature / top-k / top-p / min-p warpers, records the chosen token and its logprob under that processed
    distribution, and returns scores where only the chosen token is finite, so greedy decoding picks it.
    """

    def __init__(
        self,
        sampling: SamplingParams,
        seeds: list[int],
        pad_widths: list[int],
        device: Any,
        budgets: list[int] | None = None,
        stop_id: int | None = None,
    ) -> None:
        import torch
        from transformers import (
            MinPLogitsWarper,
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.greedy = sampling.temperature <= 0
        self.penalty = (
            RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)
            if sampling.repetition_penalty != 1.0
            else None
        )
        self.warpers: list[Any] = []
        if not self.greedy:
            if sampling.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k:
                self.warpers.append(TopKLogitsWarper(int(sampling.top_k)))
            if sampling.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(sampling.top_p))
            if sampling.min_p > 0.0:
                self.warpers.append(MinPLogitsWarper(sampling.min_p))
        # Seeds as signed 64-bit integers (the hash below works on int64 tensors, wrapping on overflow).
        self.seeds = torch.tensor([(int(s) + 2**63) % 2**64 - 2**63 for s in seeds], dtype=torch.int64, device=device)
        self.step = 0
        self.pad_widths = pad_widths
        # A row past its own token budget is made to emit a stop token, so transformers finishes it (the backend
        # cuts that token off): rows of one batch each stop at their own budget.
        self.budgets = None
        if budgets is not None and stop_id is not None and len(set(budgets)) > 1:
            self.budgets = torch.tensor(budgets, dtype=torch.int64, device=device)
        self.stop_id = stop_id
        self.counter: _TokenCounter | None = None
        self.chosen: list[Any] = []
        self.logprobs: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        scores = scores.float()
        if self.penalty is not None:
            scores = torch.cat(
                [
                    self.penalty(input_ids[row : row + 1, pad:], scores[row : row + 1])
                    for row, pad in enumerate(self.pad_widths)
                ]
            )
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        logprobs = scores.log_softmax(-1)
        chosen = scores.argmax(-1) if self.greedy else self.sample(logprobs)
        if self.budgets is not None:
            chosen = torch.where(self.budgets <= self.step, torch.full_like(chosen, self.stop_id), chosen)
        self.step += 1
        if self.counter is not None:
            self.counter.add(chosen)
        self.chosen.append(chosen)
        self.logprobs.append(logprobs.gather(1, chosen[:, None])[:, 0])
        onehot = torch.full_like(scores, -math.inf)
        return onehot.scatter_(1, chosen[:, None], 0.0)

    def sample(self, logprobs: Any) -> Any:
        """One token per row from the processed log-distribution ``logprobs`` (rows × vocabulary)."""
        return sample_rows(logprobs, row_uniforms(self.seeds, self.step))


class _TokenCounter:
    """Counts one ``generate`` call's new tokens (each row's, up to and including its stop token) for a
    :data:`~envkit.backends.base.TokenHook`: a few tensor operations per step, one read of the count per report."""

    def __init__(self, hook: TokenHook, every_s: float) -> None:
        self.hook, self.every_s = hook, every_s
        self.started = self.reported = time.monotonic()
        self.done_batches = 0  # tokens of the call's earlier batches (length groups)
        self.count: Any = 0  # this batch's, a tensor once it has begun
        self.alive: Any = None
        self.stops: Any = None

    def start_batch(self, rows: int, stops: list[int], device: Any) -> None:
        """Begin counting a batch of ``rows`` rows that stop at ``stops``."""
        import torch

        self.done_batches += int(self.count)
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.alive = torch.ones(rows, dtype=torch.bool, device=device)
        self.stops = torch.tensor(stops, device=device)

    def add(self, chosen: Any) -> None:
        """Count one step's tokens (``chosen``: one per row) of the rows still generating; report when it is time."""
        import torch

        self.count += self.alive.sum()
        self.alive &= ~torch.isin(chosen, self.stops)
        if time.monotonic() - self.reported >= self.every_s:
            self.report()

    def report(self) -> None:
        """Call the hook with the tokens so far and the seconds since the call began."""
        self.reported = time.monotonic()
        self.hook(self.done_batches + int(self.count), self.reported - self.started)


def _signed(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _shift_right(x: Any, bits: int) -> Any:
    """Logical right shift of int64 tensors (torch's ``>>`` is arithmetic on negative values)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: Any) -> Any:
    """splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2**64)."""
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def row_uniforms(seeds: Any, step: int) -> Any:
    """One uniform number in (0, 1) per row (float64), a pure function of (the row's seed, step).

    Counter-based (splitmix64 of the seed, then of the step): computed for all rows at once on the model's device,
    and, like one ``torch.Generator`` per row, a row's number depends on its request's seed alone, never on its
    neighbours in the batch.
    """
    x = _mix(_mix(seeds) + _signed((step + 1) * _GOLDEN))
    return (_shift_right(x, 11).double() + 0.5) / float(1 << 53)


def sample_rows(logprobs: Any, uniforms: Any) -> Any:
    """Inverse-CDF sampling: row ``r`` takes the first token whose cumulative probability reaches ``uniforms[r]``.

    With ``uniforms`` uniform in (0, 1) this is an exact sample of each row's distribution (tokens of probability 0,
    e.g. cut by top-k, are never taken); one cumulative sum over the batch instead of a ``multinomial`` per row.
    """
    import torch

    cdf = logprobs.double().exp().cumsum(-1)
    chosen = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None].contiguous())[:, 0]
    return chosen.clamp_(max=logprobs.shape[-1] - 1)
