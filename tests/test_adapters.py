"""Envs from other libraries through the real packages: ``reasoning-gym:``, ``textarena:`` and ``trl:`` specs.

Each family is skipped, with the install command as the reason, when its package is missing.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import pickle
import random
import threading

import numpy as np
import pytest
from helpers import CheckedOracleBackend, call, forgotten_adapter_classes, play_oracle

import envkit
from envkit.backends import SamplingParams
from envkit.cli.app import main as cli_main
from envkit.registry import EnvSpecError, resolve
from envkit.rollout import RolloutEngine

needs_reasoning_gym = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None,
    reason="reasoning-gym is not installed: pip install -e '.[reasoning-gym]'",
)
needs_textarena = pytest.mark.skipif(
    importlib.util.find_spec("textarena") is None, reason="textarena is not installed: pip install -e '.[textarena]'"
)


@pytest.fixture(autouse=True, scope="module")
def _forget_adapter_classes():
    """Drop the adapter classes these tests resolved (the registry caches them per spec), so later tests that fake a
    missing package see a fresh registry."""
    with forgotten_adapter_classes():
        yield


def text(content: str) -> dict:
    return {"role": "assistant", "content": content}


def run_engine(spec_or_factory, tokenizer, seeds, replica_factory=None, **config):
    factory = spec_or_factory if callable(spec_or_factory) else (lambda: envkit.make(spec_or_factory, **config))
    backend = CheckedOracleBackend(replica_factory or factory, tokenizer, seeds)
    return RolloutEngine(factory, backend, tokenizer).run(list(seeds), 2, SamplingParams())


# -- reasoning-gym ---------------------------------------------------------------------------------------------------


@needs_reasoning_gym
def test_reasoning_gym_task_seed_is_an_index_into_the_reasoning_gym_dataset():
    import reasoning_gym

    env = envkit.make("reasoning-gym:leg_counting")
    dataset = reasoning_gym.create_dataset("leg_counting", seed=0, size=500)
    for seed in (0, 1, 7, 499):
        opening, info = env.reset(seed=seed)
        assert [m["role"] for m in opening] == ["system", "user"]
        assert opening[1]["content"] == dataset[seed]["question"] and info["index"] == seed
    questions = {env.reset(seed=s)[0][1]["content"] for s in range(20)}
    assert len(questions) == 20  # different seeds, different items
    assert env.reset(seed=500)[0] == env.reset(seed=0)[0]  # seeds wrap around the dataset's size
    other = envkit.make("reasoning-gym:leg_counting", seed=42, size=10, min_animals=2, max_animals=3)
    expected = reasoning_gym.create_dataset("leg_counting", seed=42, size=10, min_animals=2, max_animals=3)
    assert other.reset(seed=13)[0][1]["content"] == expected[3]["question"]


@needs_reasoning_gym
def test_reasoning_gym_text_answers_are_the_last_answer_tag_scored_by_the_dataset():
    env = envkit.make("reasoning-gym:leg_counting")
    assert env.tools == []
    opening, _ = env.reset(seed=3)
    assert "<answer>" in opening[0]["content"]  # reasoning-gym's own default system prompt names the tag
    right = env.entry["answer"]
    observation, reward, terminated, truncated, info = env.step(text(f"Counting... <answer>{right}</answer>"))
    assert (observation, reward, terminated, truncated, info["answer"]) == ([], 1.0, True, False, right)
    cases = {
        f"<answer>1</answer> no wait: <answer>{right}</answer>": 1.0,
        f"<answer>{right}</answer> no wait: <answer>1</answer>": 0.0,
        f"The answer is {right}.": 0.0,  # no tag, no answer
        "": 0.0,
    }
    for reply, expected in cases.items():
        env.reset(seed=3)
        env.step(text(reply))
        assert env.score() == expected, reply
    env.reset(seed=3)  # partial credit comes from the dataset's own scorer
    env.step(text(f"<answer>{right} legs</answer>"))
    assert env.score() == env.dataset.score_answer(f"{right} legs", env.entry) < 1.0


@needs_reasoning_gym
def test_reasoning_gym_tool_mode_submits_through_submit_answer():
    env = envkit.make("reasoning-gym:basic_arithmetic", answer_mode="tool")
    assert [t["function"]["name"] for t in env.tools] == ["submit_answer"]
    env.reset(seed=5)
    observation, reward, terminated, *_ = env.step(call("submit_answer", answer=env.entry["answer"]))
    assert observation[0]["content"] == "Answer submitted." and (reward, terminated) == (1.0, True)
    env.reset(seed=5)
    assert env.step(text(f"<answer>{env.entry['answer']}</answer>"))[1:3] == (0.0, True)  # text does not answer
    env.reset(seed=5)
    observation, *_ = env.step(call("submit_answer", reply="x"))
    assert observation[0]["content"].startswith("Error: invalid arguments") and not env.done


@needs_reasoning_gym
def test_reasoning_gym_errors_are_one_line():
    with pytest.raises(EnvSpecError, match="did you mean leg_counting"):
        envkit.make("reasoning-gym:leg_countin")
    with pytest.raises(EnvSpecError, match=r"invalid dataset config .*min_animals must be positive") as error:
        envkit.make("reasoning-gym:leg_counting", min_animals=0)
    assert "\n" not in str(error.value)
    with pytest.raises(EnvSpecError, match="answer_mode must be"):
        envkit.make("reasoning-gym:leg_counting", answer_mode="voice")


@needs_reasoning_gym
def test_reasoning_gym_envs_copy_and_pickle_mid_episode():
    env = envkit.make("reasoning-gym:leg_counting", answer_mode="tool", render_mode="ansi")
    env.reset(seed=2)
    env.step(call("submit_answer", answer="3"))
    for clone in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        assert clone.messages == env.messages and clone.score() == env.score() and clone.done
        assert clone.render_mode == "ansi" and clone.render() == env.render()
    assert copy.deepcopy(env).dataset is env.dataset  # the dataset generator is shared, not copied


@needs_reasoning_gym
@pytest.mark.parametrize(
    ("spec", "config"),
    [
        ("reasoning-gym:leg_counting", None),
        ("reasoning-gym:leg_counting", {"answer_mode": "tool"}),
        ("reasoning-gym:word_sorting", None),
    ],
)
def test_reasoning_gym_envs_pass_envkit_validate(spec, config, capsys):
    argv = ["validate", spec, "--episodes", "4"] + (["--env-config", json.dumps(config)] if config else [])
    assert cli_main(argv) == 0, capsys.readouterr().out


@needs_reasoning_gym
@pytest.mark.parametrize("answer_mode", ["text", "tool"])
def test_reasoning_gym_rollouts_score_through_the_engine(local_tokenizer, answer_mode):
    episodes = run_engine("reasoning-gym:leg_counting", local_tokenizer, [0, 1], answer_mode=answer_mode)
    assert [e.error for e in episodes] == [None] * 4
    assert [e.score for e in episodes] == [1.0] * 4


# -- TextArena -------------------------------------------------------------------------------------------------------


def connect_four_opponent(observation: str, rng: random.Random) -> str:
    """A scripted ConnectFour opponent (importable as test_adapters:connect_four_opponent)."""
    return f"[col {rng.randrange(7)}]"


@needs_textarena
def test_textarena_guess_the_number_end_to_end():
    env = envkit.make("textarena:GuessTheNumber-v0")
    opening, info = env.reset(seed=1)
    assert info == {"game": "GuessTheNumber-v0", "players": 1}
    assert opening[0]["role"] == "user" and "You are playing Guess The Number" in opening[0]["content"]
    target = env.core.game_number
    wrong = 1 if target > 1 else 2
    observation, reward, terminated, *_ = env.step(text(f"I guess [{wrong}]"))
    hint = "higher" if wrong < target else "lower"
    assert observation == [{"role": "user", "content": f"The target number is {hint}."}] and not terminated
    observation, reward, terminated, *_ = env.step(env.oracle())
    assert observation[0]["content"].startswith("Game over: Congratulations") and (reward, terminated) == (1.0, True)


@needs_textarena
def test_textarena_games_are_deterministic_per_seed_and_leave_global_random_alone():
    def transcript(seed, moves):
        env = envkit.make("textarena:TicTacToe-v0")
        env.reset(seed=seed)
        for move in moves:
            if not env.done:
                env.step(text(move))
        return env.messages, env.score()

    moves = ["[4]", "[0]", "[8]", "[2]", "[6]"]
    random.seed(1234)
    np.random.seed(99)
    before = (random.random(), np.random.rand())
    random.seed(1234)
    np.random.seed(99)
    first = transcript(3, moves)
    assert (random.random(), np.random.rand()) == before  # TextArena's seeding never reaches the caller's streams
    assert transcript(3, moves) == first
    assert len({json.dumps(transcript(s, moves)[0]) for s in range(6)}) > 1  # the opponent's moves follow the seed
    guesses = set()
    for seed in range(8):
        env = envkit.make("textarena:GuessTheNumber-v0")
        env.reset(seed=seed)
        guesses.add(env.core.game_number)
    assert len(guesses) > 3


@needs_textarena
def test_textarena_envs_in_threads_play_as_they_do_alone():
    moves = ["[0]", "[1]", "[2]", "[3]", "[4]", "[5]", "[6]", "[7]", "[8]"]

    def play(seed):
        env = envkit.make("textarena:TicTacToe-v0")
        env.reset(seed=seed)
        for move in moves:
            if not env.done:
                env.step(text(move))
        return env.messages

    alone = {seed: play(seed) for seed in range(8)}
    together: dict[int, list] = {}
    threads = [threading.Thread(target=lambda s=s: together.__setitem__(s, play(s))) for s in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone


@needs_textarena
def test_textarena_two_player_scores_win_draw_and_loss():
    env = envkit.make("textarena:TicTacToe-v0")
    assert play_oracle(env, 0) == 1.0 and "has won" in env.messages[-1]["content"]
    env.reset(seed=0)
    while not env.done:  # a move that is never legal: two invalid moves lose the game
        env.step(text("[9]"))
    assert env.score() == 0.0 and "Game over" in env.messages[-1]["content"]
    env.rewards = {0: 0, 1: 0}  # TextArena's draw
    assert env.score() == 0.5


@needs_textarena
def test_textarena_game_that_needs_a_download_fails_at_construction_in_one_line():
    import nltk

    try:
        nltk.data.find("corpora/words")
    except LookupError:
        pass
    else:
        pytest.skip("NLTK's words corpus is installed here: Hangman-v0 builds")
    with pytest.raises(EnvSpecError) as error:
        envkit.make("textarena:Hangman-v0")
    message = str(error.value)
    assert "needs NLTK data" in message and "python -m nltk.downloader words" in message and "\n" not in message


@needs_textarena
def test_textarena_refuses_what_it_cannot_play():
    with pytest.raises(EnvSpecError, match="did you mean TicTacToe-v0"):
        envkit.make("textarena:TicTacToe-v9")
    with pytest.raises(EnvSpecError, match="one- and two-player"):
        envkit.make("textarena:SecretMafia-v0")
    with pytest.raises(EnvSpecError, match="lists no moves for envkit's scripted opponent"):
        envkit.make("textarena:ConnectFour-v0")
    env = envkit.make("textarena:ConnectFour-v0", opponent="test_adapters:connect_four_opponent")
    env.reset(seed=0)
    observation, *_ = env.step(text("[col 3]"))
    assert "[Player 1] [col" in observation[0]["content"]


@needs_textarena
def test_textarena_envs_pickle_mid_episode():
    env = envkit.make("textarena:TicTacToe-v0")
    env.reset(seed=4)
    env.step(env.oracle())
    clone = pickle.loads(pickle.dumps(env))
    assert clone.messages == env.messages
    assert clone.step(text("[8]")) == env.step(text("[8]"))


@needs_textarena
@pytest.mark.parametrize("spec", ["textarena:TicTacToe-v0", "textarena:GuessTheNumber-v0"])
def test_textarena_games_pass_envkit_validate(spec, capsys):
    assert cli_main(["validate", spec, "--episodes", "4"]) == 0, capsys.readouterr().out


@needs_textarena
def test_textarena_rollouts_score_through_the_engine(local_tokenizer):
    episodes = run_engine("textarena:TicTacToe-v0", local_tokenizer, [0, 1])
    assert [e.error for e in episodes] == [None] * 4
    assert [e.score for e in episodes] == [1.0] * 4 and all(e.turns >= 3 for e in episodes)


# -- TRL environment_factory classes ---------------------------------------------------------------------------------


def test_trl_class_public_methods_are_the_tools_and_get_reward_the_score():
    from transformers.utils import get_json_schema
    from trl_style_envs import GuessingGame

    env = envkit.make("trl:trl_style_envs:GuessingGame", high=20)
    assert env.tools == [get_json_schema(GuessingGame.give_up), get_json_schema(GuessingGame.guess)]
    opening, info = env.reset(seed=3)
    assert opening == [{"role": "user", "content": "I am thinking of a whole number between 1 and 20. "
                        "Find it with the guess tool."}]  # fmt: skip
    assert info == {"row": {"task_seed": 3}} and env.instance.high == 20
    target = env.instance.target
    observation, reward, terminated, *_ = env.step(call("guess", number=21))
    assert observation[0]["content"] == "Error: guess failed with ValueError: 21 is out of range"
    observation, reward, terminated, *_ = env.step(call("guess", number=target))
    assert observation[0]["content"] == "Correct!" and reward == 1.0 and not terminated
    assert env.step(text("Found it."))[2] is True  # a turn without tool calls ends the episode, as in TRL's loop
    env.reset(seed=3)
    env.step(call("_private_helper"))
    assert env.messages[-1]["content"].startswith("Error: unknown tool '_private_helper'")


def test_trl_class_scored_by_reward_functions_with_dataset_rows():
    from trl_style_envs import capital_reward, lookup_rows

    env = envkit.make("trl:trl_style_envs:Lookup", dataset=lookup_rows(), reward_funcs=[capital_reward])
    opening, info = env.reset(seed=1)
    assert opening == [{"role": "user", "content": "What is the capital of Japan?"}]
    assert info == {"row": {"country": "Japan"}} and env.instance.country == "Japan"
    assert env.step(call("lookup_capital", country="Japan"))[0][0]["content"] == "Tokyo"
    observation, reward, *_ = env.step(call("answer", city="Tokyo"))  # an async tool
    assert observation[0]["content"] == "Noted." and reward == 1.0
    by_name = envkit.make(
        "trl:trl_style_envs:Lookup",
        dataset="trl_style_envs:lookup_rows",
        reward_funcs=["trl_style_envs:capital_reward"],
        reward_weights=[0.5],
        max_turns=2,
    )
    by_name.reset(seed=1)
    assert by_name.step(call("answer", city="Tokyo"))[1] == 0.5 and by_name.max_turns == 2
    by_name.reset(options={"row": {"country": "Peru", "prompt": "Capital of Peru?"}})
    assert by_name.messages == [{"role": "user", "content": "Capital of Peru?"}]


def test_trl_class_errors_name_the_fix(tmp_path):
    with pytest.raises(EnvSpecError, match="no get_reward\\(\\) method and no reward_funcs"):
        envkit.make("trl:trl_style_envs:Lookup")
    bad = tmp_path / "bad_trl_env.py"
    bad.write_text(
        "class NoReset:\n"
        "    def act(self, x: int) -> str:\n"
        "        '''Act.\n\n        Args:\n            x: X.\n        '''\n"
        "class Undocumented:\n"
        "    def reset(self, **kw):\n        return 'hi'\n"
        "    def act(self, x: int) -> str:\n        return 'ok'\n"
    )
    with pytest.raises(EnvSpecError, match="no reset method"):
        envkit.make(f"trl:{bad}:NoReset")
    with pytest.raises(EnvSpecError, match=r"tool Undocumented\.act has no docstring"):
        envkit.make(f"trl:{bad}:Undocumented")
    with pytest.raises(EnvSpecError, match="has no 'Missing'"):
        envkit.make("trl:trl_style_envs:Missing")


def test_trl_round_trip_of_to_environment_factory_keeps_tools_openings_and_scores():
    from envkit.adapters.trl import build_dataset
    from envkit.envs.arithmetic import ArithmeticEnv

    seeds = range(6)
    back = envkit.make("trl:trl_style_envs:ArithmeticForTRL", dataset=build_dataset(ArithmeticEnv, seeds))
    original = ArithmeticEnv()
    assert back.tools == original.tools
    for seed in seeds:
        assert back.reset(seed=seed)[0] == original.reset(seed=seed)[0]
        while not original.done:
            action = original.oracle()
            expected, got = original.step(action), back.step(action)
            assert got[0] == expected[0] and got[1] == expected[1]  # the same tool messages and score changes
        assert back.score() == original.score() == 1.0
        back.reset(seed=seed)
        back.step(call("submit_answer", answer=-1.5))
        assert back.score() == 0.0


def test_trl_classes_are_what_trl_grpo_trainer_accepts(tiny_model_dir, local_tokenizer, tmp_path, monkeypatch):
    """The real GRPOTrainer takes the test classes as environment_factory: its tools are ours and its reward (from
    get_reward) is our score."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template
    from trl_style_envs import GuessingGame

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = copy.deepcopy(local_tokenizer)
    tokenizer.padding_side = "left"
    tokenizer.response_template = qwen3_template  # the local ChatML template is one TRL does not know by name
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=1, bf16=False,
        use_cpu=True, report_to="none", beta=0.0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "Play."}]], "task_seed": [3]}),
        processing_class=tokenizer,
        environment_factory=GuessingGame,
    )
    env = envkit.make("trl:trl_style_envs:GuessingGame")
    assert [get_json_schema(method) for method in trainer._env_tools[None]] == env.tools
    assert trainer.reward_func_names == ["GuessingGame"]
    env.reset(seed=3)
    env.step(call("guess", number=7))
    (trl_reward,) = trainer.reward_funcs[-1](environments=[env.instance])
    assert trl_reward == env.score() > 0.0


def test_trl_class_passes_envkit_validate(capsys):
    assert cli_main(["validate", "trl:trl_style_envs:GuessingGame", "--episodes", "4"]) == 0, capsys.readouterr().out


def test_trl_rollouts_score_through_the_engine(local_tokenizer):
    spec = "trl:trl_style_envs:Lookup"
    config = {"dataset": "trl_style_envs:lookup_rows", "reward_funcs": ["trl_style_envs:capital_reward"]}
    base = resolve(spec)

    class WithOracle(base):  # the backend's replicas know the answer; the engine's envs are the plain adapter
        def oracle(self):
            if self.turns == 0:
                return call("answer", city=self.instance.CAPITALS[self.instance.country])
            return text("Done.")

    assert WithOracle._tool_specs == base._tool_specs
    episodes = run_engine(spec, local_tokenizer, [0, 1], replica_factory=lambda: WithOracle(**config), **config)
    assert [e.error for e in episodes] == [None] * 4
    assert [e.score for e in episodes] == [1.0] * 4 and all(e.num_tool_calls == 1 for e in episodes)


def test_to_environment_factory_refuses_an_env_that_credits_only_a_proper_ending():
    # TRL's loop ends at the first reply without a tool call and never gives it to the env: τ²-bench's customer
    # never hears the agent close, so every episode would score as cut (0). One line naming envkit train instead.
    from envkit.adapters.trl import to_environment_factory
    from envkit.envs.tau2 import Tau2AirlineEnv

    assert Tau2AirlineEnv.requires_proper_ending
    with pytest.raises(TypeError, match=r"^Tau2AirlineEnv credits only .* train it with envkit train"):
        to_environment_factory(Tau2AirlineEnv)
