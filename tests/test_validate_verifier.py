"""The verifier checks: a score that changes when read again or replayed fails check 16; a canary that beats doing
nothing fails check 17, named; correct envs, the built-in ones included, pass both."""

from __future__ import annotations

import broken_envs as broken
import pytest

import envkit
from envkit.validate import FAIL, PASS, SKIP, validate_env

VERIFIER, CANARIES = 16, 17


def run(env_cls, episodes=4):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes)
    return {c.id: c for c in report.checks}


def others_pass(by_id, *ids):
    return {i: (c.status, c.reason) for i, c in by_id.items() if i not in ids and c.status != PASS}


def test_a_correct_env_passes_both_verifier_checks():
    by_id = run(broken.GoodText)
    assert by_id[VERIFIER].status == PASS and "replayed on fresh envs score the same" in by_id[VERIFIER].reason
    assert by_id[VERIFIER].details["episodes_checked"] == 16  # four policies on four seeds
    canaries = by_id[CANARIES]
    assert canaries.status == PASS and '"every fruit at once"' in canaries.reason and "no-op floor" in canaries.reason
    assert canaries.details == {"canaries": ["every fruit at once", "the win claimed"], "played": 8}


def test_a_score_that_changes_when_read_again_fails_verifier_determinism_alone():
    by_id = run(broken.JudgeSamplesOnEveryRead)
    check = by_id.pop(VERIFIER)
    assert check.status == FAIL and check.rfc008 == "semantic.verifier_determinism"
    assert "[random]: score() read 3 times on the same final state gave" in check.reason
    assert "self.np_random" in check.hint
    assert not others_pass(by_id)


def test_a_score_that_differs_on_a_fresh_env_fails_verifier_determinism_alone():
    by_id = run(broken.JudgeSeededPerInstance)
    check = by_id.pop(VERIFIER)
    assert check.status == FAIL
    assert "the same actions replayed on a fresh env give the same transcript but score() =" in check.reason
    assert "the first time" in check.reason and "per-instance judge seed" in check.hint
    assert not others_pass(by_id)


def test_episodes_that_do_not_replay_leave_the_verifier_unchecked_not_failed():
    by_id = run(broken.NondeterministicFeedback)
    assert by_id[5].status == FAIL
    check = by_id[VERIFIER]
    assert check.status == SKIP and check.reason.endswith("(see check 5)")
    assert "see replay determinism" in check.details["finding"]  # its own finding is kept


def test_a_canary_that_wins_fails_the_canary_check_naming_it():
    by_id = run(broken.RegexAnswer)
    check = by_id.pop(CANARIES)
    assert check.status == FAIL and check.rfc008 == "semantic.canary_floor"
    assert check.reason.startswith(
        "canary 'a pattern that matches anything' scores 1.000 on seed 0, above the no-op floor"
    )
    assert len(check.details["hacked"]) == 4 and "every fruit at once" in check.details["canaries"]
    assert not others_pass(by_id)


def test_an_env_without_canaries_skips_the_check():
    by_id = run(broken.CrashingTool)
    assert by_id[CANARIES].status == SKIP and "defines no canaries()" in by_id[CANARIES].reason
    assert envkit.Env.canaries(broken.CrashingTool()) == {}


class EmptyCanaries(broken.GoodText):
    def canaries(self):
        return {}


class CanariesNotADict(broken.GoodText):
    def canaries(self):
        return [["banana"]]


class CanaryOfNumbers(broken.GoodText):
    def canaries(self):
        return {"numbers": [1, 2]}


class CanariesRaise(broken.GoodText):
    def canaries(self):
        raise KeyError("no canary file")


class CanaryCrashes(broken.GoodText):
    def canaries(self):
        return {"crash": ["boom"]}

    def step(self, action):
        if action["content"] == "boom":
            raise RuntimeError("canary crashed the env")
        return super().step(action)


class FloorAboveZero(broken.GoodText):
    """Doing nothing earns 0.2 here: a canary at 0.2 is at the floor, not above it."""

    def score(self):
        return 1.0 if self.said else 0.2


@pytest.mark.parametrize(
    ("env_cls", "status", "words"),
    [
        (EmptyCanaries, SKIP, "names no canary on any seed"),
        (CanariesNotADict, FAIL, "returned a list, not a dict of named action lists"),
        (CanaryOfNumbers, FAIL, "canary 'numbers' holds a int action"),
        (CanariesRaise, FAIL, "canaries() [canaries, seed 0] raised KeyError: 'no canary file'"),
        (CanaryCrashes, FAIL, "canary 'crash' on seed 0: step() on action"),
        (FloorAboveZero, PASS, "score at most the no-op floor on every seed (best 0.200)"),
    ],
)
def test_canaries_of_the_wrong_shape_or_that_crash_fail_with_the_reason(env_cls, status, words):
    check = run(env_cls, episodes=2)[CANARIES]
    assert check.status == status and words in check.reason, check
    assert status != FAIL or "canaries()" in check.hint or "must not raise" in check.hint


@pytest.mark.parametrize("name", ["hotel-booking", "guess-number", "arithmetic"])
def test_every_builtin_env_ships_canaries_and_they_stay_at_the_floor(name):
    cls = envkit.resolve(name)
    env = cls()
    env.reset(seed=0)
    assert env.canaries()
    check = run(cls)[CANARIES]
    assert check.status == PASS and check.details["canaries"] == list(env.canaries())


def test_arithmetic_s_canary_catches_a_score_that_accepts_any_submission():
    from envkit.envs.arithmetic import ArithmeticEnv

    class AnySubmissionCounts(ArithmeticEnv):
        def step(self, action):
            for call in action.get("tool_calls") or []:
                function = call.get("function", {}) if isinstance(call, dict) else {}
                arguments = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(arguments, dict) and function.get("name") == "submit_answer":
                    self.all_submitted = [*getattr(self, "all_submitted", []), arguments.get("answer")]
            return super().step(action)

        def score(self):
            submitted = [a for a in getattr(self, "all_submitted", []) if isinstance(a, (int, float))]
            return float(self.submitted is not None and any(abs(a - self.answer) < 1e-6 for a in submitted))

    check = run(AnySubmissionCounts)[CANARIES]
    assert check.status == FAIL and "canary 'the right answer between wrong ones' scores 1.000" in check.reason


def test_guess_number_s_canary_catches_a_score_that_reads_the_transcript():
    from envkit.envs.guess_number import GuessNumberEnv

    class CorrectInTranscript(GuessNumberEnv):
        def score(self):
            return 1.0 if any("Correct!" in str(m.get("content")) for m in self.messages) else super().score()

    check = run(CorrectInTranscript)[CANARIES]
    assert check.status == FAIL and "canary 'the win claimed without a guess' scores 1.000" in check.reason


def test_hotel_booking_s_canaries_catch_a_score_that_trusts_the_agent_s_word():
    from envkit.envs.hotel_booking import HotelBookingEnv

    class TrustsClaims(HotelBookingEnv):
        def score(self):
            said = " ".join(str(m.get("content")) for m in self.messages if m["role"] == "assistant")
            return 1.0 if "All done" in said and "BK-" in said else super().score()

    check = run(TrustsClaims)[CANARIES]
    assert check.status == FAIL and "canary 'done claimed with every reference' scores 1.000" in check.reason
