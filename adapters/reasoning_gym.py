"""reasoning-gym datasets as envkit envs: ``envkit.make("reasoning-gym:leg_counting", **config)``.

Needs ``pip install -e '.[reasoning-gym]'``. Every procedural dataset of `reasoning-gym
<https://github.com/open-thought/reasoning-gym>`_ (``reasoning_gym.factory.DATASETS``, 100+) is one env.

Task seed → item: the env builds the dataset once, ``reasoning_gym.create_dataset(NAME, seed=seed, size=size,
**config)`` (``seed`` defaults to 0, ``size`` to the dataset's own default, usually 500), and task seed ``s`` is item
``s % size`` of it. So the env's tasks are exactly the items of that reasoning-gym dataset, in its order (seed 0 is item
0), and a run is reproducible with reasoning-gym alone. Indexing a fixed dataset (rather than building one dataset per
seed) is what reasoning-gym's own seed/size contract describes, and it builds each dataset once: some build all their
items up front (``acre``) or load data files (``arc_agi``, ``figlet_font``), which would otherwise happen every reset.
Datasets are cached per process and shared between envs (``__getitem__`` is a pure function of the index). Pass a
larger ``size`` for more distinct tasks than the default.

Answering, chosen with ``answer_mode``:

* ``"text"`` (default): one assistant turn. The answer is the content of the *last* ``<answer>…</answer>`` tag of the
  reply (``reasoning_gym.utils.extract_answer``, reasoning-gym's own convention; the system prompt is its ``default``
  prompt, which asks for that tag). A reply without the tag answers nothing and scores 0.
* ``"tool"``: a tool env with one tool, ``submit_answer(answer: str)``, which ends the episode; a turn without tool
  calls ends it too (unanswered, 0). Up to ``max_turns`` (4) turns, so a malformed call can be retried.

Score: the dataset's own ``score_answer(answer, entry)`` (partial credit where the dataset gives it); a scorer that
raises scores 0. reasoning-gym's scorers return values in [0, 1] (checked over every dataset of reasoning-gym 0.1.25:
only float rounding strays, e.g. ``spell_backward``'s 1.0000000000000002, which counts as 1.0); nothing is clipped.
A dataset whose scorer has another range (one registered with ``reasoning_gym.register_dataset`` that gives points,
say) declares it with ``reward_range=[lo, hi]``, mapped linearly onto [0, 1]; a value outside the range (or not a
finite number) fails the episode, its message naming ``reward_range``.

Oracle: the item's reference ``answer`` (datasets whose items have none, such as ``boxnet``, have no oracle). Every
other keyword of ``envkit.make`` goes to the dataset's config class (e.g. ``min_animals=2``); ``system_prompt=``
replaces the system prompt.
"""

from __future__ import annotations

import difflib
import json
import threading
from typing import Any, ClassVar

from envkit.adapters._adapted import SpecBuilt, class_name, reward_range_config, scaled_score
from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, tool
from envkit.registry import EnvSpecError

PREFIX = "reasoning-gym"

TOOL_SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and specific manner. "
    "When you have the answer, call the submit_answer tool with the final answer only (no explanation), in the format "
    "the question asks for. When an example is provided, strictly follow the format of the answer in that example."
)

_DATASETS: dict[str, Any] = {}
_DATASETS_LOCK = threading.Lock()


def _dataset(name: str, config: dict[str, Any]) -> Any:
    """The reasoning-gym dataset ``name`` built with ``config`` (cached per process)."""
    key = f"{name} {json.dumps(config, sort_keys=True, default=repr)}"
    with _DATASETS_LOCK:
        if key not in _DATASETS:
            import reasoning_gym

            try:
                _DATASETS[key] = reasoning_gym.create_dataset(name, **config)
            except Exception as error:  # unknown fields (TypeError), failed validate() (AssertionError), ...
                detail = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise EnvSpecError(f"{PREFIX}:{name}: invalid dataset config {config}: {detail}") from None
            if len(_DATASETS) > 64:  # a long-lived process that builds many configs
                del _DATASETS[next(iter(_DATASETS))]
        return _DATASETS[key]


def env_class(rest: str) -> type[ReasoningGymEnv]:
    """The env class of ``reasoning-gym:NAME``."""
    from reasoning_gym.factory import DATASETS

    name = rest.strip()
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EnvSpecError(
            f"reasoning-gym has no dataset {name!r}; {hint}{len(DATASETS)} datasets exist "
            "(python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))')"
        )
    return type(
        class_name("ReasoningGym", name),
        (ReasoningGymEnv,),
        {
            "dataset_name": name,
            "envkit_spec": f"{PREFIX}:{name}",
            "__module__": __name__,
            "__doc__": f"The reasoning-gym dataset {name!r}; see {__name__}.",
        },
    )


class ReasoningGymEnv(SpecBuilt, ToolEnv):
    """One reasoning-gym dataset as an env; subclassed per dataset by :func:`env_class` (see the module docstring)."""

    max_turns: ClassVar[int] = 4
    dataset_name: ClassVar[str] = ""
    _shared = ("dataset",)

    def __init__(
        self,
        answer_mode: str = "text",
        system_prompt: str | None = None,
        reward_range: tuple[float, float] | list[float] | None = None,
        **config: Any,
    ) -> None:
        super().__init__()
        if answer_mode not in ("text", "tool"):
            raise EnvSpecError(f"answer_mode must be 'text' or 'tool', got {answer_mode!r}")
        self._remember(
            {"answer_mode": answer_mode, "system_prompt": system_prompt, "reward_range": reward_range, **config}
        )
        self.reward_range = reward_range_config(reward_range, self.envkit_spec)
        self.answer_mode = answer_mode
        if system_prompt is None:
            from reasoning_gym.utils import SYSTEM_PROMPTS

            system_prompt = SYSTEM_PROMPTS["default"] if answer_mode == "text" else TOOL_SYSTEM_PROMPT
        self.system_prompt = system_prompt
        self.dataset_config = {"seed": 0, **config}
        self.dataset = _dataset(self.dataset_name, self.dataset_config)
        self.size = len(self.dataset)
        if self.size < 1:
            raise EnvSpecError(f"{self.envkit_spec}: the dataset is empty (size={self.size})")
        self.index = 0
        self.entry: dict[str, Any] = {}
        self.submitted: str | None = None
        self._scored: tuple[str | None, float] | None = None

    @property
    def tools(self) -> list[dict[str, Any]]:
        """``submit_answer``'s schema in tool mode; no tools in text mode."""
        return super().tools if self.answer_mode == "tool" else []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Item ``seed % size`` of the dataset (a random item when ``seed`` is None)."""
        super().reset(seed=seed, options=options)
        if seed is None:
            seed = int(self.np_random.integers(self.size))
        self._started(seed, options)
        self.index = int(seed) % self.size
        self.entry = self.dataset[self.index]
        self.submitted, self._scored = None, None
        opening = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": str(self.entry["question"])},
        ]
        return opening, {"dataset": self.dataset_name, "index": self.index}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Tool mode: run the tool calls. Text mode: the reply's last ``<answer>`` tag is the answer; the episode
        ends."""
        if self.answer_mode == "tool":
            return super().step(action)
        from reasoning_gym.utils import extract_answer

        content = action.get("content") if isinstance(action, dict) else action
        self.submitted = extract_answer(content) if isinstance(content, str) else None
        score = self.score()
        return [], score, True, False, {"answer": self.submitted}

    @tool
    def submit_answer(self, answer: str) -> str:
        """Submit the final answer; this ends the episode.

        Args:
            answer: The final answer only, in the format the question asks for.
        """
        self.submitted = answer
        self.end_episode()
        return "Answer submitted."

    def score(self) -> float:
        """The dataset's ``score_answer`` for the submitted answer (0 when nothing was submitted), mapped from
        ``reward_range`` onto [0, 1]; ``ValueError`` for a value outside it (see the module docstring)."""
        if self.submitted is None:
            return 0.0
        if self._scored is None or self._scored[0] != self.submitted:
            try:
                value = self.dataset.score_answer(self.submitted, self.entry)
            except Exception:  # a scorer that cannot parse the answer: a wrong answer
                value = self.reward_range[0] if self.reward_range else 0.0
            what = f"score_answer value of item {self.index}"
            self._scored = (self.submitted, scaled_score(value, self.reward_range, self.envkit_spec, what))
        return self._scored[1]

    def oracle(self) -> Message | None:
        """The item's reference answer, in an ``<answer>`` tag (text mode) or through ``submit_answer`` (tool mode)."""
        answer = self.entry.get("answer")
        if answer is None:
            return None
        if self.answer_mode == "text":
            return {"role": "assistant", "content": f"<answer>{answer}</answer>"}
        call = {"type": "function", "function": {"name": "submit_answer", "arguments": {"answer": str(answer)}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
