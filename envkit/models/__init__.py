"""Getting a model offline: loading one from a folder (:mod:`envkit.models.loading`), building a tiny random one
(:mod:`envkit.models.tiny`) and the real SmolLM2-135M-Instruct from its PyPI wheel (:mod:`envkit.models.smollm2`)."""
