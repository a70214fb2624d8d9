"""One seed of one experiment: its tasks, warm start, pilot gate, five arms and their evaluations, each a phase saved
as it finishes and skipped when a previous run saved it; on the search seed, every arm at every learning rate of the
grid and the choice of each arm's rate by its validation score (``OUT/EXP/search.json``)."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import arms as arms_module
from .evaluation import evaluate, evaluate_model, weights_fingerprint
from .experiments import ARMS, VALIDATION_START, Experiment, check_disjoint, held_out_split, prompt_of
from .files import write_whole
from .pretraining import pretrain_copy_and_recall
from .search import Search, run_name
from .training import (
    PARTS_FOLDER,
    RESUME_FOLDER,
    discard_checkpoints,
    load,
    oracle_demos,
    save,
    sft_keep_best,
    tokenizer_corpus,
)


class Seed:
    """One seed of one experiment: its folder, its tasks, and each phase, skipped when its file already exists."""

    def __init__(self, exp: Experiment, seed: int, args: argparse.Namespace, out: Path) -> None:
        self.exp, self.seed, self.args = exp, seed, args
        self.dir = out / exp.name / f"seed-{seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.dir / "log.txt"
        # Task seeds: demonstrations and training from 0, validation from VALIDATION_START, held out from
        # HELD_OUT_START (checked disjoint by content below). The same for every seed: seeds differ in model, warm
        # start and sampling, as independent runs of one benchmark do.
        self.demo_seeds = list(range(args.demos))
        self.train_seeds = list(range(args.train_tasks))
        self.validation_seeds = list(range(VALIDATION_START, VALIDATION_START + args.validation_tasks))

    def log(self, text: str) -> None:
        """A line on stdout and in the seed's log."""
        line = f"[{self.exp.name} seed {self.seed} {time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        with self.log_file.open("a") as f:
            f.write(line + "\n")

    def phase(self, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``work()``'s result, saved as ``NAME.json``; read back instead when a previous run saved it. What the phase
        kept of its work in progress (:meth:`parts`) is removed once its result is saved."""
        path = self.dir / f"{name}.json"
        if path.exists():
            return json.loads(path.read_text())
        started, cpu = time.perf_counter(), time.process_time()
        result = work()
        result.setdefault("seconds", time.perf_counter() - started)
        result.setdefault("cpu_seconds", time.process_time() - cpu)
        write_whole(path, json.dumps(result, indent=1, default=str))
        shutil.rmtree(self.parts(name), ignore_errors=True)
        return result

    def parts(self, name: str) -> Path:
        """Where phase ``name`` keeps its work in progress (a held-out evaluation, its finished conditions): on this
        machine only (git ignores it), and removed once the phase's result is saved."""
        return self.dir / PARTS_FOLDER / name

    def measured(
        self, name: str, run: str, train: Callable[[], dict[str, Any]], measure: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """Phase ``name``, a measurement of run ``run``'s weights (``measure()``); when it is still to do and the run's
        record is here but its weights are not (a fresh clone: git keeps the records, not an arm's weights), the run
        is trained again first (``train()``: a new run of the arm from the seed's kept warm start, its record
        replaced)."""
        weights = self.dir / run / "config.json"
        if not (self.dir / f"{name}.json").exists() and not weights.exists():
            if (self.dir / f"{run}.json").exists():
                self.log(f"{run}: its weights are not here for {name}; training it again")
                (self.dir / f"{run}.json").unlink()
            self.phase(run, train)
        return self.phase(name, measure)

    # -- tasks --
    def tasks(self) -> dict[str, Any]:
        """Held-out splits, dropping any task whose prompt is a seen one, and the disjointness check."""
        exp, args = self.exp, self.args
        seen = {prompt_of(exp.factory(exp.demo), s) for s in self.demo_seeds}
        seen |= {prompt_of(exp.factory(exp.privileged), s) for s in self.demo_seeds}
        seen |= {prompt_of(exp.factory(exp.train), s) for s in self.train_seeds}
        seen |= {prompt_of(exp.factory(exp.train), s) for s in self.validation_seeds}
        seen |= {prompt_of(exp.factory(exp.demo), s) for s in self.validation_seeds}
        held_out, dropped = {}, {}
        for i, label in enumerate(exp.conditions):
            held_out[label], dropped[label] = held_out_split(exp, label, args.eval_tasks, seen, offset=i * 100_000)
        held_out["pass@k"], dropped["pass@k"] = held_out_split(
            exp, exp.pass_at_k, args.pass_k_tasks, seen, offset=list(exp.conditions).index(exp.pass_at_k) * 100_000
        )
        overlap = check_disjoint(exp, {k: v for k, v in held_out.items() if k != "pass@k"}, seen)
        self.log(f"held-out check: {len(seen)} seen prompts; dropped {dropped}; overlap after: {overlap}")
        return {"held_out": held_out, "dropped": dropped, "overlap": overlap, "seen_prompts": len(seen)}

    # -- warm start --
    def warm_start(self) -> dict[str, Any]:
        """Tokenizer, tiny model, SFT on the available demonstrations until the probe passes (capped: the checkpoint
        with the best probe), then the pilot gate (:meth:`_gate`) on it. An initialisation that fails the gate is
        replaced by a fresh one, up to ``--warm-attempts`` in all (some initialisations of a model this small never
        learn to copy numbers, or learn the task but nothing of its hard condition); the first that passes is kept,
        else the best probe. The gate decides, not the probe: the probe is SFT's stopping rule, and a model that
        reaches the cap below it but solves enough of the hard condition is what the comparison needs."""
        from envkit.testing import build_tokenizer

        exp, args = self.exp, self.args
        corpus = tokenizer_corpus(exp, self.demo_seeds[:100])
        tokenizer = build_tokenizer(self.dir / "tokenizer", vocab_size=args.vocab_size, extra_corpus=corpus)
        demos = oracle_demos(exp.factory(exp.demo), tokenizer, self.demo_seeds)
        probe_seeds = self.validation_seeds[: args.probe_tasks]
        attempts: list[dict[str, Any]] = []
        for attempt in range(args.warm_attempts):
            # Each attempt's record is saved as it ends (with the weights of its best probe): a resumed run reads it
            # back instead of training it again (a rerun of an initialisation that failed would most likely fail the
            # same way).
            record_file = self._attempt_folder(attempt) / "attempt.json"
            if record_file.exists():
                record = json.loads(record_file.read_text())
                discard_checkpoints(self._attempt_folder(attempt))  # left by a cut just after the record was saved
                self.log(f"warm start (attempt {attempt + 1}): finished earlier, probe {record['best']:.3f}")
                if self._accepted(record) and not self._has_weights(attempt):
                    # The one to keep, without its weights: trained again, and judged again (a run on another machine
                    # is another model, which may fail where the record passed).
                    record = self._retrained(attempt, record, tokenizer, demos, probe_seeds)
            else:
                record = self._trained_attempt(attempt, tokenizer, demos, probe_seeds)
            attempts.append(record)
            if self._accepted(record):
                break
            if attempt + 1 < args.warm_attempts:
                failed = "the pilot gate" if not args.ignore_gate else "its probe"
                self.log(f"warm start (attempt {attempt + 1}) failed {failed}; a fresh initialisation")
        # The first accepted attempt, else the best probe; the earliest of equals.
        best = max(range(len(attempts)), key=lambda i: (self._accepted(attempts[i]), attempts[i]["best"]))
        if not self._has_weights(best):
            attempts[best] = self._retrained(best, attempts[best], tokenizer, demos, probe_seeds)
        folder = self._attempt_folder(best)
        save(load(folder)[0], tokenizer, self.dir / "warm")
        chosen = attempts[best]
        return {
            "steps": chosen["steps"],
            "selected_steps": chosen["selected_steps"],
            "probes": chosen["probes"],
            "passed": chosen["best"] >= args.probe_threshold,
            "gate": chosen["gate"],
            "kept_attempt": best + 1,
            "attempts": attempts,
            "demos": len(demos),
        }

    def _attempt_folder(self, attempt: int) -> Path:
        """Where warm-start attempt ``attempt`` (from 0) saves its record (``attempt.json``) and weights."""
        return self.dir / f"warm-attempt-{attempt + 1}"

    def _has_weights(self, attempt: int) -> bool:
        """Whether warm-start attempt ``attempt``'s weights are here."""
        return (self._attempt_folder(attempt) / "config.json").exists()

    def _retrained(
        self, attempt: int, recorded: dict[str, Any], tokenizer: Any, demos: list[Any], probe_seeds: list[int]
    ) -> dict[str, Any]:
        """Warm-start attempt ``attempt``, whose record is ``recorded`` and whose weights are not here, trained again;
        its new record, which replaces the old one.

        Git keeps the attempts' records, not their weights (it keeps the warm start's once its phase ends), so a clone
        cut before then trains its attempt again. The new probes and gate are said where they differ from the record:
        training is not reproducible across machines (A's seed 0 probed 0.000 at 900 steps on one, 0.219 on another),
        and the evaluations' batches, so a sampled episode now and then, vary with timing even for the same weights."""
        self.log(f"warm start (attempt {attempt + 1}): its weights are not here; training it again")
        record = self._trained_attempt(attempt, tokenizer, demos, probe_seeds)
        for key in ("probes", "gate"):
            if record[key] != recorded[key]:
                self.log(
                    f"warm start (attempt {attempt + 1}) trained again: its {key} {record[key]} differs from its "
                    f"record's {recorded[key]}; the new one is kept"
                )
        return record

    def _trained_attempt(
        self, attempt: int, tokenizer: Any, demos: list[Any], probe_seeds: list[int]
    ) -> dict[str, Any]:
        """Warm-start attempt ``attempt`` trained (:meth:`_warm_attempt`) and gated (:meth:`_gate`), its weights and
        record saved; its record."""
        folder = self._attempt_folder(attempt)
        model, record = self._warm_attempt(attempt, tokenizer, demos, probe_seeds)
        record["gate"] = self._gate(model, tokenizer)
        save(model, tokenizer, folder)
        write_whole(folder / "attempt.json", json.dumps(record, indent=1))
        discard_checkpoints(folder)
        return record

    def _accepted(self, attempt: dict[str, Any]) -> bool:
        """Whether a warm-start attempt is kept: it passed the pilot gate (with --ignore-gate, where the gate does not
        decide whether the arms run, its probe)."""
        if self.args.ignore_gate:
            return attempt["best"] >= self.args.probe_threshold
        return attempt["gate"]["passed"]

    def _warm_attempt(
        self, attempt: int, tokenizer: Any, demos: list[Any], probe_seeds: list[int]
    ) -> tuple[Any, dict[str, Any]]:
        """One initialisation of the warm start trained until its probe passes (capped): the model with its best
        probe's weights, and the attempt's record. A run cut during it goes on from its last probe's checkpoint
        (in the attempt's :data:`.training.RESUME_FOLDER`); ``seconds`` then counts this run's time only."""
        from envkit.testing import build_tiny_model

        exp, args = self.exp, self.args
        started = time.perf_counter()
        init_seed = self.seed + 1000 * attempt
        model = build_tiny_model(
            tokenizer,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_heads,
            max_position_embeddings=1024,
            seed=init_seed,
        )
        pretraining = None
        if args.pretrain_steps:
            pretraining = pretrain_copy_and_recall(model, tokenizer, args.pretrain_steps, init_seed)
            self.log(
                f"pretraining: {args.pretrain_steps} steps of copying and recall, exact on "
                f"{pretraining['accuracy_before']:.3f} → {pretraining['accuracy_after']:.3f} of the held-out targets"
            )
        # The probe can fall between probes, so an attempt's model is its checkpoint with the best probe.
        kept = sft_keep_best(
            model,
            tokenizer,
            demos,
            args,
            self.seed,
            max_steps=args.warm_max_steps,
            every=args.warm_chunk,
            learning_rate=args.warm_learning_rate,
            warmup_steps=args.warm_warmup_steps,
            decay=args.warm_schedule == "cosine",
            score=lambda: evaluate(model, tokenizer, exp.factory(exp.demo), probe_seeds, 1, args, self.seed)[
                "mean_score"
            ],
            stop=lambda probe, _: probe >= args.probe_threshold,
            on_score=lambda steps, probe: self.log(
                f"warm start{f' (attempt {attempt + 1})' if attempt else ''}: {steps} SFT steps, probe "
                f"{probe:.3f} (passes at {args.probe_threshold})"
            ),
            checkpoints=self._attempt_folder(attempt) / RESUME_FOLDER,
            on_resume=lambda steps: self.log(
                f"warm start (attempt {attempt + 1}): going on from its checkpoint after {steps} SFT steps"
            ),
        )
        self.log(f"warm start: kept the checkpoint after {kept.best_step} steps (probe {kept.best:.3f})")
        record = {
            "init_seed": init_seed,
            "steps": kept.steps,
            "selected_steps": kept.best_step,
            "probes": kept.curve,
            "best": kept.best,
            "seconds": time.perf_counter() - started,
        }
        if pretraining is not None:
            record["pretraining"] = pretraining
        return model, record

    def _gate(self, model: Any, tokenizer: Any) -> dict[str, Any]:
        """The pilot gate: a warm start's solve rate on the hard condition at temperature 1 — with a
        ``failure_marker``, on its episodes that met a failure (the part the demonstrations fall short on; the rest
        of the condition is the task the warm start already does)."""
        exp, args = self.exp, self.args
        run = evaluate(
            model,
            tokenizer,
            exp.factory(exp.hard),
            self.validation_seeds[: args.gate_tasks],
            args.gate_samples,
            args,
            self.seed + 7,
            failure_marker=exp.failure_marker,
        )
        result: dict[str, Any] = {"needed": args.gate, "mean_score": run["mean_score"]}
        what = f"the hard condition {exp.hard}"
        if exp.failure_marker is None:
            result["solved"] = run["mean_score"]
        else:
            after = result["after_failure"] = run["after_failure"]
            result["solved"] = after["score_with_failure"] or 0.0
            what = f"the {after['episodes_with_failure']} episodes of {exp.hard} that met a failure"
        result["passed"] = passed = result["solved"] >= args.gate
        self.log(
            f"pilot gate: warm start solves {result['solved']:.3f} of {what} at T=1 (needs {args.gate}): "
            + ("passed" if passed else "FAILED")
        )
        return result

    def gate(self, warm: dict[str, Any]) -> dict[str, Any]:
        """The kept warm start's pilot gate (measured with its attempt); without it the arms would get little or no
        signal, so they run only with ``--ignore-gate``."""
        result = dict(warm["gate"])
        if not result["passed"]:
            self.log(
                "pilot gate FAILED: GRPO and RFT get little or no signal; "
                + ("arms run anyway (--ignore-gate)" if self.args.ignore_gate else "arms not run")
            )
        return result

    def run(self) -> dict[str, Any]:
        """Every phase (each skipped when done), then the seed's JSON; with ``--arms``, only those arms and their
        evaluations (the result then has ``partial``: the other arms are still to run).

        Each arm runs at a learning rate of ``--learning-rates``: on the search seed (``--search-seed``) at every one,
        each run then scored on the validation split (:meth:`validate`) and the best kept (:class:`.search.Search`
        records the choice in ``OUT/EXP/search.json``); on the other seeds at the rate the search chose (their warm
        start and gate run first, and the arms stop with one line if the search has not chosen yet). Only the kept run
        is evaluated on the held-out split, so the held-out scores play no part in the choice."""
        result: dict[str, Any] = {"experiment": self.exp.name, "seed": self.seed}
        result["tasks"] = self.phase("tasks", self.tasks)
        result["warm_start"] = self.phase("warm_start", self.warm_start)
        result["gate"] = gate = self.phase("gate", lambda: self.gate(result["warm_start"]))
        result["eval"] = {"warm_start": self.phase("eval-warm_start", lambda: self._evaluate("warm"))}
        if not gate["passed"] and not self.args.ignore_gate:
            result["gated"] = True
            return result
        if not gate["passed"]:
            result["below_gate"] = True  # --ignore-gate: the arms ran on a warm start the gate failed
        arms = [arm for arm in ARMS if arm in self.args.arms]  # in ARMS' order: GRPO before the arms MATCHED_TO_GRPO
        search = Search(self.dir.parent, self.args)
        searching = self.seed == self.args.search_seed
        if not searching:
            # Checked here, not at start-up: the warm start needs no rate, so it can run (and is saved) while the
            # search seed is still choosing.
            search.require(arms, self.seed)
        work: dict[str, Callable[[float], dict[str, Any]]] = {
            "grpo": lambda rate: arms_module.grpo(self, rate),
            "rft": lambda rate: arms_module.rft(self, rate, result["grpo"]["env_episodes"]),
            "sft_plateau": lambda rate: arms_module.sft_plateau(
                self, run_name("sft_plateau", rate), self.exp.demo, rate
            ),
            "sft_compute": lambda rate: arms_module.sft_compute(self, rate, result["grpo"]),
            "privileged": lambda rate: arms_module.sft_plateau(
                self, run_name("privileged", rate), self.exp.privileged, rate
            ),
        }
        for arm in arms:
            rates = self.args.learning_rates if searching else [search.rate(arm)]
            train = {rate: (run_name(arm, rate), lambda a=arm, r=rate: work[a](r)) for rate in rates}
            runs = {rate: self.phase(*train[rate]) for rate in rates}
            if arm == "sft_compute":
                self._check_matched(runs, result["grpo"]["run"])
            if searching:
                scores = {
                    rate: self.measured(
                        f"validation-{run_name(arm, rate)}", *train[rate], lambda a=arm, r=rate: self.validate(a, r)
                    )
                    for rate in rates
                }
                rate = search.choose(arm, self.seed, {r: s["mean_score"] for r, s in scores.items()})
                result.setdefault("search", {})[arm] = {
                    f"{r:g}": {"validation": scores[r], "training": self.phase(*train[r])} for r in rates
                }
                self.log(
                    f"{arm}: validation "
                    + ", ".join(f"{s['mean_score']:.3f} at {r:g}" for r, s in scores.items())
                    + f"; kept {rate:g}"
                )
            else:
                (rate,) = rates
            # Evaluated as soon as it is kept: git keeps the records, not an arm's weights, so an arm whose
            # evaluation is saved needs nothing more from this machine.
            kept = run_name(arm, rate)
            result["eval"][arm] = self.measured(f"eval-{kept}", *train[rate], lambda name=kept: self._evaluate(name))
            result[arm] = {**self.phase(*train[rate]), "learning_rate": rate, "run": kept}
        if set(arms) != set(ARMS):
            result["partial"] = True
        return result

    def _check_matched(self, runs: dict[float, dict[str, Any]], grpo: str) -> None:
        """Stop with one line if a compute-matched SFT run was saved against another GRPO run than the seed's
        ``grpo`` (its CPU budget was that run's)."""
        for rate, record in runs.items():
            if record.get("matched_to") != grpo:
                path = self.dir / f"{run_name('sft_compute', rate)}.json"
                raise SystemExit(
                    f"error: {path} was matched to {record.get('matched_to')}'s CPU time, and this seed's GRPO run is "
                    f"{grpo}: remove that record (and its folder) to run it again"
                )

    def validate(self, arm: str, learning_rate: float) -> dict[str, Any]:
        """The run's score on the validation split of the training condition (``--validation-tasks`` ×
        ``--eval-samples`` at temperature 1): what the learning-rate search compares. The same measurement for every
        arm, apart from the SFT arms' own checkpoint selection (whose score is a maximum over checkpoints)."""
        exp, args = self.exp, self.args
        model, tokenizer = load(self.dir / run_name(arm, learning_rate))
        return evaluate(
            model, tokenizer, exp.factory(exp.train), self.validation_seeds, args.eval_samples, args, self.seed + 5
        )

    def _evaluate(self, folder: str) -> dict[str, Any]:
        """Phase ``eval-NAME``: the held-out evaluation of the model saved in ``folder`` (``NAME``: ``warm_start`` for
        ``warm``, else ``folder``), going on after the conditions a cut run finished."""
        model, tokenizer = load(self.dir / folder)
        held_out = json.loads((self.dir / "tasks.json").read_text())["held_out"]
        phase = f"eval-{'warm_start' if folder == 'warm' else folder}"
        result = evaluate_model(
            model,
            tokenizer,
            self.exp,
            held_out,
            self.args,
            self.seed,
            parts=self.parts(phase),
            weights=weights_fingerprint(self.dir / folder),
            log=lambda text: self.log(f"eval {folder}: {text}"),
        )
        summary = ", ".join(f"{k} {v['mean_score']:.3f}" for k, v in result["conditions"].items())
        curve = result["pass@k"]["pass@k"]
        self.log(f"eval {folder}: {summary}; pass@1/pass@{len(curve)} {curve[0]:.3f}/{curve[-1]:.3f}")
        return result
