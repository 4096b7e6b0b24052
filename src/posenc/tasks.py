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
  perplexity (``validated()``), and ``evaluation`` what a study does with a trained run:
  ``"lengths"`` (perplexity at multiples of L), ``"grid"`` (the retrieval grid) or None.

Adding a task: a subclass (here or in any module Hydra can import) and a YAML in
``conf/task/`` whose ``_target_`` names it, with ``name``, ``causal`` and ``cls``
(``tests/test_tasks.py`` adds one that way).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from .retrieval import Layout


class Task:
    """The causal language model is the plain task: next-token windows, every token scored."""

    #: validation reports token accuracy over the scored targets
    accuracy: bool = False
    #: validation reports exact match: the share of windows whose every scored target is the argmax
    exact_match: bool = False
    #: what a study does with a trained run: "lengths", "grid" or None (see the module's text)
    evaluation: str | None = "lengths"

    def __init__(self, name: str, causal: bool = True, cls: bool = False, **settings: Any):
        self.name, self.causal, self.cls = str(name), bool(causal), bool(cls)
        self.settings = settings

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

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

    def check(self, cfg) -> None:
        """Raise ConfigError when the run's settings (``cfg``, the composed config) cannot work."""

    def refusal(self, scheme: type) -> str | None:
        """Why a scheme class cannot take part in this task, or None when it can."""
        if getattr(scheme, "causal_only", False) and not self.causal:
            return (f"{scheme.__name__} is defined for causal attention only, and task={self.name} is "
                    "bidirectional")
        return None


#: the causal language model under its own name
CausalLM = Task


class MaskedLM(Task):
    """Bidirectional masked LM: [CLS] at position 0, ``mask_prob`` of the text tokens are
    targets, of which 80% become [MASK], 10% a random token, 10% stay (``MaskedWindows``)."""

    accuracy = True
    evaluation = None

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

    accuracy = True
    exact_match = True
    evaluation = "grid"

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


#: the seed offset of each split's fixed examples (training 0, validation 1, test 2)
SPLIT_OFFSET = {"train": 0, "validation": 1, "test": 2}


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
