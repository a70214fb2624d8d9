"""vLLM servers envkit starts and feeds: their command lines and placement on CPUs and GPUs (:mod:`.servers`,
:mod:`.cpus`, :mod:`.gpus`), the LoRA kernels that run inside vLLM-CPU servers (:mod:`.cpu_lora`) and publishing the
policy's adapter to them (:mod:`.weights`). The in-process engine is a backend: :class:`envkit.backends.VLLMBackend`."""
