"""The built-in envs: oracle solves every task, doing nothing scores ~0, determinism, variety, robustness."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import pytest
from helpers import call

import envkit
from envkit.envs.hotel_booking import HotelBookingEnv

SEEDS = range(200)
BUILTIN = ["hotel-booking", "guess-number", "arithmetic"]
APOLOGY = "I'm sorry, but I can't help with that request."


def play(env: envkit.Env, policy, seed: int, options: dict | None = None) -> envkit.Env:
    env.reset(seed=seed, options=options)
    while not env.done:
        env.step(policy(env))
    return env


def oracle(env):
    return env.oracle()


def hotel_configs():
    return [("hotel-booking", {"tier": t}) for t in ("easy", "medium", "hard")]


CONFIGS = [*hotel_configs(), ("guess-number", {}), ("arithmetic", {}), ("arithmetic", {"kinds": ["containers"]})]


@pytest.mark.parametrize(("name", "config"), CONFIGS)
def test_oracle_scores_one_on_200_seeds(name, config):
    env = envkit.make(name, **config)
    scores = [play(env, oracle, seed).score() for seed in SEEDS]
    assert scores == [1.0] * len(SEEDS)


@pytest.mark.parametrize(("name", "config"), CONFIGS)
@pytest.mark.parametrize("text", ["", APOLOGY])
def test_doing_nothing_or_apologising_scores_at_most_0_1(name, config, text):
    env = envkit.make(name, **config)
    assert max(play(env, lambda e: text, seed).score() for seed in SEEDS) <= 0.1


@pytest.mark.parametrize("name", BUILTIN)
def test_same_seed_same_task_and_transcript(name):
    first, second = envkit.make(name), envkit.make(name)
    for seed in (0, 17, 123):
        assert play(first, oracle, seed).messages == play(second, oracle, seed).messages
        scripted = ["hello", call("search_hotels", city="Lisbon"), "42"]
        transcripts = []
        for env in (first, second):
            env.reset(seed=seed)
            for action in scripted:
                if not env.done:
                    env.step(action)
            transcripts.append(env.messages)
        assert transcripts[0] == transcripts[1]


@pytest.mark.parametrize("name", BUILTIN)
def test_at_least_95_percent_distinct_tasks(name):
    env = envkit.make(name)
    openings = {json.dumps(env.reset(seed=seed)[0]) for seed in SEEDS}
    assert len(openings) >= 0.95 * len(SEEDS)


@pytest.mark.parametrize(("name", "gym_id"), [(n, e[1]) for n, e in envkit.envs.BUILTINS.items()])
def test_registered_with_gymnasium(name, gym_id):
    env = gym.make(gym_id)
    assert isinstance(env.unwrapped, envkit.Env) and type(env.unwrapped) is type(envkit.make(name))
    observation, _ = env.reset(seed=0)
    assert observation[-1]["role"] == "user"
    observation, reward, _terminated, _truncated, _ = env.step(env.unwrapped.oracle())
    assert isinstance(observation, list) and isinstance(reward, float)


def _gymnasium_warnings(record: list) -> list[str]:
    wrapped = "is different from the unwrapped version"  # check_env's note on a gymnasium.make env, by design
    return [str(w.message) for w in record if wrapped not in str(w.message)]


@pytest.mark.parametrize("gym_id", sorted(i for i in gym.registry if i.startswith("envkit/")))
def test_every_registered_id_passes_gymnasiums_env_checker_with_no_skips(gym_id):
    """Gymnasium's own checker, render check included: it remakes the env with each declared render mode, which
    every constructor must accept; nothing it checks may warn either."""
    from gymnasium.utils.env_checker import check_env

    assert gym_id in {e[1] for e in envkit.envs.BUILTINS.values()}
    for render_mode in (None, "ansi"):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            env = gym.make(gym_id, render_mode=render_mode)
            check_env(env)
            check_env(env.unwrapped)
        assert _gymnasium_warnings(record) == []
        assert env.unwrapped.render_mode == render_mode
    env = gym.make(gym_id, render_mode="ansi")
    env.reset(seed=0)
    env.step(env.unwrapped.oracle())
    text = env.render()
    assert isinstance(text, str) and text == env.unwrapped.render() and "[user]" in text


USER_ENV = '''
import envkit


class UserEnv(envkit.ToolEnv):
    def __init__(self, target: int = 3):
        super().__init__()
        self.target = target

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.said = None
        return [{"role": "user", "content": f"Say {self.target}."}], {}

    @envkit.tool
    def say(self, number: int) -> str:
        """Say a number.

        Args:
            number: The number.
        """
        self.said = number
        self.end_episode()
        return "ok"

    def score(self):
        return float(self.said == self.target)
'''


def test_a_user_env_registered_with_gymnasium_takes_render_mode_without_naming_it(tmp_path, monkeypatch):
    """A user's constructor names no render_mode; envkit.Env takes it for it, and refuses an unknown mode in one
    line."""
    from gymnasium.utils.env_checker import check_env

    (tmp_path / "user_render_env.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    envkit.register("user-render-env", "user_render_env:UserEnv", gym_id="envkit-test/UserRender-v0")
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            env = gym.make("envkit-test/UserRender-v0", render_mode="ansi", target=5)
            check_env(env.unwrapped)
        assert _gymnasium_warnings(record) == []
        assert env.unwrapped.target == 5 and env.unwrapped.render_mode == "ansi"
        with pytest.raises(envkit.EnvSpecError, match="has no render mode 'rgb_array'; its render modes: ansi"):
            envkit.make("user-render-env", render_mode="rgb_array")
    finally:
        gym.registry.pop("envkit-test/UserRender-v0", None)
        envkit.registry.names._REGISTRY.pop("user-render-env", None)


ADVERSARIAL_ARGUMENTS = [
    ("search_hotels", {"city": 42}),
    ("search_hotels", {"city": "x" * 100_000}),
    ("search_hotels", {"city": "Lisbon'; DROP TABLE bookings; --"}),
    ("search_hotels", {"city": "Lisbon", "min_stars": "five"}),
    ("search_hotels", {"city": "Lisbon", "amenities": "pool"}),
    ("get_hotel_details", {"hotel_id": "H-000"}),
    ("get_hotel_details", {"hotel_id": "{{7*7}} __import__('os').system('ls')"}),
    ("get_hotel_details", {}),
    ("check_availability", {"hotel_id": "H-1", "room_type": "double", "check_in": "tomorrow", "check_out": "x"}),
    (
        "book_room",
        {"guest_id": "G-0", "hotel_id": "H-0", "room_type": "x", "check_in": "1", "check_out": "2", "guests": 1},
    ),
    (
        "book_room",
        {"guest_id": "G-0", "hotel_id": "H-0", "room_type": "x", "check_in": "1", "check_out": "2", "guests": "many"},
    ),
    ("cancel_booking", {"booking_ref": "BK-NOPE"}),
    ("cancel_booking", {"booking_ref": ["BK-1"]}),
    ("list_bookings", {"guest_id": "\u202e\x00G-1"}),
    ("teleport", {"to": "moon"}),
]


@pytest.mark.parametrize(("tool_name", "arguments"), ADVERSARIAL_ARGUMENTS)
def test_hotel_adversarial_calls_are_tool_errors(tool_name, arguments):
    env = HotelBookingEnv()
    env.reset(seed=3)
    observation, _, terminated, _, info = env.step(call(tool_name, **arguments))
    assert observation[0]["role"] == "tool" and observation[0]["content"].startswith("Error:")
    assert info["tool_errors"] == 1 and not terminated
    assert len(observation[0]["content"]) <= HotelBookingEnv.max_tool_output_chars + 100


def test_hotel_real_failures_are_tool_errors():
    env = HotelBookingEnv()
    env.reset(seed=5, options={"tier": "medium"})
    task, world = env.task, env.world
    hotel_id, room = task.unavailable
    booking = dict(task.gold[0][1])
    full = env.step(call("book_room", **{**booking, "hotel_id": hotel_id, "room_type": room}))[0][0]["content"]
    assert full.startswith("Error: no ") and "available" in full
    capacity = world.hotels[booking["hotel_id"]].rooms[booking["room_type"]].capacity
    over = env.step(call("book_room", **{**booking, "guests": capacity + 1}))[0][0]["content"]
    assert over == f"Error: a {booking['room_type']} room holds at most {capacity} guests, not {capacity + 1}"
    backwards = {**booking, "check_in": booking["check_out"], "check_out": booking["check_in"]}
    assert env.step(call("book_room", **backwards))[0][0]["content"] == "Error: check_out must be after check_in"
    assert env.score() == 0.0


def test_search_results_are_capped_and_say_so():
    env = HotelBookingEnv()
    for seed in range(50):
        env.reset(seed=seed)
        city = max(
            {h.city for h in env.world.hotels.values()},
            key=lambda c: sum(h.city == c for h in env.world.hotels.values()),
        )
        if sum(h.city == city for h in env.world.hotels.values()) > 8:
            result = env.step(call("search_hotels", city=city))[0][0]["content"]
            assert "(showing 8 of 9; narrow the search)" in result
            assert result.count('"hotel_id"') == 8
            return
    pytest.fail("no world with a city of more than 8 hotels in 50 seeds")


class TestHotelScoring:
    """Partial credit as documented on HotelBookingEnv."""

    def solved_until_report(self, seed, options):
        env = HotelBookingEnv()
        env.reset(seed=seed, options=options)
        while True:
            action = env.oracle()
            if not action.get("tool_calls") and "reference" in action["content"]:
                return env
            env.step(action)

    def test_exact_changes_without_telling_the_reference(self):
        env = self.solved_until_report(1, {"tier": "easy"})
        assert env.score() == pytest.approx(0.8)
        env.step(env.oracle())
        assert env.score() == 1.0 and env.done

    def test_booking_the_wrong_room_earns_partial_credit(self):
        env = HotelBookingEnv()
        env.reset(seed=2, options={"tier": "easy"})
        booking = dict(env.task.gold[0][1])
        hotel = env.world.hotels[booking["hotel_id"]]
        other_room = next(r for r in hotel.rooms if r != booking["room_type"])
        env.world.availability[(hotel.id, other_room)] = [3] * len(env.world.availability[(hotel.id, other_room)])
        env.step(call("book_room", **{**booking, "room_type": other_room, "guests": 1}))
        expected = 0.7 * (0.4 + 0.3 + 0.1 * (booking["guests"] == 1))
        assert env.score() == pytest.approx(expected)

    def test_skipping_the_price_confirmation_halves_the_score(self):
        env = HotelBookingEnv()
        env.reset(seed=4, options={"tier": "hard", "kind": "hidden_confirm"})
        env.step(call("book_room", **env.task.gold[0][1]))
        ref = next(iter(b.ref for b in env._created(env.world)))
        env.step(f"Booked, reference {ref}.")
        assert env.policy_broken
        assert env.score() == pytest.approx(0.5 * (0.7 + 0.1 + 0.15))

    def test_cancelling_the_wrong_booking_scores_zero(self):
        env = HotelBookingEnv()
        env.reset(seed=6, options={"tier": "hard", "kind": "cancel_city"})
        target = env.task.gold[0][1]["booking_ref"]
        other = next(ref for ref, b in env.world.bookings.items() if ref != target and b.guest_id == env.task.guest_id)
        env.step(call("cancel_booking", booking_ref=other))
        assert env.score() == 0.0

    def test_hidden_facts_are_only_given_when_asked(self):
        env = HotelBookingEnv()
        opening, _ = env.reset(seed=8, options={"tier": "hard", "kind": "hidden_confirm"})
        assert "guest" not in opening[-1]["content"].split(")")[-1]
        reply = env.step("Sure, I will look for a hotel.")[0][0]["content"]
        assert reply == "Could you please take care of my request?"
        reply = env.step("How many people are travelling?")[0][0]["content"]
        assert reply.startswith("We are ")


class TestHotelAnswersAreStatedNotListed:
    """The guest must be told the right total and the right reference, not a list that contains them.

    Before this was closed, both lists below scored 1.0: the guest confirmed any message whose numbers included the
    gold total, and a reference counted as told when it appeared anywhere in the agent's messages.
    """

    def test_a_list_of_prices_containing_the_total_is_not_a_confirmation(self):
        env = HotelBookingEnv()
        env.reset(seed=4, options={"tier": "hard", "kind": "hidden_confirm"})
        while "Shall I book" not in (action := env.oracle())["content"]:
            env.step(action)
        total = next(b.total_price for b in env._created(env.gold))
        prices = sorted({r.price * n for h in env.world.hotels.values() for r in h.rooms.values() for n in range(1, 6)})
        assert total in prices and len(prices) > 10
        listed = "The stay costs one of " + ", ".join(f"{p} EUR" for p in prices) + " in total. Shall I book it?"
        reply = env.step(listed)[0][0]["content"]
        assert not env.price_confirmed
        assert reply == "You mentioned several prices. What is the total price of the stay?"
        env.step(call("book_room", **env.task.gold[0][1]))  # booking without a real confirmation breaks the policy
        ref = next(b.ref for b in env._created(env.world))
        env.step(f"Booked, reference {ref}.")
        assert env.policy_broken and env.score() < 1.0

    def test_the_total_stated_with_the_stays_facts_confirms(self):
        env = HotelBookingEnv()
        env.reset(seed=4, options={"tier": "hard", "kind": "hidden_confirm"})
        while "Shall I book" not in (action := env.oracle())["content"]:
            env.step(action)
        booking = next(b for b in env._created(env.gold))
        nightly = env.gold.hotels[booking.hotel_id].rooms[booking.room_type].price
        nights = (booking.check_out - booking.check_in).days
        text = (
            f"A {booking.room_type} room at {booking.hotel_id} for {booking.guests} guests, {nights} nights from "
            f"{booking.check_in} to {booking.check_out}: {nightly} EUR per night, {booking.total_price:,} EUR in "
            "total. Shall I book it?"
        )
        assert env.step(text)[0][0]["content"] == "Yes, that price is fine. Please go ahead and book it."
        while not env.done:
            env.step(env.oracle())
        assert env.score() == 1.0

    def test_a_list_of_references_containing_the_right_one_is_not_telling(self):
        env = HotelBookingEnv()
        env.reset(seed=6, options={"tier": "hard", "kind": "cancel_city"})
        env.step(env.oracle())  # list_bookings
        env.step(env.oracle())  # cancel_booking
        everything = ", ".join(sorted(env.world.bookings))
        reply = env.step(f"Cancelled one of: {everything}.")[0][0]["content"]
        assert reply == "Thanks. What is the booking reference?"
        assert env.score() == pytest.approx(0.8)
        env.step(env.oracle())  # the one reference, alone
        assert env.score() == 1.0 and env.done


def test_arithmetic_kinds_restrict_the_problems_and_keep_the_task_space_wide():
    """``kinds`` picks problem kinds by name (the learning benchmark trains on one); all four by default, with the
    same tasks per seed as before the option existed; a bad value is one clear error."""
    from envkit.envs.arithmetic import KINDS

    one = envkit.make("arithmetic", kinds=["containers"])
    questions = {one.reset(seed=seed)[0][-1]["content"] for seed in SEEDS}
    assert len(questions) == len(SEEDS) and all(" holds " in q and "gives away" in q for q in questions)
    every = envkit.make("arithmetic")
    default = [every.reset(seed=seed)[0][-1]["content"] for seed in SEEDS]
    assert default == [envkit.make("arithmetic", kinds=list(KINDS)).reset(seed=s)[0][-1]["content"] for s in SEEDS]
    assert not all(" holds " in q for q in default)
    for bad in ("containers", [], ["algebra"]):
        with pytest.raises(ValueError, match="kinds must be a non-empty list of containers, prices, sharing, travel"):
            envkit.make("arithmetic", kinds=bad)
