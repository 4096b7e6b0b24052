"""Adding a scheme takes one class and one YAML file, nothing else.

A throwaway scheme (a learned per-head logit penalty on distance) is written
to a temporary folder as a module with one class and a config file with its
``_target_``, outside the repository; the project's own files are not touched
(the config folder is added to Hydra's search path, the module to sys.path).
It then trains, is evaluated at longer lengths from its checkpoint, and its
named logit terms sum to the logits the model uses: the three things the study
does with every scheme.
"""

from __future__ import annotations

import math
import sys
import textwrap

import torch
from hydra import compose, initialize_config_dir

from posenc import evaluate as ev
from posenc.runs import load_module
from posenc.train import CONFIG_DIR, train

from .conftest import FAST, REPO

SCHEME = '''
import torch
from torch import nn

from posenc.encodings.base import PositionalScheme, relative_positions


class DistancePenalty(PositionalScheme):
    """-softplus(w_h) * |i - j| / 8 on the logits: a throwaway scheme for a test."""

    has_bias = True
    position_only_bias = True

    def __init__(self, *, init: float = 0.0, **kw):
        super().__init__(**kw)
        self.w = nn.Parameter(torch.full((self.n_heads,), init))

    def bias(self, q, k, q_pos, k_pos):
        dist = relative_positions(q_pos, k_pos).abs().to(self.w.dtype)  # (Tq, Tk)
        return -nn.functional.softplus(self.w)[None, :, None, None] * dist / 8  # (1, H, Tq, Tk)
'''

CONFIG = """
name: throwaway
scheme:
  _target_: throwaway_scheme.DistancePenalty
  _partial_: true
  init: 0.5
"""


def test_a_new_scheme_needs_one_class_and_one_yaml(tmp_path, data_root, cache_dir, monkeypatch):
    before = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "conf").rglob("*"))
    src, conf = tmp_path / "src", tmp_path / "conf" / "encoding"
    src.mkdir()
    conf.mkdir(parents=True)
    (src / "throwaway_scheme.py").write_text(textwrap.dedent(SCHEME))
    (conf / "throwaway.yaml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(src))
    overrides = [
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
        "encoding=throwaway",
        f"paths.root={tmp_path}",
        f"paths.data_dir={data_root}",
        f"paths.cache_dir={cache_dir}",
        *FAST,
        "log_checkpoint=false",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=False)
    assert cfg.encoding.name == "throwaway" and cfg.run_name.startswith("throwaway-lm-")

    # trains
    metrics = train(cfg, out_dir=tmp_path / "run")
    assert metrics["global_step"] == 20 and math.isfinite(metrics["val/loss"])

    # evaluated from its checkpoint at L, 2L and 4L on the same tokens
    settings = ev.Settings(multipliers=(1, 2, 4), methods=("nonoverlapping",), max_tokens=2048,
                           log_mlflow=False, progress=False)  # fmt: skip
    rows, _ = ev.evaluate_checkpoint(tmp_path / "run", settings)
    assert [r["eval_len"] for r in rows] == [32, 64, 128]
    assert all(r["scheme"] == "throwaway" and math.isfinite(r["ppl"]) for r in rows)

    # its named terms sum to the first layer's real logits
    module = load_module(tmp_path / "run" / "checkpoints" / "last.ckpt")
    model = module.model
    assert type(model.blocks[0].attn.scheme).__name__ == "DistancePenalty"
    assert model.num_parameters()["positional"] == cfg.model.n_heads  # shared by the layers (the default)
    assert not torch.allclose(model.blocks[0].attn.scheme.w, torch.full((cfg.model.n_heads,), 0.5))  # it learned
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16))
    pos = torch.arange(16)
    terms = model.first_layer_terms(idx, pos)
    assert set(terms) == {"word-word", "position-position"}
    word, posn = model.embed(idx, pos)
    q, k, _ = model.blocks[0].attn.project(model.blocks[0].ln1(word if posn is None else word + posn))
    torch.testing.assert_close(sum(terms.values()), model.blocks[0].attn.logits(q, k, pos, pos), atol=1e-5, rtol=1e-5)

    # nothing of the project was changed to get here
    assert sorted(p.relative_to(REPO).as_posix() for p in (REPO / "conf").rglob("*")) == before
    assert "throwaway_scheme" in sys.modules and not any(
        (REPO / "src" / "posenc").rglob("throwaway*")
    )
