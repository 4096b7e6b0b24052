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
(``tests/test_tasks.py`` adds one that way).
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import ConfigError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from .retrieval import Layout


class Task:
    """What every task shares: next-token windows, every token scored, validation alone (a
    study keeps what validation logs and scores nothing more). ``CausalLM`` is this and the
    perplexity at every length."""

    #: how a report names the task (``title``); a subclass without one is named by its config's name
    TITLE: str | None = None
    #: validation reports token accuracy over the scored targets
    accuracy: bool = False
    #: validation reports exact match: the share of windows whose every scored target is the argmax
    exact_match: bool = False
    #: a study starts the runs of its dearer tasks first, so that the cores stay busy to the end
    cost: int = 1
    #: the folder of a study's results that the rows of its runs' evaluation go to, a file per
    #: scheme (``<results>/<scheme>.csv``); None: a run is scored by its validation alone
    results: str | None = None
    #: how a study writes those rows (a dotted path of ``fn(rows, path)``) and the columns it sorts
    #: them by first (empty: in the order of the runs' seeds)
    writer: str | None = None
    row_order: tuple[str, ...] = ()

    def __init__(self, name: str, causal: bool = True, cls: bool = False, **settings: Any):
        self.name, self.causal, self.cls = str(name), bool(causal), bool(cls)
        self.settings = settings

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def title(self) -> str:
        """How a report names the task: its class's ``TITLE`` (not inherited), else its name."""
        return vars(type(self)).get("TITLE") or self.name

    def dataset(self, dm, windows: Dataset, split: str) -> Dataset:
        """The examples of ``split`` made from the DataModule's ``windows`` (``dm``: the
        ``posenc.data.LMDataModule``, prepared)."""
        return windows

    def scored_suffix(self, seq_len: int) -> int | None:
        """How many positions at the end of a window hold every scored target; None: any."""
        return None

    def validated(self) -> list[str]:
        """The metrics validation logs (a criterion may stop a run on any of them)."""
        return ["val/loss", "val/ppl"] + ["val/acc"] * self.accuracy + ["val/exact"] * self.exact_match

    def kept(self) -> list[str]:
        """What a study keeps of each run: the validation metrics, the same on the test split,
        the steps trained and the step a criterion was met at."""
        val = self.validated()
        return [*val, *(m.replace("val/", "test/", 1) for m in val), "global_step", "criterion_step"]

    def check(self, cfg) -> None:
        """Raise ConfigError when the run's settings (``cfg``, the composed config) cannot work."""

    # ----------------------------------------------------------------- its part of a study

    def run_overrides(self, spec: Mapping) -> list[str]:
        """The Hydra overrides of a study's runs of this task, from its entry in the params
        file (``check_spec`` has checked it): window, batch, steps, validation interval, the
        criterion a run may stop at, then the entry's own overrides."""
        T, crit = spec["seq_len"], spec.get("criterion")
        return [f"data.seq_len={T}", f"model.max_len={T}", f"data.batch_size={spec['batch_size']}",
                f"trainer.max_steps={spec['steps']}", f"trainer.val_check_interval={spec['validate_every']}",
                *([f"criterion.metric={crit['metric']}", f"criterion.value={crit['value']}"] if crit else []),
                *shlex.split(spec.get("overrides") or "")]  # fmt: skip

    def evaluate(self, scored: list[dict], spec: Mapping) -> tuple[list[Call], list[FollowUp]]:
        """What a study does with a trained run: calls made at once, in the run's own job, each
        giving rows, and follow-up jobs for the executor. ``scored``: the run and its variants
        (``run_dir``; ``rule``, a zero-shot context-extension rule; ``label``, the row labels of a
        fine-tuned run; ``base_len``, L; ``device``). Here: nothing beyond validation."""
        return [], []

    def check_evaluate(self, name: str, evaluate: Mapping) -> None:
        """Refuse an entry's ``evaluate`` settings this task cannot score with (here: any, ``{}``)."""
        _known(name, evaluate, set())

    def refusal(self, scheme: type) -> str | None:
        """Why a scheme class cannot take part in this task, or None when it can."""
        if getattr(scheme, "causal_only", False) and not self.causal:
            return (f"{scheme.__name__} is defined for causal attention only, and task={self.name} is "
                    "bidirectional")
        return None


class CausalLM(Task):
    """The causal language model: the plain task, scored by its perplexity at every length."""

    TITLE = "the causal LM"
    results = "extrapolation"
    writer = "posenc.evaluate.write_results"

    def evaluate(self, scored: list[dict], spec: Mapping) -> tuple[list[Call], list[FollowUp]]:
        """Perplexity of each of ``scored`` at every multiple of L in ``spec['multipliers']``
        (``posenc.evaluate.rows_at_lengths``), in the run's own job."""
        return [Call("posenc.evaluate.rows_at_lengths", {**run, "multipliers": multipliers(spec),
                                                         "max_tokens": spec.get("max_tokens")}) for run in scored], []

    def check_evaluate(self, name: str, evaluate: Mapping) -> None:
        """``multipliers`` (of L) are needed; ``max_tokens`` and ``extensions`` are taken."""
        _known(name, evaluate, {"multipliers", "max_tokens", "extensions"}, need={"multipliers"})


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
    writer = "posenc.retrieval.write_rows"  # a header alone without rows
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
        (``pipelines.retrieval.score_cells``; ``finish_grid`` writes and logs the whole grid)."""
        from .retrieval import DEPTHS

        grid = {"trial_seed": 0, "trials": int(spec["trials"]), "attention_trials": int(spec["attention_trials"])}
        follow = []
        for i, run in enumerate(scored):
            L = run["base_len"]
            cells = [(m * L, d) for m in sorted(multipliers(spec), reverse=True) for d in DEPTHS]
            follow.append(FollowUp(
                f"grid{i}", "pipelines.retrieval.score_cells", [[c] for c in cells],
                {"run_dir": run["run_dir"], "settings": grid, "extension": run["rule"], "base_len": L,
                 "extra": run["label"], "device": run["device"]},
                "pipelines.retrieval.finish_grid", {"run_dir": run["run_dir"], "extension": run["rule"]}))
        return [], follow

    def check_evaluate(self, name: str, evaluate: Mapping) -> None:
        """The grid needs ``multipliers``, ``trials`` per cell and ``attention_trials`` (of
        which the top layer's attention to the needle is measured), and takes ``extensions``."""
        need = {"multipliers", "trials", "attention_trials"}
        _known(name, evaluate, need | {"extensions"}, need=need)
        trials, attn = evaluate["trials"], evaluate["attention_trials"]
        if not (isinstance(trials, int) and trials >= 1 and isinstance(attn, int) and 0 <= attn <= trials):
            raise ConfigError(f"tasks: {name}: evaluate: trials must be at least 1 and attention_trials between 0 "
                              f"and trials, not {trials} and {attn}")


#: the seed offset of each split's fixed examples (training 0, validation 1, test 2)
SPLIT_OFFSET = {"train": 0, "validation": 1, "test": 2}


class Call(NamedTuple):
    """A call a run's own job makes after training (``Task.evaluate``): ``path`` (dotted, resolved
    in that process) with ``kwargs``, giving rows."""

    path: str
    kwargs: dict


@dataclasses.dataclass
class FollowUp:
    """Jobs a trained run leaves for the study's executor (``Task.evaluate``): ``call(cells=part,
    **kwargs)`` for each of ``parts``, a job each (a list of them as one job where a job pays a
    start-up: parts are lists, joined), giving rows; then ``finish(rows, uri, **finish_kwargs)`` on
    all of them, giving the rows to keep and a line of progress. ``call`` and ``finish`` are
    dotted paths (resolved in the process that runs them)."""

    name: str
    call: str
    parts: list[list]
    kwargs: dict
    finish: str
    finish_kwargs: dict


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


def _known(name: str, evaluate: Mapping, allowed: set[str], need: set[str] = frozenset()) -> None:
    """Refuse unknown or missing keys of a task entry's ``evaluate`` mapping."""
    _keys(f"tasks: {name}: evaluate:", set(evaluate), allowed, need, f"this task takes {', '.join(sorted(allowed)) or 'none: {}'}")
    if "multipliers" in need and (not multipliers(evaluate) or min(multipliers(evaluate)) < 1):
        raise ConfigError(f"tasks: {name}: evaluate: multipliers must be whole numbers at least 1, e.g. \"1 2 4\"")


def _keys(where: str, have: set, allowed: set, need: set, hint: str) -> None:
    """Refuse keys outside ``allowed`` or missing from ``need``, in one line that ends with ``hint``."""
    missing, extra = set(need) - have, have - set(allowed)
    if missing or extra:
        raise ConfigError(f"{where} " + "; ".join(
            [f"lacks {', '.join(sorted(missing))}"] * bool(missing) + [f"has no key {', '.join(sorted(extra))}"] * bool(extra))
            + f" ({hint})")


def multipliers(spec: Mapping) -> list[int]:
    """The multiples of L a task's entry scores its runs at (``evaluate: multipliers``)."""
    return [int(m) for m in str(spec.get("multipliers") or "").split()]


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


def build(task) -> Task:
    """The task object of a task config (``cfg.task``: a mapping with ``_target_``), or the
    object itself."""
    if isinstance(task, Task):
        return task
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = OmegaConf.create(OmegaConf.to_container(task, resolve=True) if OmegaConf.is_config(task) else dict(task))
    if "_target_" not in conf:  # the config of a run made before tasks were classes: its objective
        known = {"causal": CausalLM, "mlm": MaskedLM, "retrieval": Retrieval}
        if conf.get("objective") not in known:
            raise ConfigError(f"task={conf.get('name')}: its config names no class (_target_); every "
                              "conf/task/<name>.yaml says which posenc.tasks class it is")
        cls = known[conf.pop("objective")]
        conf["_target_"] = f"{cls.__module__}.{cls.__qualname__}"
    return instantiate(conf, _convert_="all")


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
