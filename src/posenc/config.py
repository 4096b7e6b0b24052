"""The light config layer: the model schema Hydra checks ``conf/model/*.yaml``
against, composing the training config as ``python train.py`` does, the checks that
refuse impossible settings before anything is written, and the model a config
describes. Imports neither Lightning nor the training code, so the study's stage
commands, the benchmark and the tests compose and build models without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from . import CONFIG_DIR
from .attention import check_route_setting
from .errors import ConfigError
from .model import ModelConfig, ModelSize, Transformer
from .ranges import Range
from .taskbase import build as build_task

#: conf/model/*.yaml extend this schema, so a wrong type fails at composition, naming the key
ConfigStore.instance().store(group="schema", name="model", node=ModelSize)


def compose(overrides: Sequence[str] = (), config_dir: str = CONFIG_DIR) -> DictConfig:
    """The training config with Hydra overrides, as ``python train.py`` would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides))


#: the range of every numeric setting outside the model schema (``ModelSize``'s fields hold the
#: model's): a new numeric setting gets its check by a line here, and a test tries values just
#: outside every range (``tests/test_settings.py``), so none can start a run
RANGES: dict[str, Range] = {
    "seed": Range(),
    "data.seq_len": Range(1),
    "data.batch_size": Range(1),
    "data.eval_batch_size": Range(1),
    "data.vocab_size": Range(1),
    "data.min_frequency": Range(0),
    "data.num_workers": Range(0),
    "data.corpus.split_fractions.validation": Range(0, 1, whole=False, low_open=True, high_open=True),
    "data.corpus.split_fractions.test": Range(0, 1, whole=False, low_open=True, high_open=True),
    "trainer.max_steps": Range(1),
    "trainer.val_check_interval": Range(1),  # steps: training is one endless epoch, so no fraction of one
    "trainer.log_every_n_steps": Range(1),
    "trainer.limit_val_batches": Range(fraction=True, null=True),
    "trainer.limit_test_batches": Range(fraction=True, null=True),
    "trainer.accumulate_grad_batches": Range(1),
    "trainer.gradient_clip_val": Range(0, whole=False, null=True),
    "trainer.num_nodes": Range(1),
    "optim.lr": Range(0, whole=False),  # 0: a run that must not change its weights (a test of init_from)
    "optim.weight_decay": Range(0, whole=False),
    "optim.warmup_steps": Range(0),
    "optim.min_lr_ratio": Range(0, 1, whole=False),
    "optim.schedule_steps": Range(1, null=True),
    "task.mask_prob": Range(0, 1, whole=False, low_open=True),
    "task.digits": Range(1, 10),
    "task.needles": Range(1),
    "criterion.value": Range(whole=False, null=True),
}

_ABSENT = object()


def numeric_ranges() -> dict[str, Range]:
    """Every declared range: the model schema's fields, then ``RANGES``."""
    model = {f"model.{f.name}": f.metadata["range"] for f in fields(ModelSize) if "range" in f.metadata}
    return model | RANGES


def check_ranges(cfg: DictConfig) -> None:
    """Every declared numeric setting the config has lies in its range (a setting the config
    does not have, such as ``task.mask_prob`` outside the masked LM, is left alone)."""
    for key, rng in numeric_ranges().items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            continue
        problem = rng.problem(value)
        if problem:
            raise ConfigError(f"{key}={value} {problem}")


def check_device(cfg: DictConfig) -> None:
    """An accelerator the machine does not have is refused here, in one line naming the
    CPU's (Lightning would raise deep inside the trainer, after the run folder exists)."""
    import torch

    accelerator = str(cfg.trainer.get("accelerator", "cpu"))
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("trainer=gpu needs a CUDA GPU and torch sees none here; train on the CPU with trainer=cpu")
        devices = cfg.trainer.get("devices", 1)
        if isinstance(devices, int) and devices > torch.cuda.device_count():
            raise ConfigError(f"trainer.devices={devices}: this machine has {torch.cuda.device_count()} GPU(s)")
    elif accelerator == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("trainer.accelerator=mps needs Apple's GPU and torch sees none here; use trainer=cpu")


#: a CPU's training speed the time warning assumes (a matmul-bound step, float32): about what
#: a current x86 core reaches (the benchmark's matmul peak on the study's machines: 1e11 to 2e11)
CPU_FLOPS = 1e11


def cost_warnings(cfg: DictConfig, scheme) -> list[str]:
    """One line each for settings that cannot fail but cost time or waste the run: a window past
    ``model.max_len`` for a scheme that is not bound by it (attention grows with its
    square), a run whose training FLOPs take hours at ``CPU_FLOPS`` on the CPU, and a warm-up
    as long as the run or longer (it ends with its learning rate still rising:
    ``posenc.module.warmup_cosine`` gives step s the factor (s + 1) / warmup_steps)."""
    m, d = cfg.model, cfg.data
    T, B, steps = int(d.seq_len), int(d.batch_size), int(cfg.trainer.max_steps)
    out = []
    if T > m.max_len:
        out.append(f"data.seq_len={T} is past model.max_len={m.max_len}: {cfg.encoding.name} is not bound by it, "
                   f"but attention per window grows with the square of its length ({(T / m.max_len) ** 2:.0f}x "
                   f"a {m.max_len}-token window's); choose a shorter data.seq_len, or accept the cost")
    if str(cfg.trainer.get("accelerator", "cpu")) == "cpu":
        per_token = 6 * m.n_layers * (4 * m.d_model**2 + 2 * m.d_model * m.d_ff) + 12 * m.n_layers * T * m.d_model
        hours = per_token * T * B * steps / CPU_FLOPS / 3600
        if hours >= 1:
            out.append(f"this run is about {per_token * T * B * steps / 1e15:.1f} PFLOP of training: about "
                       f"{hours:.0f} hour(s) on a CPU at {CPU_FLOPS / 1e9:.0f} GFLOP/s; fewer trainer.max_steps, a "
                       "smaller model or window, or trainer=gpu")
    warmup = int(cfg.optim.warmup_steps)
    if warmup >= steps:
        out.append(f"optim.warmup_steps={warmup} is not below trainer.max_steps={steps}: the run ends in its warm-up, "
                   f"its learning rate still rising (at its last step {steps / warmup:.0%} of optim.lr); lower "
                   "optim.warmup_steps or raise trainer.max_steps")
    return out


def check_config(cfg: DictConfig, task=None) -> list[str]:
    """Refuse impossible settings before anything is written, with one line naming the
    setting and the fix: every numeric setting in its declared range (``numeric_ranges``),
    the optimiser's betas, a device the machine has, widths that fit, the scheme (built
    alone: its own checks of widths, rotary dims, directions and the training length),
    the criterion and the retrieval window. Returns the warnings for settings that only
    cost time (``cost_warnings``), for the caller to print. ``task``: the run's task object,
    when the caller has built it (``posenc.train``: one per run), else built here."""
    check_ranges(cfg)
    m = cfg.model
    if m.d_model % m.n_heads:
        raise ConfigError(
            f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
            "pick a head count that divides the width"
        )
    check_optim(cfg)
    if cfg.get("init_from") and cfg.ckpt_path not in (None, ""):
        raise ConfigError("init_from and ckpt_path are both set: a resume already has its weights; drop one")
    check_device(cfg)
    check_attention(cfg)
    try:
        scheme = instantiate(cfg.encoding.scheme)(
            d_model=m.d_model, n_heads=m.n_heads, max_len=m.max_len, causal=bool(cfg.task.causal)
        )
        scheme.check_length(int(cfg.data.seq_len))
    except ValueError as e:  # the scheme's own checks name the setting
        raise ConfigError(str(e)) from e
    task = task or build_task(cfg.task)
    check_criterion(cfg, task)
    task.check(cfg)
    return cost_warnings(cfg, scheme)


def check_attention(cfg: DictConfig) -> None:
    """``attention.route``: one of ``ROUTE_SETTINGS``, and ``flex`` only where training can run
    through FlexAttention (CUDA: it has no backward for q, k, v on the CPU)."""
    route = str(OmegaConf.select(cfg, "attention.route", default="auto"))
    try:
        check_route_setting(route)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if route == "flex" and str(cfg.trainer.get("accelerator", "cpu")) not in ("gpu", "cuda"):
        raise ConfigError("attention.route=flex trains through FlexAttention, which has no backward on the CPU; "
                          "use attention.route=auto (the float-mask routes there) or trainer=gpu")


def check_criterion(cfg: DictConfig, task) -> None:
    """A criterion (``criterion.metric``) must name a metric the task (its object) validates,
    with a number to pass and a direction."""
    c = cfg.get("criterion") or {}
    if not c.get("metric"):
        return
    known = task.validated()
    if c.metric not in known:
        raise ConfigError(f"criterion.metric={c.metric} is not validated by task={cfg.task.name}; "
                          f"choose one of {', '.join(known)}")
    if c.get("value") is None:  # a number, or null (its range); with a metric, a number
        raise ConfigError(f"criterion.metric={c.metric} needs criterion.value, the number to pass, e.g. "
                          "criterion.value=0.9")
    if c.get("mode", "max") not in ("max", "min"):
        raise ConfigError(f"criterion.mode={c.mode} must be max (stop above the value) or min (below it)")


def check_optim(cfg: DictConfig) -> None:
    """The optimiser's betas: two numbers in [0, 1) (its other numbers have their ranges in
    ``RANGES``)."""
    o = cfg.optim
    betas = list(o.betas) if OmegaConf.is_list(o.betas) else None
    try:
        ok = betas is not None and len(betas) == 2 and all(0 <= float(b) < 1 for b in betas)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"optim.betas={o.betas} must be two numbers in [0, 1), e.g. optim.betas=[0.9,0.95]")


def build_model(cfg: DictConfig | dict, vocab_size: int) -> Transformer:
    """The Transformer a config describes (model group + encoding group + task)."""
    cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    model_kw = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "_target_"}
    mcfg = ModelConfig(vocab_size=vocab_size, causal=bool(cfg.task.causal), **model_kw)
    factory = instantiate(cfg.encoding.scheme)
    return Transformer(mcfg, factory)
