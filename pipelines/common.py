"""Shared bits of the stage CLIs: composing the training config, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig

from posenc import CONFIG_DIR


def compose_config(overrides: list[str]) -> DictConfig:
    """The training config with Hydra overrides, as ``python train.py`` would see it."""
    from hydra import compose, initialize_config_dir

    import posenc.train  # noqa: F401 -- registers the model schema that conf/model/*.yaml extends

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides))


def write_atomic(path: str | Path, text: str) -> None:
    """Write through a temporary file and a rename: never a truncated file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: str | Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2) + "\n")
