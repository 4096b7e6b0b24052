"""Tasks as components: what a run learns and how it is scored, one class per task, chosen
by ``_target_`` in ``conf/task/<name>.yaml`` as a scheme is in ``conf/encoding/``.

A task owns four things, and the code around it asks it rather than its name:

* its examples: ``dataset(dm, windows, split)`` turns the DataModule's windows of a split
  into what the model sees (the DataModule calls it);
* its scored targets: every target that is not scored is ``posenc.targets.IGNORE``, and
  ``scored_suffix(seq_len)`` says when only the last positions of a window hold targets
  (the LightningModule then computes the top layer for those alone);
* its checks: ``check(cfg)`` refuses settings it cannot run with before anything is
  written (``posenc.config.check_config`` calls it), and ``refusal(scheme)`` names why a
  scheme class cannot take part (the study checks every scheme and task before any job);
* its metrics: ``accuracy`` and ``exact_match`` say what validation logs besides loss and
  perplexity (``validated()``), ``kept()`` what a study keeps of each run;
* its part of a study (``pipelines.study``), from its entry in the params file's ``tasks:``
  mapping, which has one shape for every task (``STUDY_KEYS``): the overrides of its runs
  (``run_overrides``), what it does with a trained run (``evaluate``: rows, and follow-up
  jobs such as the retrieval grid's cells), and where its rows go (``results``, ``write``).

Adding a task: a subclass (here or in any module Hydra can import) and a YAML in
``conf/task/`` whose ``_target_`` names it, with ``name``, ``causal`` and ``cls``
(``tests/test_tasks.py`` adds one that way). A task whose runs a study scores further says
where the rows go (``results``, ``suffixes``: its study outputs, ``outputs``, which dvc.yaml
lists) and how they are written (``write``).

The base class, ``build`` and the shapes of a study's jobs (``Call``, ``FollowUp``: functions,
imported by name) live in ``posenc.taskbase``, below the code that loads a trained run
(``posenc.runs``), which needs a task; this module, which hands trained runs to the code that
scores them (``posenc.evaluate``, ``posenc.retrieval``), sits above it and re-exports them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .taskbase import Call, FollowUp, Task, _keys, _known, build, check_split, multipliers, split_of

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from .retrieval import Layout

__all__ = ["Call", "CausalLM", "FollowUp", "MaskedLM", "Retrieval", "STUDY_KEYS", "Task", "build", "check_spec", "load",
           "misfits", "multipliers", "seeds"]


class CausalLM(Task):
    """The causal language model: the plain task, scored by its perplexity at every length."""

    TITLE = "the causal LM"
    results = "extrapolation"
    suffixes = ("csv", "json")

    def evaluate(self, scored: list[dict], spec: Mapping) -> tuple[list[Call], list[FollowUp]]:
        """Perplexity of each of ``scored`` at every multiple of L in ``spec['multipliers']``
        (``posenc.evaluate.rows_at_lengths``), in the run's own job."""
        from .evaluate import rows_at_lengths  # torch: imported in the job that scores the run

        scoring = {"multipliers": multipliers(spec), "max_tokens": spec.get("max_tokens"),
                   "split": split_of(spec), "passages": int(spec.get("passages", 1))}
        return [Call(rows_at_lengths, {**run, **scoring}) for run in scored], []

    def write(self, rows: list[dict], path) -> None:
        """The rows as ``<scheme>.csv`` and ``<scheme>.json`` (``posenc.evaluate.write_results``)."""
        from .evaluate import write_results

        write_results(rows, path)

    def check_evaluate(self, name: str, evaluate: Mapping) -> None:
        """``multipliers`` (of L) are needed; ``max_tokens``, ``split`` (validation, the default, or
        test), ``passages`` (how many, drawn by each run's seed: ``posenc.evaluate``) and
        ``extensions`` are taken."""
        _known(name, evaluate, {"multipliers", "max_tokens", "split", "passages", "extensions"}, need={"multipliers"})
        check_split(name, evaluate)
        passages = evaluate.get("passages", 1)
        if not (isinstance(passages, int) and passages >= 1):
            raise ConfigError(f"tasks: {name}: evaluate: passages must be a whole number of at least 1, not {passages!r}")


class MaskedLM(Task):
    """Bidirectional masked LM: [CLS] at position 0, ``mask_prob`` of the text tokens are
    targets, of which 80% become [MASK], 10% a random token, 10% stay (``MaskedWindows``)."""

    TITLE = "the masked LM"
    accuracy = True
    cost = 0

    def __init__(self, name: str = "mlm", causal: bool = False, cls: bool = True, mask_prob: float = 0.15,
                 **settings: Any):
        super().__init__(name, causal, cls, **settings)
        self.mask_prob = float(mask_prob)

    def dataset(self, dm, windows: Dataset, split: str) -> Dataset:
        from .data import MaskedWindows  # the data layer imports Lightning; the config layer imports this module

        return MaskedWindows(windows, dm.prepared.meta["special_ids"], dm.tokenizer_vocab_size, self.mask_prob,
                             dm.seed * 3 + SPLIT_OFFSET[split])


class Retrieval(Task):
    """Key-value retrieval (passkeys) on filler text (``posenc.retrieval``): ``needles`` key
    markers, each followed by ``digits`` distinct digits, then a query block; the loss is on
    the answer digits, which sit in the last ``Layout.scored`` positions of a window."""

    TITLE = "key-value retrieval"
    accuracy = True
    exact_match = True
    results = "retrieval"
    suffixes = ("csv",)
    row_order = ("scheme", "seed", "length", "depth")  # the grids finish in any order
    cost = 2  # trained to a criterion, then its grid

    def __init__(self, name: str = "retrieval", causal: bool = True, cls: bool = False, digits: int = 5,
                 needles: int = 1, **settings: Any):
        super().__init__(name, causal, cls, **settings)
        self.digits, self.needles = int(digits), int(needles)

    def layout(self, seq_len: int) -> Layout:
        from .retrieval import Layout  # torch and numpy: imported when a retrieval run needs them

        return Layout(int(seq_len), self.needles, self.digits)

    def dataset(self, dm, windows: Dataset, split: str) -> Dataset:
        """Training: an endless stream of examples; validation and test: as many fixed
        examples as the split has windows (the windows only set that count)."""
        from .retrieval import FixedExamples
        from .retrieval import Task as Passkeys

        examples = Passkeys(dm.prepared, self.digits, self.needles).examples(
            split, dm.seq_len, dm.seed * 3 + SPLIT_OFFSET[split])
        return examples if split == "train" else FixedExamples(examples, len(windows))

    def scored_suffix(self, seq_len: int) -> int:
        return self.layout(seq_len).scored

    def check(self, cfg) -> None:
        """A window must hold its needles and queries."""
        T = int(cfg.data.seq_len)
        try:
            self.layout(T)
        except ValueError as e:
            raise ConfigError(f"task=retrieval with data.seq_len={T}, task.needles={self.needles}, "
                              f"task.digits={self.digits}: {e}") from e

    def evaluate(self, scored: list[dict], spec: Mapping) -> tuple[list[Call], list[FollowUp]]:
        """Nothing at once: each of ``scored`` leaves its exact-match grid, lengths (the
        multiples of L, the longest and dearest first) x needle depths, a cell per job
        (``posenc.retrieval.score_cells``; ``finish_grid`` writes and logs the whole grid)."""
        from .retrieval import DEPTHS, finish_grid, score_cells

        grid = {"trial_seed": 0, "trials": int(spec["trials"]), "attention_trials": int(spec["attention_trials"]),
                "split": split_of(spec)}
        follow = []
        for i, run in enumerate(scored):
            L = run["base_len"]
            cells = [(m * L, d) for m in sorted(multipliers(spec), reverse=True) for d in DEPTHS]
            follow.append(FollowUp(
                f"grid{i}", score_cells, [[c] for c in cells],
                {"run_dir": run["run_dir"], "settings": grid, "extension": run["rule"], "base_len": L,
                 "extra": run["label"], "device": run["device"]},
                finish_grid, {"run_dir": run["run_dir"], "extension": run["rule"]}))
        return [], follow

    def write(self, rows: list[dict], path) -> None:
        """The grid's rows as ``<scheme>.csv``, a header alone without rows (``posenc.retrieval.write_rows``)."""
        from .retrieval import write_rows

        write_rows(rows, path)

    def check_evaluate(self, name: str, evaluate: Mapping) -> None:
        """The grid needs ``multipliers``, ``trials`` per cell and ``attention_trials`` (of
        which the top layer's attention to the needle is measured), and takes ``extensions``
        and ``split`` (whose filler the trials are drawn from)."""
        need = {"multipliers", "trials", "attention_trials"}
        _known(name, evaluate, need | {"extensions", "split"}, need=need)
        check_split(name, evaluate)
        trials, attn = evaluate["trials"], evaluate["attention_trials"]
        if not (isinstance(trials, int) and trials >= 1 and isinstance(attn, int) and 0 <= attn <= trials):
            raise ConfigError(f"tasks: {name}: evaluate: trials must be at least 1 and attention_trials between 0 "
                              f"and trials, not {trials} and {attn}")


#: the seed offset of each split's fixed examples (training 0, validation 1, test 2)
SPLIT_OFFSET = {"train": 0, "validation": 1, "test": 2}


#: the keys of a task's entry in the params file's ``tasks:`` mapping, the same for every task
STUDY_KEYS = {
    "seeds": "the seeds of its runs (a string: \"0 1 2\")",
    "seq_len": "the training window L (data.seq_len and model.max_len)",
    "batch_size": "windows per step",
    "steps": "training steps (with a criterion: the cap)",
    "validate_every": "steps between validations",
    "criterion": "null, or {metric, value}: a run stops at the first validation above it",
    "overrides": "Hydra overrides of its runs only (one string)",
    "evaluate": "what a trained run is scored with (the Task class's evaluate says which keys)",
}


def seeds(spec: Mapping) -> list[int]:
    """The seeds of a task's entry in the params file."""
    return [int(s) for s in str(spec["seeds"]).split()]


def check_spec(name: str, spec: Mapping) -> None:
    """Refuse a task entry of the params file that lacks a key, has one too many, or holds a
    value of the wrong kind, naming the key and the fix."""
    where = f"tasks: {name}:"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where} must be a mapping with the keys {', '.join(STUDY_KEYS)}")
    _keys(where, set(spec), set(STUDY_KEYS), set(STUDY_KEYS), f"the keys of every task: {', '.join(STUDY_KEYS)}")
    try:
        assert seeds(spec), "no seeds"
        for key in ("seq_len", "batch_size", "steps", "validate_every"):
            assert int(spec[key]) >= 1 and int(spec[key]) == spec[key], f"{key} must be a whole number at least 1"
        crit = spec["criterion"]
        assert crit is None or (isinstance(crit, Mapping) and set(crit) == {"metric", "value"}), \
            "criterion must be null or {metric: <metric>, value: <number>}"
        assert isinstance(spec["evaluate"], Mapping), "evaluate must be a mapping (may be {})"
        multipliers(spec["evaluate"])
    except (AssertionError, ValueError, TypeError) as e:
        raise ConfigError(f"{where} {e}") from None


@functools.lru_cache(maxsize=None)
def load(name: str, conf_dir: str | Path | None = None) -> Task:
    """The task of ``conf/task/<name>.yaml`` (one object per name: a summary that asks the
    task of every recorded run builds it once)."""
    from omegaconf import OmegaConf

    from . import CONFIG_DIR

    folder = Path(conf_dir or CONFIG_DIR) / "task"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ConfigError(f"task={name}: no {path}; the tasks are {known}")
    return build(OmegaConf.load(path))


def misfits(scheme: str, tasks: list[str], conf_dir: str | Path | None = None) -> list[str]:
    """Why scheme ``scheme`` (``conf/encoding/<scheme>.yaml``) cannot take each task of ``tasks``
    that refuses it, each naming the scheme, the task and the fix; empty when it takes them all."""
    from hydra.utils import get_class

    from . import CONFIG_DIR
    from .fingerprint import scheme_target

    _, _, target = scheme_target(scheme, conf_dir or CONFIG_DIR)
    cls = get_class(target)
    out = []
    for name in tasks:
        why = load(name, conf_dir).refusal(cls)
        if why:
            out.append(f"scheme {scheme} cannot take task {name}: {why}; take {name} out of the scheme's tasks "
                       f"(schemes: {scheme}: tasks: in the params file)")
    return out
