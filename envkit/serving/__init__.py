"""envkit going out to clients: an env served as an OpenEnv server (:mod:`envkit.adapters.openenv.server`, ``envkit
serve-env``) and a model served as an OpenAI-compatible endpoint (:mod:`envkit.serving.openai`, ``envkit serve``)."""
