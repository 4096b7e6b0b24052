"""The light config layer: the model schema Hydra checks ``conf/model/*.yaml``
against, composing the training config as ``python train.py`` does, the checks that
refuse impossible settings before anything is written, and the model a config
describes. Imports neither Lightning nor the training code, so the study's stage
commands, the benchmark and the tests compose and build models without them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from . import CONFIG_DIR
from .errors import ConfigError
from .model import ModelConfig, ModelSize, Transformer

#: conf/model/*.yaml extend this schema, so a wrong type fails at composition, naming the key
ConfigStore.instance().store(group="schema", name="model", node=ModelSize)


def compose(overrides: Sequence[str] = (), config_dir: str = CONFIG_DIR) -> DictConfig:
    """The training config with Hydra overrides, as ``python train.py`` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


def check_config(cfg: DictConfig) -> None:
    """Refuse impossible settings early: builds the scheme alone (which checks
    widths, rotary dims and directions) and checks the training length."""
    m = cfg.model
    if m.d_model % m.n_heads:
        raise ConfigError(
            f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
            "pick a head count that divides the width"
        )
    if cfg.data.seq_len < 1:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len} must be at least 1")
    check_optim(cfg)
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool):
        raise ConfigError(f"seed={cfg.seed} must be an integer")
    if cfg.get("init_from") and cfg.ckpt_path not in (None, ""):
        raise ConfigError("init_from and ckpt_path are both set: a resume already has its weights; drop one")
    try:
        scheme = instantiate(cfg.encoding.scheme)(
            d_model=m.d_model, n_heads=m.n_heads, max_len=m.max_len, causal=bool(cfg.task.causal)
        )
        scheme.check_length(int(cfg.data.seq_len))
    except ValueError as e:  # the scheme's own checks name the setting
        raise ConfigError(str(e)) from e
    check_criterion(cfg)
    if cfg.task.get("objective") == "retrieval":  # a window that cannot hold its needles and queries
        from .retrieval import Layout

        T, n, k = int(cfg.data.seq_len), int(cfg.task.get("needles", 1)), int(cfg.task.get("digits", 5))
        try:
            Layout(T, n, k)
        except ValueError as e:
            raise ConfigError(f"task=retrieval with data.seq_len={T}, task.needles={n}, task.digits={k}: {e}") from e


def validation_metrics(task: DictConfig) -> list[str]:
    """What validation logs for a task (``posenc.module.LMModule``): loss and perplexity,
    accuracy for the masked LM and retrieval, exact match for retrieval."""
    objective = task.get("objective")
    return ["val/loss", "val/ppl"] + ["val/acc"] * (objective in ("mlm", "retrieval")) + \
        ["val/exact"] * (objective == "retrieval")


def check_criterion(cfg: DictConfig) -> None:
    """A criterion (``criterion.metric``) must name a metric the task validates, with a number
    to pass and a direction."""
    c = cfg.get("criterion") or {}
    if not c.get("metric"):
        return
    known = validation_metrics(cfg.task)
    if c.metric not in known:
        raise ConfigError(f"criterion.metric={c.metric} is not validated by task={cfg.task.name}; "
                          f"choose one of {', '.join(known)}")
    try:
        ok = math.isfinite(float(c.get("value")))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"criterion.value={c.get('value')} must be a number, e.g. criterion.value=0.9")
    if c.get("mode", "max") not in ("max", "min"):
        raise ConfigError(f"criterion.mode={c.mode} must be max (stop above the value) or min (below it)")


def check_optim(cfg: DictConfig) -> None:
    """Refuse optimiser settings that cannot train, naming the setting: a learning rate
    that is not a number or is negative, negative weight decay or warm-up, betas outside
    [0, 1), a final LR ratio outside [0, 1], a schedule shorter than one step."""
    o = cfg.optim

    def number(key: str) -> float:
        value = o.get(key)
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"optim.{key}={value} is not a number") from None
        if not math.isfinite(x):
            raise ConfigError(f"optim.{key}={value} must be finite")
        return x

    if number("lr") < 0:  # 0 is allowed: a run that must not change its weights (a test of init_from)
        raise ConfigError(f"optim.lr={o.lr} must not be negative, e.g. optim.lr=1e-3")
    if number("weight_decay") < 0:
        raise ConfigError(f"optim.weight_decay={o.weight_decay} must be at least 0")
    if number("warmup_steps") < 0 or float(o.warmup_steps) != int(float(o.warmup_steps)):
        raise ConfigError(f"optim.warmup_steps={o.warmup_steps} must be a whole number of steps, at least 0")
    if not 0 <= number("min_lr_ratio") <= 1:
        raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio} must lie in [0, 1]")
    betas = list(o.betas) if OmegaConf.is_list(o.betas) else None
    try:
        ok = betas is not None and len(betas) == 2 and all(0 <= float(b) < 1 for b in betas)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"optim.betas={o.betas} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.95]")
    steps = o.get("schedule_steps")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"optim.schedule_steps={steps} must be a whole number of steps, at least 1, or null")


def build_model(cfg: DictConfig | dict, vocab_size: int) -> Transformer:
    """The Transformer a config describes (model group + encoding group + task)."""
    cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    model_kw = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "_target_"}
    mcfg = ModelConfig(vocab_size=vocab_size, causal=bool(cfg.task.causal), **model_kw)
    factory = instantiate(cfg.encoding.scheme)
    return Transformer(mcfg, factory)
