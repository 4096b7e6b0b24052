"""The setting ``compile=true``: the model compiled in place (torch.compile) trains as the
eager model does, and its checkpoint keeps the eager model's keys."""

from __future__ import annotations

import pytest
import torch

from posenc.bench.gpu_check import RecordLosses
from posenc.runs import RunFolder


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["none", "alibi"])
def test_a_compiled_model_trains_as_the_eager_one(scheme, make_cfg, tmp_path):
    """Four steps of ``model=micro`` eager and compiled from the same seed: the same losses to
    1e-4 relative (the compiled kernels may sum in another order), and checkpoints with the same
    keys (``nn.Module.compile`` wraps no module, so evaluation and resumes read either)."""
    from posenc.train import train

    from torch._dynamo.utils import counters

    losses, keys, graphs = {}, {}, {}
    for compiled in (False, True):
        RecordLosses.losses = []
        counters.clear()
        cfg = make_cfg(f"encoding={scheme}", "model=micro", "trainer.max_steps=4", "trainer.val_check_interval=4",
                       "trainer.limit_val_batches=1", "~logger", f"compile={str(compiled).lower()}",
                       "+callbacks.losses._target_=posenc.bench.gpu_check.training.RecordLosses")  # fmt: skip
        out = tmp_path / f"run-{compiled}"
        train(cfg, out_dir=out)
        losses[compiled] = list(RecordLosses.losses)
        graphs[compiled] = counters["stats"]["unique_graphs"]
        keys[compiled] = sorted(torch.load(RunFolder(out).last, weights_only=False)["state_dict"])
    assert graphs == {False: 0, True: graphs[True]} and graphs[True] > 0  # compiled only when asked
    assert len(losses[True]) == 4
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
    assert keys[True] == keys[False]


@pytest.mark.slow
def test_the_compiled_rotation_is_the_eager_one():
    """The kernel CUDA rotates q and k with (``rotary._rotate`` compiled) against the eager
    function, here compiled for the CPU: rotated pairs and the features that pass through."""
    from posenc.encodings import rotary

    torch.manual_seed(0)
    x = torch.randn(2, 3, 17, 10)
    angles = torch.randn(17, 4)  # 8 of 10 features rotate
    cos, sin = angles.cos(), angles.sin()
    torch.testing.assert_close(rotary._rotate_compiled()(x, cos, sin), rotary._rotate(x, cos, sin))
    assert torch.equal(rotary.rotate_pairs(x, angles), rotary._rotate(x, cos, sin))  # eager off CUDA


def test_the_rotation_runs_eagerly_past_its_recompilation_limit(monkeypatch):
    """The compiled rotation (here compiled for the CPU, ``aot_eager``) under a limit lowered to
    one graph: float32 compiles it; float64 needs a second graph, and torch fails instead of
    running it unfused (``posenc.compiling``): one warning, the eager rotation's values, and the
    eager rotation from then on, without another warning."""
    import warnings

    import posenc.compiling as compiling
    from posenc.encodings import rotary

    torch._dynamo.reset()
    monkeypatch.setattr(rotary, "COMPILED_ON", ("cpu",))
    monkeypatch.setattr(rotary, "_EAGER", [])
    compiled = torch.compile(rotary._rotate, backend="aot_eager")
    monkeypatch.setattr(rotary, "_rotate_compiled", lambda: compiled)
    monkeypatch.setattr(compiling, "RECOMPILE_LIMIT", 1)
    torch.manual_seed(0)
    x, angles = torch.randn(2, 3, 17, 10), torch.randn(17, 4)
    want = rotary._rotate(x, angles.cos(), angles.sin())
    assert torch.equal(rotary.rotate_pairs(x, angles), want)
    with pytest.warns(UserWarning, match="compiled rotation runs eagerly from here on.*limit of 1"):
        got = rotary.rotate_pairs(x.double(), angles.double())
    torch.testing.assert_close(got, want.double())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rotary.rotate_pairs(x.half(), angles.half())
    assert len(rotary._EAGER) == 1
    torch._dynamo.reset()
