"""TRL ``environment_factory`` classes whose rewards are not in [0, 1], for the ``reward_range`` tests of the ``trl:``
adapter: written as a TRL user writes them, with nothing from envkit."""

from __future__ import annotations

import random

PROMPT_2048 = "Play 2048 on a 4x4 board. Use the tool `move` with one of: up, down, left, right. Maximize the score."


class PenaltyGuess:
    """Find a hidden digit; the env owns its reward, a penalty from -1 (not found) to 0 (found at the first guess)."""

    def reset(self, **kwargs) -> str:
        self.target = random.Random(int(kwargs.get("task_seed", 0))).randint(0, 9)
        self.guesses: list[int] = []
        return "Find my hidden digit (0-9) with the guess tool, in as few guesses as you can."

    def guess(self, digit: int) -> str:
        """Guess the hidden digit.

        Args:
            digit: A digit from 0 to 9.
        """
        self.guesses.append(digit)
        if digit == self.target:
            return "Correct!"
        return "Higher." if digit < self.target else "Lower."

    def get_reward(self) -> float:
        if self.target not in self.guesses:
            return -1.0
        return -0.25 * min(self.guesses.index(self.target), 2)  # 0 at the first guess, -0.25, then -0.5


class Game2048:
    """2048 with the reward shape of TRL's ``examples/grpo_2048``: a ``move`` tool, the game score (the sum of merged
    tiles, 20 to 32 after a few moves) read by a reward function from ``environments``. Seeded from the row's
    ``task_seed`` (TRL's example draws from the global ``random``)."""

    def reset(self, **kwargs) -> str:
        self.rng = random.Random(int(kwargs.get("task_seed", 0)))
        self.board = [[0] * 4 for _ in range(4)]
        self.score = 0
        self._spawn()
        self._spawn()
        return self._show()

    def move(self, direction: str) -> str:
        """Play one move.

        Args:
            direction: One of "up", "down", "left", "right".
        """
        if direction not in ("up", "down", "left", "right"):
            raise ValueError(f"unknown direction {direction!r}")
        lines = self._lines(direction)
        merged = [self._merge(line) for line in lines]
        if [m for m, _ in merged] != lines:
            self._write(direction, [m for m, _ in merged])
            self.score += sum(gained for _, gained in merged)
            self._spawn()
        return self._show()

    def _lines(self, direction: str) -> list[list[int]]:
        rows = self.board if direction in ("left", "right") else [list(c) for c in zip(*self.board, strict=True)]
        return [row[::-1] if direction in ("right", "down") else list(row) for row in rows]

    def _write(self, direction: str, lines: list[list[int]]) -> None:
        rows = [line[::-1] if direction in ("right", "down") else line for line in lines]
        self.board = rows if direction in ("left", "right") else [list(r) for r in zip(*rows, strict=True)]

    @staticmethod
    def _merge(line: list[int]) -> tuple[list[int], int]:
        tiles, out, gained = [t for t in line if t], [], 0
        while tiles:
            if len(tiles) > 1 and tiles[0] == tiles[1]:
                out.append(2 * tiles[0])
                gained += 2 * tiles[0]
                tiles = tiles[2:]
            else:
                out.append(tiles.pop(0))
        return out + [0] * (4 - len(out)), gained

    def _spawn(self) -> None:
        empty = [(r, c) for r in range(4) for c in range(4) if not self.board[r][c]]
        if empty:
            r, c = self.rng.choice(empty)
            self.board[r][c] = 4 if self.rng.random() < 0.1 else 2

    def _show(self) -> str:
        return f"score={self.score}\n" + "\n".join(" ".join(f"{v:3d}" for v in row) for row in self.board)


def reward_score(environments, **kwargs) -> list[float]:
    """The reward function of TRL's grpo_2048 example: the game score."""
    return [env.score for env in environments]


def rows_2048() -> list[dict]:
    return [{"prompt": [{"role": "user", "content": PROMPT_2048}], "task_seed": seed} for seed in range(8)]
