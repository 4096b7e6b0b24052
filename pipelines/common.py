"""Shared bits of the stage CLIs: composing the training config (files are written
with ``posenc.files``)."""

from __future__ import annotations

from omegaconf import DictConfig

from posenc import CONFIG_DIR


def compose_config(overrides: list[str]) -> DictConfig:
    """The training config with Hydra overrides, as ``python train.py`` would see it."""
    from hydra import compose, initialize_config_dir

    import posenc.train  # noqa: F401 -- registers the model schema that conf/model/*.yaml extends

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides))
