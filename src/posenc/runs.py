"""A run folder and a finished run: find its checkpoint, load it, and get the data it
was trained on.

``RunFolder`` is the one place that names what a run folder holds (``run.json``,
``config.yaml``, ``metrics.json``, ``checkpoints/last.ckpt``, grids beside the run);
every writer and reader of a run folder goes through it. Every reader of checkpoints goes
through here, and no other module calls ``torch.load``: training's resume (``load_state``), the
evaluations, the heatmaps and the bucket census (``open_run``, ``load_module``, ``weights``). All
load with ``weights_only=True`` and turn a missing, truncated or foreign file into one
``ConfigError`` that says what to do. ``StoredRun`` is what a run stores of itself (its config,
vocabulary size and identity), read by name: its training length L, scheme, task, seed and
corpus, in one place. ``run_data`` is the one way to rebuild a run's data (its tokenizer and
splits) from the config stored in its checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError
from .files import project_root

#: the setting that names a corpus folder taken from ``paths.data_dir`` (``POSENC_DATA_DIR``)
SHARED_DATA_SETTING = "paths.data_dir"


class _Held:
    """A path that a run folder holds, named once (``RunFolder``'s layout)."""

    def __init__(self, *parts: str):
        self.parts = parts

    def __get__(self, run, owner=None):
        return self if run is None else run.path.joinpath(*self.parts)


@dataclass(frozen=True)
class RunFolder:
    """A training run's folder and what it holds::

        <run>/run.json              run name, MLflow run id, encoding, identity, schedule (``info``)
        <run>/config.yaml           the resolved config
        <run>/metrics.json          the final metrics
        <run>/checkpoints/last.ckpt the last checkpoint (best-step=N.ckpt beside it)
        <run>/retrieval[-<rule>].csv a retrieval run's exact-match grid
    """

    path: Path
    #: the name of the last checkpoint in ``checkpoints/`` (Lightning's ``save_last``, and an interrupt's)
    LAST = "last.ckpt"
    #: the folder of the checkpoints, in the run folder and among the MLflow run's artifacts
    CHECKPOINTS = "checkpoints"
    run_json = _Held("run.json")
    config = _Held("config.yaml")
    metrics = _Held("metrics.json")
    checkpoints = _Held(CHECKPOINTS)
    last = _Held(CHECKPOINTS, LAST)

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of(cls, ckpt: str | os.PathLike) -> RunFolder:
        """The folder of a checkpoint inside it (``<run>/checkpoints/x.ckpt``)."""
        return cls(Path(ckpt).parent.parent)

    @classmethod
    def under(cls, root: str | os.PathLike, pattern: str = "**") -> list[RunFolder]:
        """Every run folder (one with a ``run.json``) under ``root``, at ``pattern`` depth, sorted by path."""
        root = Path(root)
        return [cls(meta.parent) for meta in sorted(root.glob(f"{pattern}/run.json"))] if root.is_dir() else []

    def grid(self, rule: str | None = None) -> Path:
        """The exact-match grid of a retrieval run, scored plain or with a zero-shot rule."""
        return self.path / f"retrieval{'-' + rule if rule else ''}.csv"

    def info(self) -> dict:
        """The run's ``run.json``, or {} when it has none (or it cannot be read)."""
        try:
            return json.loads(self.run_json.read_text())
        except (OSError, json.JSONDecodeError):
            return {}


def load_state(path: str | os.PathLike, mmap: bool = False) -> dict:
    """``torch.load`` with ``weights_only=True`` and an error that says what to do.

    ``mmap``: map the tensors instead of reading them (a cheap readability check)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no checkpoint file at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        raise ConfigError(
            f"checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:200]}); it is truncated, "
            "corrupt or not a posenc checkpoint: delete it and resume from another one"
        ) from e


def weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model's weights in a checkpoint (its ``state_dict``), on the CPU, read with ``load_state``."""
    return load_state(path)["state_dict"]


def load_module(path: str | os.PathLike, device: str | torch.device = "cpu", scheme_settings: dict | None = None):
    """The LMModule of a checkpoint, in eval mode on ``device`` (see ``module_from_state``)."""
    return module_from_state(load_state(path), path, device, scheme_settings)


def module_from_state(
    state: dict, path: str | os.PathLike, device: str | torch.device = "cpu", scheme_settings: dict | None = None
):
    """The LMModule of a loaded checkpoint ``state`` (read from ``path``), in eval mode.

    ``scheme_settings`` change settings of the scheme (``encoding.scheme.*``)
    for evaluation, e.g. a RoPE context-extension rule; the weights must still
    fit, and a scheme without such a setting is refused.
    """
    import copy

    from .config import build_model
    from .module import LMModule

    run = StoredRun.read(state, path)
    cfg = copy.deepcopy(run.cfg)
    cfg["encoding"]["scheme"].update(scheme_settings or {})
    try:
        model = build_model(cfg, run.vocab_size)
    except TypeError as e:  # an argument the scheme does not take
        raise ConfigError(
            f"encoding {run.scheme} does not take the settings {sorted(scheme_settings or {})} ({e})"
        ) from e
    module = LMModule(model, run.task, cfg["optim"], run.train_len)
    try:
        module.load_state_dict(state["state_dict"])
    except RuntimeError as e:  # written by a version of posenc whose model had other parameters
        raise ConfigError(
            f"checkpoint {path} does not fit the model this version of posenc builds from its config "
            f"({' '.join(str(e).split())[:300]}); retrain it, or evaluate it with the posenc version that wrote it"
        ) from e
    return module.eval().to(device)


#: where a checkpoint keeps its run's record (``posenc.callbacks.RunRecord``)
RECORD = "posenc_run"


def stored_run(state: dict, path: str | os.PathLike) -> dict:
    """What posenc training stores in a checkpoint: the run's resolved config (``cfg``),
    ``vocab_size`` and ``identity``. Checkpoints written before the record had a key of its
    own keep it as the module's Lightning hyper-parameters; both are read."""
    hp = state.get(RECORD) or state.get("hyper_parameters") or {}
    if "cfg" not in hp or "vocab_size" not in hp:
        raise ConfigError(f"checkpoint {path} holds no posenc run config: it was not written by posenc training")
    return hp


@dataclass(frozen=True)
class StoredRun:
    """A run as posenc training stores it in its checkpoints (``RECORD``): its resolved config
    (``cfg``), vocabulary size and identity, and what its readers ask of them, by name. ``read``
    takes a loaded checkpoint; ``StoredRun(cfg)`` of a composed config (a DictConfig) answers
    the same of a run about to be trained (a study's job, before its run exists)."""

    cfg: Mapping[str, Any]
    vocab_size: int | None = None
    identity: dict | None = None

    @classmethod
    def read(cls, state: dict, path: str | os.PathLike) -> StoredRun:
        """The run recorded in a loaded checkpoint ``state`` (read from ``path``; ``stored_run``)."""
        hp = stored_run(state, path)
        return cls(hp["cfg"], int(hp["vocab_size"]), hp.get("identity"))

    @property
    def train_len(self) -> int:
        """L, the training window (``data.seq_len``)."""
        return int(self.cfg["data"]["seq_len"])

    @property
    def scheme(self) -> str:
        """The encoding's name (``encoding.name``)."""
        return str(self.cfg["encoding"]["name"])

    def label(self, extension: str | None = None) -> str:
        """How rows name the run's scheme: ``rope``, or ``rope+yarn`` with a context-extension rule."""
        return self.scheme + (f"+{extension}" if extension else "")

    @property
    def seed(self) -> int | None:
        return self.cfg.get("seed")

    @property
    def run_name(self) -> str | None:
        return self.cfg.get("run_name")

    @property
    def corpus(self) -> str:
        """The corpus's name (``data.corpus.name``)."""
        return str(self.cfg["data"]["corpus"]["name"])

    @property
    def task_name(self) -> str:
        return str(self.cfg["task"]["name"])

    @property
    def task(self):
        """The run's task object (``posenc.taskbase.build`` of its task config)."""
        from .taskbase import build

        return build(self.cfg["task"])

    @property
    def tracking_uri(self) -> str | None:
        """The MLflow store the run logged to, when it logged to one."""
        return (self.cfg.get("logger") or {}).get("tracking_uri")


def open_run(path: str | os.PathLike, device: str | torch.device = "cpu", extension: str | None = None,
             original_len: int | None = None) -> tuple[StoredRun, Any]:
    """(the stored run, its LMModule in eval mode) of the checkpoint at ``path``: ``load_state``,
    ``StoredRun.read`` and ``module_from_state`` in one. ``extension``: a context-extension rule
    (``encoding.scheme.scaling``) switched on past ``original_len`` (default: the run's training
    length)."""
    state = load_state(path)
    run = StoredRun.read(state, path)
    L = original_len or run.train_len
    module = module_from_state(state, path, device, {"scaling": extension, "original_len": L} if extension else None)
    return run, module


def run_info(ckpt: Path) -> dict:
    """The ``run.json`` of the run folder that holds ``ckpt`` (``<run>/checkpoints/x.ckpt``), or {}."""
    return RunFolder.of(ckpt).info()


def _pick(folder: Path, which: str) -> Path:
    """last.ckpt or the best-step=N.ckpt (highest N when several) of a checkpoints folder."""
    if which == "last":
        p = folder / RunFolder.LAST
        if p.is_file():
            return p
    elif which == "best":
        best = sorted(folder.glob("best-*.ckpt"), key=lambda p: (p.stat().st_mtime, p.name))
        if best:
            return best[-1]
    else:
        raise ValueError(f"which={which!r}: choose 'last' or 'best'")
    raise FileNotFoundError(f"no {which} checkpoint in {folder}")


@dataclass
class Resolved:
    """A checkpoint file and what is known about its MLflow run."""

    path: Path
    run_id: str | None = None
    tracking_uri: str | None = None


def run_id_of(ckpt: Path) -> str | None:
    """The MLflow run of a checkpoint: run.json beside its checkpoints/ folder, or the
    run folder of an MLflow artifact path (<artifacts>/<run_id>/artifacts/checkpoints/x.ckpt)."""
    info = run_info(ckpt)
    if info:
        return info.get("mlflow_run_id")
    if ckpt.parent.name == RunFolder.CHECKPOINTS and ckpt.parent.parent.name == "artifacts":
        return ckpt.parents[2].name
    return None


def resolve_checkpoint(
    ref: str | os.PathLike,
    which: str = "last",
    runs_dir: str | os.PathLike | None = None,
    tracking_uri: str | None = None,
    download_dir: str | os.PathLike | None = None,
) -> Resolved:
    """A checkpoint from a .ckpt path, a run folder (or its checkpoints/), or an MLflow run id.

    A run id is looked up first among the run folders under ``runs_dir``
    (default <POSENC_ROOT or .>/outputs; their run.json names the MLflow run),
    then among the run's ``checkpoints/`` artifacts in MLflow, which are
    downloaded to ``download_dir`` (default: a fresh temporary folder).
    """
    p = Path(ref).expanduser()
    if p.is_file():
        return Resolved(p.resolve(), run_id_of(p.resolve()))
    if p.is_dir():
        folder = RunFolder(p).checkpoints if RunFolder(p).checkpoints.is_dir() else p
        ckpt = _pick(folder, which).resolve()
        return Resolved(ckpt, run_id_of(ckpt))
    run_id = str(ref)
    if os.sep in run_id or run_id.endswith(".ckpt"):
        raise FileNotFoundError(f"no checkpoint at {ref}")
    for run in RunFolder.under(runs_dir or project_root() / "outputs"):
        if run.info().get("mlflow_run_id") == run_id and run.checkpoints.is_dir():
            try:
                return Resolved(_pick(run.checkpoints, which).resolve(), run_id)
            except FileNotFoundError:
                pass
    from . import tracking

    uri = tracking_uri or tracking.default_tracking_uri()
    names = tracking.artifact_names(uri, run_id, RunFolder.CHECKPOINTS)
    wanted = [RunFolder.LAST] if which == "last" else sorted(n for n in names if n.startswith("best-"))[-1:]
    if not wanted or wanted[0] not in names:
        raise FileNotFoundError(
            f"MLflow run {run_id} in {uri} has no {which} checkpoint among its artifacts {names}; "
            f"train with log_checkpoint=true or give the .ckpt path"
        )
    dst = Path(download_dir) if download_dir else Path(tempfile.mkdtemp(prefix="posenc-ckpt-"))
    local = tracking.download_artifact(uri, run_id, f"{RunFolder.CHECKPOINTS}/{wanted[0]}", dst)
    return Resolved(Path(local).resolve(), run_id, uri)


def run_data(
    cfg: dict,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    vocab_size: int | None = None,
    **data_settings: Any,
):
    """The prepared DataModule of the data config ``cfg["data"]`` a model was trained with.

    ``data_settings`` replace data settings (``seq_len``, ``eval_batch_size``).
    The corpus folder is ``data_dir``, else ``POSENC_DATA_DIR`` for corpora read
    from the shared data folder (not for ``data=text``, whose folder is its own),
    else the run's; ``cache_dir`` replaces the tokenizer cache (a checkpoint made
    on another machine). The tokenizer is the cached one, keyed by the corpus and
    tokenizer settings, so it is the training one; with ``vocab_size`` (the
    model's) a mismatch is refused before anything is scored.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.create(cfg["data"]), resolve=True)
    data.update(data_settings)
    corpus = data["corpus"]
    shared = str(corpus.get("root_setting", SHARED_DATA_SETTING)).startswith(SHARED_DATA_SETTING)
    data_dir = data_dir or (os.environ.get("POSENC_DATA_DIR") if shared else None)
    if data_dir:
        corpus["root"] = str(data_dir)
    if cache_dir:
        data["cache_dir"] = str(cache_dir)
    from .taskbase import build

    data.pop("task", None)  # runs made when the data config held a copy of the task
    task = build(cfg["task"]) if cfg.get("task") is not None else None
    dm = instantiate(OmegaConf.create(data), task=task)
    dm.prepare_data()
    if vocab_size is not None and dm.tokenizer_vocab_size != int(vocab_size):
        raise ConfigError(
            f"the tokenizer prepared for data={corpus['name']} has {dm.tokenizer_vocab_size} tokens, the model "
            f"{vocab_size}: the data does not match the checkpoint; point the data / cache folder at the data "
            "the model was trained on"
        )
    return dm
