"""One finished episode as plain data, and the metrics over many."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from envkit.core.messages import Message


@dataclass
class Episode:
    """One finished episode: its transcript, its token-exact trajectory and its outcome."""

    task_seed: int
    group_index: int
    messages: list[Message] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    """The opening prompt: opening messages, tools and the generation prompt, as the chat template renders them."""
    completion_ids: list[int] = field(default_factory=list)
    """Every model token and every env-message token after the prompt, in order."""
    env_mask: list[int] = field(default_factory=list)
    """1 for a model token, 0 for an env token; same length as ``completion_ids``."""
    logprobs: list[float] = field(default_factory=list)
    """Per completion token: the sampled token's logprob (0.0 on env tokens)."""
    score: float = 0.0
    score_components: dict[str, float] = field(default_factory=dict)
    """The env's :meth:`~envkit.Env.score_components` after :meth:`~envkit.Env.score` (``{}`` when it has none, or
    when the episode failed): what the score is made of, for eval files and training logs."""
    rewards: list[float] = field(default_factory=list)
    """The env's reward of each step."""
    turns: int = 0
    turn_finish_reasons: list[str] = field(default_factory=list)
    """How each model turn ended, in order: ``stop`` (on the template's end-of-turn token), ``closed`` (on another
    stop token or string; the engine closed the turn with the end-of-turn token, masked), ``length`` (at the
    per-turn ``max_new_tokens``; closed by the engine) or ``budget`` (cut by the episode's token budget)."""
    turn_models: list[str] = field(default_factory=list)
    """The model (or LoRA adapter) name that generated each model turn, in order, as the backend reported it (``""``
    when it reports none): an episode that spans a weight sync records which policy produced each turn."""
    num_tool_calls: int = 0
    tool_errors: int = 0
    truncated: bool = False
    finish_reason: str = ""
    """How the episode ended, an :class:`~envkit.core.env.Ending` value (what the env was told before ``score()``):
    ``done`` (the env ended it), ``max_turns`` (the env's or the engine's turn cap), ``max_steps`` or
    ``too_many_errors`` (the env's own limits), ``max_episode_tokens`` (either token budget), ``error`` or
    ``timeout``."""
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``generate`` (waiting for the model), ``env`` (reset + steps), ``total``."""
    info: dict[str, Any] = field(default_factory=dict)
    """The env's reset info."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tools the model was offered, as OpenAI-style function schemas (what ``reset`` gave; ``[]`` for an env
    without tools): ``envkit view`` lists them without decoding the prompt."""
    worker: dict[str, Any] = field(default_factory=dict)
    """Where the env lived when it was not in this process: ``pid`` of its worker process (``env_workers=
    "processes"``); on Ray also ``node`` (the Ray node id) and ``actor``. Empty for thread workers."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data (one JSON line of ``envkit eval --out``)."""
        return asdict(self)

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)


def teacher_forced_logprobs(model: Any, episode: Episode) -> list[float]:
    """``model``'s logprob of every completion token given all tokens before it (one forward pass, no gradient).

    The reference for an episode's recorded ``logprobs``: at the positions where ``env_mask`` is 1 a backend that
    sampled from ``model`` must have recorded these values.
    """
    import torch

    ids = torch.tensor([episode.prompt_ids + episode.completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(episode.prompt_ids) - 1 : -1].float()
    picked = logits.log_softmax(-1).gather(1, ids[0, len(episode.prompt_ids) :, None])[:, 0]
    return picked.cpu().tolist()


def summarize(episodes: list[Episode], *, success_threshold: float = 1.0) -> dict[str, float]:
    """Mean score, pass@1, pass@k and pass^k (k = group size), turns, tool-call/error and truncation rates
    (``truncation_rate``: episodes a limit cut; ``cut_turn_rate``: model turns cut at the per-turn ``max_new_tokens``,
    whose text went to the env as it was, the episode going on or ending as the env decided);
    ``ending/REASON``: how many episodes ended each way (:attr:`Episode.finish_reason`, e.g. ``ending/done``,
    ``ending/max_turns``); ``score/NAME``: the mean of each score component (:attr:`Episode.score_components`) over the
    episodes that have it, and ``scored/NAME``: how many have it (an env leaves out a component a task has nothing to
    check for; failed episodes have none); and ``episodes/node/ID``: episodes whose env lived on each Ray node
    (:attr:`Episode.worker`), when they ran on Ray.

    pass@k is the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` per task (``c`` successes of ``n`` samples, success
    meaning ``score >= success_threshold``); pass^k (all of k succeed) is ``C(c, k) / C(n, k)``; both averaged over
    tasks.
    """
    if not episodes:
        return {}
    groups: dict[int, list[Episode]] = {}
    for episode in episodes:
        groups.setdefault(episode.task_seed, []).append(episode)
    k = min(len(g) for g in groups.values())
    pass_at_k, pass_hat_k, pass_at_1 = [], [], []
    for group in groups.values():
        n, c = len(group), sum(e.score >= success_threshold for e in group)
        pass_at_1.append(c / n)
        pass_at_k.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
        pass_hat_k.append(math.comb(c, k) / math.comb(n, k))
    turns = sum(e.turns for e in episodes)
    nodes: dict[str, int] = {}
    for episode in episodes:
        if episode.worker.get("node"):
            nodes[episode.worker["node"]] = nodes.get(episode.worker["node"], 0) + 1
    calls = sum(e.num_tool_calls for e in episodes)
    components: dict[str, list[float]] = {}
    endings: dict[str, int] = {}
    for episode in episodes:
        for name, value in episode.score_components.items():
            components.setdefault(name, []).append(value)
        reason = episode.finish_reason or ("error" if episode.error is not None else "unknown")
        endings[reason] = endings.get(reason, 0) + 1
    return {
        "episodes": float(len(episodes)),
        "tasks": float(len(groups)),
        "k": float(k),
        "mean_score": sum(e.score for e in episodes) / len(episodes),
        "pass@1": sum(pass_at_1) / len(pass_at_1),
        f"pass@{k}": sum(pass_at_k) / len(pass_at_k),
        f"pass^{k}": sum(pass_hat_k) / len(pass_hat_k),
        "mean_turns": turns / len(episodes),
        "tool_calls_per_turn": calls / turns if turns else 0.0,
        "tool_error_rate": sum(e.tool_errors for e in episodes) / calls if calls else 0.0,
        "truncation_rate": sum(e.truncated for e in episodes) / len(episodes),
        "cut_turn_rate": sum(r == "length" for e in episodes for r in e.turn_finish_reasons) / turns if turns else 0.0,
        "error_rate": sum(e.error is not None for e in episodes) / len(episodes),
        **{f"ending/{reason}": float(count) for reason, count in sorted(endings.items())},
        **{f"score/{name}": sum(values) / len(values) for name, values in sorted(components.items())},
        **{f"scored/{name}": float(len(values)) for name, values in sorted(components.items())},
        **{f"episodes/node/{node}": float(count) for node, count in sorted(nodes.items())},
    }
