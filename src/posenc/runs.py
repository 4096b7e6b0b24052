"""A finished run: find its checkpoint, load it, and get the data it was trained on.

Every reader of checkpoints goes through here: training's resume (``load_state``),
the extrapolation evaluation and the heatmaps (``load_module``). Both load with
``weights_only=True`` and turn a missing, truncated or foreign file into one
``ConfigError`` that says what to do. ``run_data`` is the one way to rebuild a
run's data (its tokenizer and splits) from the config stored in its checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError

#: the setting that names a corpus folder taken from ``paths.data_dir`` (``POSENC_DATA_DIR``)
SHARED_DATA_SETTING = "paths.data_dir"


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

    from .module import LMModule

    hp = stored_run(state, path)
    cfg = copy.deepcopy(hp["cfg"])
    cfg["encoding"]["scheme"].update(scheme_settings or {})
    try:
        module = LMModule(cfg, hp["vocab_size"], hp.get("identity"))
    except TypeError as e:  # an argument the scheme does not take
        raise ConfigError(
            f"encoding {cfg['encoding']['name']} does not take the settings {sorted(scheme_settings or {})} ({e})"
        ) from e
    try:
        module.load_state_dict(state["state_dict"])
    except RuntimeError as e:  # written by a version of posenc whose model had other parameters
        raise ConfigError(
            f"checkpoint {path} does not fit the model this version of posenc builds from its config "
            f"({' '.join(str(e).split())[:300]}); retrain it, or evaluate it with the posenc version that wrote it"
        ) from e
    return module.eval().to(device)


def stored_run(state: dict, path: str | os.PathLike) -> dict:
    """What posenc training stores in a checkpoint (``cfg``, ``vocab_size``, ``identity``)."""
    hp = state.get("hyper_parameters") or {}
    if "cfg" not in hp or "vocab_size" not in hp:
        raise ConfigError(f"checkpoint {path} holds no posenc run config: it was not written by posenc training")
    return hp


def run_info(ckpt: Path) -> dict:
    """The ``run.json`` of the run folder that holds ``ckpt`` (``<run>/checkpoints/x.ckpt``), or {}."""
    meta = Path(ckpt).parent.parent / "run.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


def default_root() -> Path:
    return Path(os.environ.get("POSENC_ROOT", ".")).expanduser().resolve()


def default_tracking_uri() -> str:
    from .tracking import sqlite_uri

    return os.environ.get("MLFLOW_TRACKING_URI") or sqlite_uri(default_root() / "mlflow.db")


def _pick(folder: Path, which: str) -> Path:
    """last.ckpt or the best-step=N.ckpt (highest N when several) of a checkpoints folder."""
    if which == "last":
        p = folder / "last.ckpt"
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
    if ckpt.parent.name == "checkpoints" and ckpt.parent.parent.name == "artifacts":
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
        folder = p / "checkpoints" if (p / "checkpoints").is_dir() else p
        ckpt = _pick(folder, which).resolve()
        return Resolved(ckpt, run_id_of(ckpt))
    run_id = str(ref)
    if os.sep in run_id or run_id.endswith(".ckpt"):
        raise FileNotFoundError(f"no checkpoint at {ref}")
    runs = Path(runs_dir) if runs_dir else default_root() / "outputs"
    for meta in sorted(runs.glob("**/run.json")) if runs.is_dir() else []:
        try:
            info = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if info.get("mlflow_run_id") == run_id and (meta.parent / "checkpoints").is_dir():
            try:
                return Resolved(_pick(meta.parent / "checkpoints", which).resolve(), run_id)
            except FileNotFoundError:
                pass
    import mlflow

    uri = tracking_uri or default_tracking_uri()
    client = mlflow.MlflowClient(uri)
    try:
        names = [Path(a.path).name for a in client.list_artifacts(run_id, "checkpoints")]
    except mlflow.exceptions.MlflowException as e:
        raise FileNotFoundError(
            f"{ref!r} is neither a checkpoint file, a run folder, nor an MLflow run in {uri} ({e})"
        ) from e
    wanted = ["last.ckpt"] if which == "last" else sorted(n for n in names if n.startswith("best-"))[-1:]
    if not wanted or wanted[0] not in names:
        raise FileNotFoundError(
            f"MLflow run {run_id} in {uri} has no {which} checkpoint among its artifacts {names}; "
            f"train with log_checkpoint=true or give the .ckpt path"
        )
    dst = Path(download_dir) if download_dir else Path(tempfile.mkdtemp(prefix="posenc-ckpt-"))
    dst.mkdir(parents=True, exist_ok=True)
    local = client.download_artifacts(run_id, f"checkpoints/{wanted[0]}", str(dst))
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
    dm = instantiate(OmegaConf.create(data))
    dm.prepare_data()
    if vocab_size is not None and dm.tokenizer_vocab_size != int(vocab_size):
        raise ConfigError(
            f"the tokenizer prepared for data={corpus['name']} has {dm.tokenizer_vocab_size} tokens, the model "
            f"{vocab_size}: the data does not match the checkpoint; point the data / cache folder at the data "
            "the model was trained on"
        )
    return dm
