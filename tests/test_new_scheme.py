"""Adding a scheme takes one class and one YAML file, nothing else.

A throwaway scheme (a learned per-head logit penalty on distance) is written
to a temporary folder as a module with one class and a config file with its
``_target_``, outside the repository; the project's own files are not touched
(the config folder is added to Hydra's search path, the module to sys.path).
It then trains, is evaluated at longer lengths from its checkpoint, and its
named logit terms sum to the logits the model uses: the three things the study
does with every scheme.

A second throwaway scheme, its config root put in ``POSENC_SCHEME_PATH`` and its
module on ``PYTHONPATH``, is collected by every property test of
``tests/test_encodings.py`` that applies to it and passes them, while wrong
``relative`` declarations and an unimportable ``_target_`` fail there.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest
import torch
from posenc.config import compose

from posenc import evaluate as ev
from posenc.runs import load_module
from posenc.train import train

from .conftest import FAST, REPO

SCHEME = '''
import torch
from torch import nn

from posenc.encodings.base import PositionalScheme, relative_positions


class DistancePenalty(PositionalScheme):
    """-softplus(w_h) * |i - j| / 8 on the logits: a throwaway scheme for a test."""

    def __init__(self, *, init: float = 0.0, **kw):
        super().__init__(**kw)
        self.w = nn.Parameter(torch.full((self.n_heads,), init))

    def absolute_bias(self, q_pos, k_pos):
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
    cfg = compose(overrides)
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


# ------------------------------------------------ the property tests find it too
OOT_SCHEME = '''
import torch
from torch import nn

from posenc.encodings.base import PositionalScheme, relative_positions


class OutOfTreePenalty(PositionalScheme):
    """A learned per-head distance penalty on the logits, -softplus(w_h) |i - j| / 8
    (linear biases as in Press et al. 2022, with learned slopes): a throwaway scheme
    kept outside the repository. Checked against the formula evaluated entry by
    entry in test_oot_penalty_vs_formula.
    """

    relative = True

    def __init__(self, *, init: float = 0.5, **kw):
        super().__init__(**kw)
        self.w = nn.Parameter(init + torch.linspace(0.0, 1.0, self.n_heads))  # one slope per head

    def absolute_bias(self, q_pos, k_pos):
        dist = relative_positions(q_pos, k_pos).abs().to(self.w.dtype)  # (Tq, Tk)
        return -nn.functional.softplus(self.w)[None, :, None, None] * dist / 8  # (1, H, Tq, Tk)
'''

OOT_REFERENCE = '''
import math

import torch

from oot_penalty import OutOfTreePenalty


def test_oot_penalty_vs_formula():
    sch = OutOfTreePenalty(d_model=16, n_heads=4, causal=False)
    pos = torch.arange(6) + 3
    got = sch.bias(None, None, pos, pos)[0].tolist()
    for h in range(4):
        slope = math.log1p(math.exp(float(sch.w.detach()[h])))
        for i in range(6):
            for j in range(6):
                assert abs(got[h][i][j] + slope * abs(i - j) / 8) < 1e-6, (h, i, j)
'''

# wrong declarations, in a second config root
OOT_BROKEN = '''
from torch import nn

from oot_penalty import OutOfTreePenalty


class ShiftyPenalty(OutOfTreePenalty):
    """Declares relative = True, but its bias depends on the query position alone
    (Nobody et al. 2024). Checked against nothing in test_oot_penalty_vs_formula."""

    def absolute_bias(self, q_pos, k_pos):
        qp = q_pos.to(self.w.dtype)[:, None].expand(-1, k_pos.shape[0])  # absolute
        return -nn.functional.softplus(self.w)[None, :, None, None] * qp / 8


class ModestPenalty(OutOfTreePenalty):
    """Relative, but declares relative = False (Nobody et al. 2024). Checked against
    the formula in test_oot_penalty_vs_formula."""

    relative = False
'''


def oot_yaml(name: str, target: str) -> str:
    return f"name: {name}\nscheme:\n  _target_: {target}\n  _partial_: true\n"


#: the property tests that apply to a relative scheme with a learned position-only bias,
#: and how many cases each gets (both attention modes, or one per scheme)
OOT_EXPECTED = {
    "test_configs_build_and_flags": 1,
    "test_docstring_cites_paper_and_names_its_check": 1,
    "test_shift_invariance_matches_relative_flag": 2,
    "test_terms_sum_to_logits": 2,
    "test_attention_layer_equals_dense_reference": 6,
    "test_model_equals_dense_reference": 4,
    "test_model_in_float64_equals_dense_reference": 2,
    "test_recomputed_bias_backward_equals_autograd": 2,
    "test_position_bias_parts_sum_to_bias": 2,
    "test_causal_model_ignores_later_tokens": 1,
    "test_gradients_reach_positional_parameters": 2,
    "test_tiny_model_trains_on_real_text": 1,
    "test_dtypes_follow_the_activations": 2,
    "test_checkpoints_hold_parameters_not_derived_tables": 1,
    "test_last_positions_equal_the_full_forward": 2,
    "test_a_position_block_is_its_part_of_the_whole_mask": 2,
    "test_the_recomputed_route_keeps_nothing_of_size_t_squared_for_the_backward": 2,
    "test_each_schemes_flex_parts_give_its_bias_and_gradients_on_index_grids": 4,
    "test_a_layer_on_the_flex_route_equals_the_dense_reference": 4,
    "test_the_model_on_the_flex_route_equals_the_dense_reference": 2,
    "test_the_probe_passes_a_kernel_that_is_right": 8,
    "test_a_position_bias_at_any_positions_is_the_whole_matrix_at_those_rows_and_keys": 2,
}


def collected_cases(output: str, scheme: str) -> dict[str, int]:
    """Test function -> number of its collected ids whose first parameter is ``scheme``."""
    counts: dict[str, int] = {}
    for m in re.finditer(r"::(test_\w+)\[([^\]]+)\]$", output, re.M):
        if m.group(2).split("-")[0] == scheme:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def junit_cases(path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, message) from a JUnit XML report."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, child.get("message", "") + (child.text or "")
        out[case.get("name")] = (outcome, message)
    return out


@pytest.mark.slow  # three pytest processes, each importing Lightning through conftest: ~20-30 s on 2 busy cores
def test_a_scheme_outside_the_tree_gets_every_property_test(tmp_path, monkeypatch):
    """A scheme kept outside the repository (its module on PYTHONPATH, its config root in
    POSENC_SCHEME_PATH) is collected by every property test that applies to it and passes
    them; a wrong ``relative`` declaration fails the shift-invariance test either way, and
    a config whose _target_ does not import fails (is not skipped)."""
    src, good, bad = tmp_path / "src", tmp_path / "conf", tmp_path / "more" / "conf"
    src.mkdir()
    (good / "encoding").mkdir(parents=True)
    (bad / "encoding").mkdir(parents=True)
    (src / "oot_penalty.py").write_text(textwrap.dedent(OOT_SCHEME))
    (src / "test_oot_penalty_reference.py").write_text(textwrap.dedent(OOT_REFERENCE))  # beside the module
    (src / "oot_broken.py").write_text(textwrap.dedent(OOT_BROKEN))
    (good / "encoding" / "oot_penalty.yaml").write_text(oot_yaml("oot_penalty", "oot_penalty.OutOfTreePenalty"))
    (bad / "encoding" / "shifty_penalty.yaml").write_text(oot_yaml("shifty_penalty", "oot_broken.ShiftyPenalty"))
    (bad / "encoding" / "modest_penalty.yaml").write_text(oot_yaml("modest_penalty", "oot_broken.ModestPenalty"))
    (bad / "encoding" / "ghost.yaml").write_text(oot_yaml("ghost", "oot_no_such_module.Ghost"))

    # the reference test the docstring names holds
    monkeypatch.syspath_prepend(str(src))
    spec = importlib.util.spec_from_file_location("oot_reference", src / "test_oot_penalty_reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    reference.test_oot_penalty_vs_formula()

    env = dict(os.environ, POSENC_SCHEME_PATH=os.pathsep.join([str(good), str(bad)]), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    pytest_cmd = [sys.executable, "-m", "pytest", "tests/test_encodings.py", "tests/test_attention.py",
                  "-n0", "-p", "no:cacheprovider", "--full"]  # one process each: they run at once
    runs = {  # three pytest processes at once: each spends most of its time importing
        "collect": pytest_cmd + ["--collect-only", "-q"],
        "good": pytest_cmd + ["-q", "-k", "oot_penalty"],
        "broken": pytest_cmd + [
            "-q", "--junitxml", str(tmp_path / "broken.xml"),
            "-k", "test_shift_invariance_matches_relative_flag and (shifty_penalty or modest_penalty) or ghost",
        ],
    }  # fmt: skip
    procs = {k: subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k, cmd in runs.items()}  # fmt: skip
    out = {k: p.communicate(timeout=300)[0] for k, p in procs.items()}
    rc = {k: p.returncode for k, p in procs.items()}

    # collected by every property test that applies, as often as the modes it has
    assert rc["collect"] == 0, out["collect"][-3000:]
    assert collected_cases(out["collect"], "oot_penalty") == OOT_EXPECTED, out["collect"][-3000:]
    assert collected_cases(out["collect"], "modest_penalty")["test_shift_invariance_matches_relative_flag"] == 2

    # and passes them all
    assert rc["good"] == 0, out["good"][-5000:]
    assert f"{sum(OOT_EXPECTED.values())} passed" in out["good"], out["good"][-2000:]

    # wrong declarations fail the shift-invariance test, both ways; an unimportable target fails
    assert rc["broken"] == 1, out["broken"][-5000:]
    cases = junit_cases(tmp_path / "broken.xml")
    for scheme, says in (("shifty_penalty", "declares relative = True"), ("modest_penalty", "set `relative = True`")):
        for mode in ("causal", "bidir"):
            outcome, message = cases[f"test_shift_invariance_matches_relative_flag[{scheme}-{mode}]"]
            assert outcome == "failure" and says in message, (scheme, mode, outcome, message[:500])
    ghost = {k: v for k, v in cases.items() if "[ghost" in k}
    assert len(ghost) >= 10, sorted(cases)
    for case, (outcome, message) in ghost.items():
        assert outcome == "failure", (case, outcome, message[:500])
        assert "oot_no_such_module.Ghost' cannot be imported" in message, (case, message[:500])
