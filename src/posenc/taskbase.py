"""What every task is, and how a task's config becomes one: the ``Task`` base class (what
training, the model and the run loader ask of any task) and ``build``. A task's config names
its class (``_target_`` in ``conf/task/<name>.yaml``); the project's tasks are in
``posenc.tasks``, which re-exports all of this.

Why a module of its own: loading a trained run (``posenc.runs``, ``posenc.config``,
``posenc.module``) needs a task object, and a study's task hands its trained runs to the code
that scores them (``posenc.evaluate``, ``posenc.retrieval``), which loads them. Kept here,
below both, the base class and ``build`` let ``posenc.tasks`` import that scoring code by name
without an import circle.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import ConfigError

if TYPE_CHECKING:
    from torch.utils.data import Dataset


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
    #: the folder of a study's results that the rows of its runs' evaluation go to, files per
    #: scheme (``<results>/<scheme>.<suffix>``); None: a run is scored by its validation alone
    results: str | None = None
    #: the suffixes of those files, the one ``write`` is given first: a study's outputs
    #: (``outputs``; dvc.yaml's study stage lists them, made by ``pipelines.stages``)
    suffixes: tuple[str, ...] = ()
    #: the columns a study sorts the rows by first (empty: in the order of the runs' seeds)
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
        """Refuse an entry's ``evaluate`` settings this task cannot score with (here: any but
        ``split``, the split of the recorded metrics its table reads: ``split_of``)."""
        _known(name, evaluate, {"split"})
        check_split(name, evaluate)

    def outputs(self, scheme: str) -> list[str]:
        """The files of a scheme's rows that a study writes, under its results folder
        (``<results>/<scheme>.<suffix>``, a header alone when the scheme does not take the task)."""
        return [f"{self.results}/{scheme}.{suffix}" for suffix in self.suffixes] if self.results else []

    def write(self, rows: list[dict], path) -> None:
        """Write a scheme's rows to ``path`` (its first output); a task with results says how."""
        raise NotImplementedError(f"{type(self).__name__} declares results {self.results!r} but no write()")

    def refusal(self, scheme: type) -> str | None:
        """Why a scheme class cannot take part in this task, or None when it can."""
        if getattr(scheme, "causal_only", False) and not self.causal:
            return (f"{scheme.__name__} is defined for causal attention only, and task={self.name} is "
                    "bidirectional")
        return None


class Call(NamedTuple):
    """A call a run's own job makes after training (``Task.evaluate``): ``fn(**kwargs)``, giving
    rows (``fn`` a function of a module, which the job's process imports by reference)."""

    fn: Callable[..., list[dict]]
    kwargs: dict


@dataclasses.dataclass
class FollowUp:
    """Jobs a trained run leaves for the study's executor (``Task.evaluate``): ``call(cells=part,
    **kwargs)`` for each of ``parts``, a job each (a list of them as one job where a job pays a
    start-up: parts are lists, joined), giving rows; then ``finish(rows, uri, **finish_kwargs)`` on
    all of them, giving the rows to keep and a line of progress. ``call`` and ``finish`` are
    functions of a module (sent to the process that runs them by reference)."""

    name: str
    call: Callable[..., list[dict]]
    parts: list[list]
    kwargs: dict
    finish: Callable[..., tuple[list[dict], str]]
    finish_kwargs: dict


#: the held-out splits a study scores on: tuning reads validation, the verdicts of record test
SPLITS = ("validation", "test")


def split_of(evaluate: Mapping) -> str:
    """The held-out split a task entry's ``evaluate`` scores on (validation when it names none)."""
    return str(evaluate.get("split") or "validation")


def check_split(name: str, evaluate: Mapping) -> None:
    if split_of(evaluate) not in SPLITS:
        raise ConfigError(f"tasks: {name}: evaluate: split must be one of {', '.join(SPLITS)}, not {evaluate['split']!r}")


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


#: the task config of a run made before tasks were classes names its objective: the task of
#: ``conf/task/<name>.yaml`` it was
OBJECTIVES = {"causal": "lm", "mlm": "mlm", "retrieval": "retrieval"}


def build(task) -> Task:
    """The task object of a task config (``cfg.task``: a mapping with ``_target_``), or the
    object itself."""
    if isinstance(task, Task):
        return task
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = OmegaConf.create(OmegaConf.to_container(task, resolve=True) if OmegaConf.is_config(task) else dict(task))
    if "_target_" not in conf:  # the config of a run made before tasks were classes: its objective
        if OBJECTIVES.get(conf.get("objective")) is None:
            raise ConfigError(f"task={conf.get('name')}: its config names no class (_target_); every "
                              "conf/task/<name>.yaml says which posenc.tasks class it is")
        from . import CONFIG_DIR

        conf["_target_"] = OmegaConf.load(f"{CONFIG_DIR}/task/{OBJECTIVES[conf.pop('objective')]}.yaml")["_target_"]
    return instantiate(conf, _convert_="all")
