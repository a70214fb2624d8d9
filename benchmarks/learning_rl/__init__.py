"""Where demonstrations fall short, does on-policy training through envkit beat SFT and rejection sampling?

Two experiments (envs in ``benchmarks/learning_rl/envs.py``), each with independent seeds; every seed builds its
own tokenizer-sized tiny Qwen2 model and its own warm start (no shared warm start), then trains five arms from it:

- ``grpo``: ``envkit train`` (GRPO, full fine-tuning) on the training condition;
- ``rft``: ``envkit rft``'s code (:mod:`envkit.adapters.trl.rft`) on the training condition, with as many env
  episodes as GRPO used;
- ``sft_plateau``: SFT on the available demonstrations continued to its plateau, the checkpoint chosen on a
  validation split of the training condition (the most favourable selection SFT can get);
- ``sft_compute``: SFT on the same demonstrations for GRPO's CPU time (compute-matched);
- ``privileged``: SFT to plateau on demonstrations that do cover the training condition (the upper bound that shows
  the comparison is fair).

Experiments:

- **A — flaky tools.** ``FlakyArithmeticEnv``: the calculator fails with probability p and says to call it again.
  Demonstrations come from the oracle in the logs of a system whose calculator fails 10 % of the time; GRPO and RFT
  train at p = 0.3; held out at p ∈ {0, 0.3, 0.5}.
- **B — deeper chains.** ``ChainEnv``: demonstrations for k ≤ 3 operations (a fifth at 3); GRPO and RFT train on
  k ≤ 4; held out k = 1 … 6 and chains containing operation pairs never adjacent in training.

Before the arms, two gates: the warm start trains (one optimizer, probed every ``--warm-chunk`` steps) until a probe
(the demonstrations' condition, held out) passes ``--probe-threshold`` (capped by ``--warm-max-steps``; the checkpoint
with the best probe is kept), and a pilot gate: the warm start must solve at least
``--gate`` of the hard condition at temperature 1, else GRPO and RFT would get no signal — the seed is recorded as
gated and its arms are not run (the report says so).

Learning rates: every arm gets the same search, a grid of constant rates (``--learning-rates``). On the search seed
(``--search-seed``, 0) each arm runs at every rate and keeps the run that scores best on the validation split of the
training condition; the choice is recorded in ``OUT/EXP/search.json`` and every other seed runs each arm at its kept
rate (a seed that would need a rate not yet chosen stops before its arms; its warm start is kept). Only kept
runs are evaluated held out.

Evaluation: held-out tasks (seeds from ``HELD_OUT_START``) are checked disjoint by content from every training,
demonstration and validation task (the user prompt; any held-out task whose prompt is a training one is dropped and
counted, then the check asserts zero overlap). Each model (warm start and arms) gets, per condition, mean score,
format validity (the episode ended with a ``submit_answer`` call, right or wrong) and pass@k for k = 1 … 64 (the
unbiased estimator) on the pass@k condition. Learning curves: training reward against env episodes (GRPO, RFT) and
validation score against SFT steps. Canaries: ``envkit validate``'s canary check on each experiment's envs.

Results: every seed writes ``OUT/EXP/seed-N.json`` as it finishes (its phases are saved as they finish too, under
``OUT/EXP/seed-N/``, and each arm is evaluated as soon as it is kept), and a rerun skips what is done, so a cut run
loses at most the arm in progress — on a fresh clone too, where git keeps the phases and the warm start's weights.
``--report`` aggregates whatever has finished (interquartile mean with stratified-bootstrap 95 % CIs and the
probability of improvement, from ``rliable``) into ``OUT/results.md``, ``OUT/summary.json`` and PNG figures.

Modules: ``experiments`` (the experiments, their task seeds, the held-out split and the canaries), ``training``
(demonstrations, the tokenizer's corpus, SFT with checkpoint selection, saving and loading models), ``evaluation``
(held-out scores and pass@k), ``search`` (the learning-rate search), ``arms`` (each arm's training run), ``seed``
(one seed's phases), ``report`` (tables and figures), ``cli`` (the flags and :func:`~benchmarks.learning_rl.cli.main`),
``envs`` (the benchmark envs, loaded by path).

Usage::

    python -m benchmarks.learning_rl --experiments A B --seeds 5 --out DIR   # resumable
    python -m benchmarks.learning_rl --report --out DIR                      # tables and figures of what finished
    python -m benchmarks.learning_rl --quick                                 # the whole pipeline, tiny sizes
"""
