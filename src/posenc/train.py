"""Training: ``train(cfg)`` is a plain function; ``main`` is the Hydra wrapper.

Order of work, so that bad input fails before anything is written:
config checks -> data preparation -> model -> MLflow run -> fit -> artifacts.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from . import CONFIG_DIR, tracking
from .callbacks import GracefulInterrupt
from .model import ModelSize
from .module import LMModule

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """An impossible combination of settings."""


ConfigStore.instance().store(group="schema", name="model", node=ModelSize)


def check_config(cfg: DictConfig) -> None:
    """Refuse impossible settings early: builds the scheme alone (which checks
    widths, rotary dims and directions) and checks the training length."""
    m = cfg.model
    if m.d_model % m.n_heads:
        raise ConfigError(
            f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
            "pick a head count that divides the width"
        )
    scheme = instantiate(cfg.encoding.scheme)(
        d_model=m.d_model, n_heads=m.n_heads, max_len=m.max_len, causal=bool(cfg.task.causal)
    )
    if cfg.data.seq_len < 1:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} must be at least 1")
    scheme.check_length(int(cfg.data.seq_len))


def run_dir(cfg: DictConfig) -> Path:
    """Hydra's output folder, or a fresh one under paths.output_dir (compose API)."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        d = Path(cfg.paths.output_dir) / "runs" / f"{stamp}_{cfg.run_name}_{os.getpid()}"
        d.mkdir(parents=True, exist_ok=True)
        return d


def find_last_checkpoint(cfg: DictConfig) -> Path:
    """The newest ``last.ckpt`` of a run with this run name under paths.output_dir."""
    candidates = []
    for meta in Path(cfg.paths.output_dir).glob("**/run.json"):
        info = json.loads(meta.read_text())
        ckpt = meta.parent / "checkpoints" / "last.ckpt"
        if info.get("run_name") == cfg.run_name and ckpt.exists():
            candidates.append(ckpt)
    if not candidates:
        raise FileNotFoundError(
            f"ckpt_path=last: no last.ckpt of a run named {cfg.run_name!r} under {cfg.paths.output_dir}; "
            "give ckpt_path=<path to a .ckpt> or start a fresh run"
        )
    return max(candidates, key=lambda p: p.stat().st_mtime)


def load_checkpoint(path: str | Path) -> dict:
    """``torch.load`` with ``weights_only=True`` and an error that says what to do."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:200]}); it is truncated, "
            "corrupt or not a posenc checkpoint: delete it and resume from another one"
        ) from e


#: settings a checkpoint must share with the run that resumes it
ARCHITECTURE_KEYS = ("encoding", "model", "task.objective", "data.corpus.name", "data.vocab_size")


def check_compatible(cfg: DictConfig, saved_cfg: dict, path: Path) -> None:
    """Refuse to resume a checkpoint of another scheme, size or task."""
    saved = OmegaConf.create(saved_cfg)
    for key in ARCHITECTURE_KEYS:
        want = OmegaConf.select(cfg, key)
        have = OmegaConf.select(saved, key)
        want = OmegaConf.to_container(want, resolve=True) if isinstance(want, DictConfig) else want
        have = OmegaConf.to_container(have, resolve=True) if isinstance(have, DictConfig) else have
        if want != have:
            raise ConfigError(
                f"checkpoint {path} was trained with {key}={have}, but this run asks for {key}={want}; "
                "resume with the same settings or start a fresh run (ckpt_path=null)"
            )


def resolve_resume(cfg: DictConfig) -> tuple[Path | None, dict]:
    """(checkpoint to resume from, run.json of the run that wrote it), checked."""
    if cfg.ckpt_path in (None, ""):
        return None, {}
    ckpt = find_last_checkpoint(cfg) if cfg.ckpt_path == "last" else Path(cfg.ckpt_path)
    state = load_checkpoint(ckpt)
    check_compatible(cfg, state.get("hyper_parameters", {}).get("cfg", {}), ckpt)
    meta = ckpt.parent.parent / "run.json"
    return ckpt, (json.loads(meta.read_text()) if meta.exists() else {})


def build_logger(cfg: DictConfig, run_id: str | None):
    if cfg.get("logger") is None:
        return None
    kw = {"run_id": run_id} if run_id else {}
    if "tracking_uri" in cfg.logger:
        tracking.ensure_experiment(cfg.logger.tracking_uri, cfg.logger.experiment_name, cfg.logger.get("artifact_location"))
    return instantiate(cfg.logger, **kw)


@rank_zero_only
def log_run_start(logger, cfg: DictConfig, module: LMModule, resumed: bool, data_provenance: dict) -> None:
    """Params (once), tags and parameter counts of a new run."""
    exp, run_id = logger.experiment, logger.run_id
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if not resumed:
        params = {k: str(v)[:6000] for k, v in tracking.flatten(resolved).items()}
        logger.log_hyperparams(params)
    try:
        overrides = " ".join(HydraConfig.get().overrides.task)
    except ValueError:
        overrides = ""
    tags = {"encoding": cfg.encoding.name, "task": cfg.task.name, "data": cfg.data.corpus.name,
            "overrides": overrides or "(none)", **tracking.git_state(cfg.paths.root),
            **tracking.library_versions(), **data_provenance}
    for k, v in tags.items():
        exp.set_tag(run_id, k, v)
    counts = module.model.num_parameters()
    logger.log_metrics({"params/total": counts["total"], "params/positional": counts["positional"]}, step=0)


@rank_zero_only
def log_run_end(logger, out_dir: Path, tokenizer: Path, best_ckpt: str | None, log_checkpoint: bool) -> None:
    exp, run_id = logger.experiment, logger.run_id
    exp.log_artifact(run_id, str(out_dir / "config.yaml"))
    exp.log_artifact(run_id, str(tokenizer))
    if log_checkpoint:
        last = out_dir / "checkpoints" / "last.ckpt"
        for path in {best_ckpt, str(last) if last.exists() else None} - {None, ""}:
            exp.log_artifact(run_id, path, artifact_path="checkpoints")


def train(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, float]:
    """Train one model as ``cfg`` says; returns the final callback metrics.

    ``out_dir``: the run folder (default: Hydra's output folder, or a fresh one
    under ``paths.output_dir`` when called through the compose API).
    """
    check_config(cfg)
    ckpt, resumed_meta = resolve_resume(cfg)
    L.seed_everything(cfg.seed, workers=True)

    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()  # errors about data surface here, before any run exists
    module = LMModule(OmegaConf.to_container(cfg, resolve=True), datamodule.tokenizer_vocab_size)

    if ckpt:
        out_dir = Path(ckpt).parent.parent
    elif out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        out_dir = run_dir(cfg)
    logger = build_logger(cfg, resumed_meta.get("mlflow_run_id"))
    checkpoint = ModelCheckpoint(
        dirpath=out_dir / "checkpoints",
        filename="best-{step}",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=True,
    )
    callbacks = [checkpoint, GracefulInterrupt(out_dir / "checkpoints")]
    callbacks += [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    trainer = instantiate(cfg.trainer, logger=logger or False, callbacks=callbacks)
    run_id = None
    try:
        if logger is not None:
            run_id = logger.run_id
            meta = datamodule.prepared.meta
            provenance = {"data_source": meta["source"], "data_root": str(meta.get("root")),
                          "data_tokens_sha256": meta["tokens_sha256"], "data_cache": datamodule.prepared.directory.name}
            log_run_start(logger, cfg, module, resumed=bool(ckpt), data_provenance=provenance)
        if trainer.is_global_zero:
            (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            meta = {"run_name": cfg.run_name, "mlflow_run_id": run_id, "encoding": cfg.encoding.name}
            write_json_atomic(out_dir / "run.json", meta)
        trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None, weights_only=True)
        if logger is not None:
            log_run_end(
                logger, out_dir, datamodule.prepared.tokenizer_path, checkpoint.best_model_path,
                bool(cfg.get("log_checkpoint", True)),
            )
    except BaseException as e:
        if logger is not None and run_id is not None and trainer.is_global_zero:
            interrupted = isinstance(e, (SIGTERMException, KeyboardInterrupt))
            tracking.end_run(cfg.logger.tracking_uri, run_id, "KILLED" if interrupted else "FAILED")
        raise
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    metrics["global_step"] = trainer.global_step
    if trainer.is_global_zero:
        write_json_atomic(out_dir / "metrics.json", {"run_name": cfg.run_name, "encoding": cfg.encoding.name,
                                                     "task": cfg.task.name, "seed": cfg.seed, **metrics})
        log.info("finished %s in %s: %s", cfg.run_name, out_dir, metrics)
    return metrics


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    return metrics.get("val/loss")


if __name__ == "__main__":
    main()
