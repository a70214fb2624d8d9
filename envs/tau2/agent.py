"""The agent's system prompt as τ²-bench's ``LLMAgent`` builds it (``tau2/agent/llm_agent.py``, MIT, Sierra
Research): its instructions and the domain policy, each in its own tag. ``tests/test_tau2_prompt_agreement.py``
checks it against tau2's own ``LLMAgent.system_prompt``."""

from __future__ import annotations

SYSTEM_PROMPTS = ("tau2", "policy")
"""The choices of :class:`~envkit.envs.tau2.env.Tau2Env`'s ``system_prompt``: tau2's agent prompt, or the policy."""

AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()
"""tau2's ``AGENT_INSTRUCTION``, verbatim."""

SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()
"""tau2's ``SYSTEM_PROMPT`` template, verbatim."""


def system_prompt(policy: str, kind: str = "tau2") -> str:
    """The agent's system message.

    Args:
        policy: The domain's ``policy.md`` text.
        kind: ``"tau2"``: tau2's ``LLMAgent`` prompt (its instructions and the policy, each in its tag, as ``tau2 run``
            sends it); ``"policy"``: the policy alone.

    Returns:
        The system message's text.

    Raises:
        ValueError: For another ``kind``, naming the choices.
    """
    if kind == "tau2":
        return SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)
    if kind == "policy":
        return policy
    raise ValueError(f"unknown system_prompt {kind!r}; choose from {', '.join(map(repr, SYSTEM_PROMPTS))}")
