"""envkit validate's reset check (check 2) on envs that name their tasks in ``info["task_id"]`` (issue 39 item 4,
issue 38 class 7): one seed gives one id on every instance, the seeds give enough distinct tasks, and an id names
the task, not the seed."""

from __future__ import annotations

from capitals import CapitalsEnv
from sql_env import OrdersSqlEnv

from envkit.validate import FAIL, PASS, WARN, validate_env


def check_2(env_cls, episodes=8):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes)
    return next(c for c in report.checks if c.id == 2), report


def test_repeated_questions_over_per_seed_databases_count_as_distinct_tasks():
    check, report = check_2(OrdersSqlEnv)
    assert check.status == PASS, check
    assert check.reason == (
        "well-formed and seeded; info['task_id'] names 8 distinct tasks over 8 seeds (openings repeat: hidden task "
        "state)"
    )
    assert check.details["distinct_tasks"] == 8 and check.details["distinct_fraction"] == 3 / 8
    assert not report.failed


def test_an_id_that_changes_between_fresh_instances_fails():
    class Counted(OrdersSqlEnv):
        made = 0  # on the class: every instance counts on

        def reset(self, *, seed=None, options=None):
            opening, info = super().reset(seed=seed, options=options)
            type(self).made += 1
            return opening, {"task_id": f"{info['task_id']}/{type(self).made}"}

    check, _ = check_2(Counted)
    assert check.status == FAIL and "reset(seed=0) on two fresh instances gave different info" in check.reason
    assert "task_id" in check.reason


def test_an_id_drawn_from_what_earlier_resets_left_fails():
    """Fresh instances agree; one instance reset for another seed first gives another id: the held-out check of
    envkit train, which resets one instance for every seed, would compare the wrong ids."""

    class LastQuestion(OrdersSqlEnv):
        def __init__(self):
            super().__init__()
            self.previous = ""

        def reset(self, *, seed=None, options=None):
            opening, info = super().reset(seed=seed, options=options)
            task_id, self.previous = f"{self.previous}>{info['task_id']}", info["task_id"]
            return opening, {"task_id": task_id}

    check, _ = check_2(LastQuestion)
    assert check.status == FAIL, check
    # Reset in reverse seed order: seed 7 first, on a fresh instance, then seed 6 after it.
    assert check.reason.startswith("seed 6: reset(seed=6) gave info['task_id']='>")
    assert "on a fresh instance and" in check.reason and "on one that had reset other seeds" in check.reason
    assert "not from state an earlier reset or episode left" in check.hint


def test_seeds_that_collapse_to_few_tasks_warn():
    class QuestionOnly(OrdersSqlEnv):  # the id ignores the database: 3 questions over 8 seeds
        def reset(self, *, seed=None, options=None):
            opening, _ = super().reset(seed=seed, options=options)
            return opening, {"task_id": self.question}

    check, _ = check_2(QuestionOnly)
    assert check.status == WARN, check
    assert check.reason == "the 8 seeds give only 3 distinct tasks by info['task_id']"
    assert check.details["distinct_tasks"] == 3


def test_an_id_that_names_the_seed_not_the_task_warns():
    """CapitalsEnv has 5 questions: 8 seeds with 8 ids repeat some, and the oracle plays the repeats alike."""

    class SeedAsId(CapitalsEnv):
        def reset(self, *, seed=None, options=None):
            opening, _ = super().reset(seed=seed, options=options)
            return opening, {"task_id": str(seed)}

    check, _ = check_2(SeedAsId)
    assert check.status == WARN, check
    assert "have different info['task_id']" in check.reason
    assert "the same opening messages and the same oracle episode" in check.reason
    assert "not the seed" in check.hint


def test_an_id_that_is_not_a_str_fails_and_one_given_for_some_seeds_warns():
    class ListId(OrdersSqlEnv):
        def reset(self, *, seed=None, options=None):
            opening, info = super().reset(seed=seed, options=options)
            return opening, {"task_id": [info["task_id"]]}

    check, _ = check_2(ListId)
    assert check.status == FAIL and check.reason.startswith("seed 0: reset() returned info['task_id']=[")
    assert "a task id is a non-empty str" in check.reason

    class SomeNamed(OrdersSqlEnv):
        def reset(self, *, seed=None, options=None):
            opening, info = super().reset(seed=seed, options=options)
            return opening, info if seed % 2 else {}

    check, _ = check_2(SomeNamed)
    assert check.status == WARN and check.reason == "info['task_id'] is given for 4 of 8 seeds (not for seed 0)"


def test_guess_number_names_its_hidden_number():
    """The built-in whose tasks differ in hidden state: in a fixed range every opening is the same, the ids are not."""
    from envkit.envs.guess_number import GuessNumberEnv

    class FixedRange(GuessNumberEnv):
        def __init__(self):
            super().__init__(low=1, high=32)

    check, _ = check_2(FixedRange)
    assert check.status == PASS and check.details["distinct_fraction"] == 1 / 8
    assert "info['task_id'] names 8 distinct tasks over 8 seeds" in check.reason
    env = FixedRange()
    ids = {env.reset(seed=seed)[1]["task_id"]: env.target for seed in range(64)}
    assert len(ids) == len(set(ids.values())) < 32  # one id per hidden number: seeds that hide one number agree
