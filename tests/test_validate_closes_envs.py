"""envkit validate closes the envs it makes as it goes: an env holding a server session (OpenEnv, MCP) must not run
its server out of session slots while the garbage collector gets round to finalizers."""

from __future__ import annotations

from typing import ClassVar

from capitals import CapitalsEnv

from envkit.validate import FAIL, validate_env


class CountsSessions(CapitalsEnv):
    """CapitalsEnv that counts its open instances, as a server counts sessions."""

    open: ClassVar[set[int]] = set()
    most: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        CountsSessions.open.add(id(self))
        CountsSessions.most = max(CountsSessions.most, len(CountsSessions.open))

    def close(self) -> None:
        CountsSessions.open.discard(id(self))
        super().close()


def test_validate_holds_at_most_two_envs_open_and_closes_them_all():
    CountsSessions.open.clear()
    CountsSessions.most = 0
    report = validate_env(CountsSessions, target="CountsSessions", episodes=4)
    assert not [c for c in report.checks if c.status == FAIL], [c.reason for c in report.checks if c.status == FAIL]
    assert CountsSessions.open == set()  # every env validate made is closed (before: dozens left to finalizers)
    assert CountsSessions.most == 2  # two instances stepped together (check 6), and never more (the first env too)
