"""BFCL v4's multi-turn categories as an envkit env: ``envkit.make("bfcl-multi-turn")`` (Gymnasium:
``envkit/BfclMultiTurn-v0``).

The 800 multi-turn tasks of the Berkeley Function Calling Leaderboard (``base``, ``miss_func``, ``miss_param``,
``long_context``; 200 each) on BFCL's own stateful APIs, read from BFCL's installed package
(``pip install --no-deps bfcl-eval==2026.3.23``; scripts/setup.sh does it)::

    env = envkit.make("bfcl-multi-turn", split="test")  # train: base; test: the other three categories
    messages, info = env.reset(seed=0)                   # the user's first turn; env.tools: BFCL's schemas
    messages, reward, terminated, truncated, info = env.step(env.oracle())

A reply with tool calls runs them on the task's API instances (looked up, never evaluated); a reply without calls ends
the user's turn and the next one follows. The score is BFCL's multi-turn verdict (state and response checks after
every turn), equal to BFCL's own checker on every case of the agreement suite (``pytest -m bfcl``). See
envs/bfcl/README.md for the data's provenance and licence, ``miss_func``'s mid-episode functions and the costs.
"""

from envkit.envs.bfcl.env import BfclMultiTurnEnv

__all__ = ["BfclMultiTurnEnv"]
