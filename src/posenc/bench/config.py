"""Settings and model configs of the benchmark, composed as a training run composes them.

Workload. ``model=small`` (``--model`` picks another ``conf/model`` file),
composed by Hydra from ``conf/train.yaml`` exactly as a training run is, causal
language modelling (``task=lm``), random token ids from a ``--vocab-size``
vocabulary, a fixed token budget per batch: ``batch = max(1, tokens_per_batch
// T)``, so every length does about the same dense work and T=4096 fits on a
CPU. ``model.max_len`` is raised to the longest benchmarked length so that the
table-based schemes (``learned``, ``tupe``) accept it. CPU: fp32. CUDA (when
present): bf16 autocast, fp32 weights and optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .. import CONFIG_DIR

CONF_DIR = Path(CONFIG_DIR)

#: the order of the tables; schemes found in conf/encoding but not listed here follow, sorted
DEFAULT_ORDER = (
    "none",
    "sinusoidal",
    "learned",
    "cape",
    "rope",
    "xpos",
    "alibi",
    "t5_bias",
    "kerple",
    "fire",
    "tupe",
    "shaw",
    "skew",
    "transformer_xl",
    "fixed_bidirectional",
)
POSENC, XT = "posenc", "x-transformers"
TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}

# targets of the performance work (reported, never asserted), at T = TARGET_LENGTH:
TARGET_LENGTH = 1024
#: every scheme: step time over none at most this multiple of its FLOP share over none
TARGET_FLOP_EFFICIENCY = 1.15
#: the position biases Press et al. call free: step time over none at most
TARGET_STEP_CHEAP = 1.10
CHEAP_BIASES = ("alibi", "t5_bias", "kerple")
#: every scheme without a value term: peak training memory over none at most
TARGET_MEM = 1.5
#: the class of a scheme with a value term (``models._classes``); the memory target leaves it
#: out, as it was set when such a scheme kept all of its attention probabilities
VALUE_TERM = "bias + value term"


# ----------------------------------------------------------------- settings


@dataclass
class BenchSettings:
    schemes: list[str]
    lengths: list[int]
    repeats: dict[int, int]
    warmup: dict[int, int]
    tokens_per_batch: int = 4096
    vocab_size: int = 4096
    model_name: str = "small"
    model: dict[str, Any] = field(default_factory=dict)
    encodings: dict[str, dict[str, Any]] = field(default_factory=dict)
    out_dir: str = "results/bench"
    memory: bool = True
    memory_lengths: list[int] | None = None
    xtransformers: bool = True
    tiny: bool = False
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    max_memory_gb: float | None = None
    progress: bool = True
    compile: bool = False

    def batch(self, T: int) -> int:
        return max(1, self.tokens_per_batch // T)


def discover_schemes(conf_dir: Path = CONF_DIR) -> list[str]:
    """Every ``conf/encoding/*.yaml``, in ``DEFAULT_ORDER`` first, then sorted."""
    found = {p.stem for p in (conf_dir / "encoding").glob("*.yaml")}
    return [s for s in DEFAULT_ORDER if s in found] + sorted(found - set(DEFAULT_ORDER))


def compose_configs(model_name: str, schemes: list[str], max_length: int, tiny: bool) -> tuple[dict, dict]:
    """(model config, {scheme: its ``encoding.scheme`` node}) as plain dicts,
    composed by Hydra from ``conf/train.yaml`` with ``model=<name>`` and
    ``encoding=<scheme>`` exactly as a training run would (schemas and
    defaults lists included). ``model.max_len`` is raised to the longest
    benchmarked length; ``--tiny`` overrides the sizes. The memory probes get
    these dicts, so they never read config files."""
    from ..config import compose

    encodings: dict[str, dict] = {}
    model: dict[str, Any] = {}
    for sch in schemes:
        cfg = compose([f"model={model_name}", f"encoding={sch}", "task=lm"], str(CONF_DIR))
        encodings[sch] = OmegaConf.to_container(cfg.encoding.scheme, resolve=True)
        model = OmegaConf.to_container(cfg.model, resolve=True)
    model = {k: v for k, v in model.items() if k != "_target_"}
    if tiny:
        model.update(TINY_MODEL)
    model["max_len"] = max(int(model.get("max_len", 0)), max_length)
    model["dropout"] = 0.0
    return model, encodings
