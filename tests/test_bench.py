"""The benchmark (``python -m posenc.bench``) in its tiny CI configuration.

No timing asserts: only that it runs, covers every scheme and length, writes
its files, and that the numbers which are exact by construction are exact
(ratios of ``none`` to itself, FLOP counts against the PaLM formula).

The fast attention path is checked against the reference path for every
scheme in ``tests/test_encodings.py::test_fast_path_equals_naive_attention``.
"""

from __future__ import annotations

import json

import pytest
import torch

from posenc import bench

pytestmark = pytest.mark.slow


def run_tiny(tmp_path, *extra: str) -> dict:
    out = tmp_path / "bench"
    threads = torch.get_num_threads()
    args = ["--tiny", "--threads", "1", "--warmup", "0", "--no-progress", "--out-dir", str(out), *extra]
    assert bench.main(args) == 0
    assert torch.get_num_threads() == threads  # restored for the rest of the session
    for name in ("bench.json", "bench.md", "bench.png", "bench.svg"):
        assert (out / name).stat().st_size > 0, name
    assert not list(out.glob(".*.tmp")), "a temporary file was left behind"
    return json.loads((out / "bench.json").read_text()) | {"_md": (out / "bench.md").read_text()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    return run_tiny(tmp_path_factory.mktemp("tiny"), "--no-memory")


def test_one_entry_per_scheme_and_length(tiny):
    schemes = bench.discover_schemes()
    assert tiny["meta"]["settings"]["schemes"] == schemes
    assert "none" in schemes
    lengths = tiny["meta"]["settings"]["lengths"]
    assert lengths == [32, 64]
    rows = [r for r in tiny["summary"] if r["impl"] == bench.POSENC]
    assert sorted((r["scheme"], r["T"]) for r in rows) == sorted((s, t) for s in schemes for t in lengths)
    failed = [r for r in rows if "failed" in r]
    assert not failed, failed
    for s in schemes:
        assert f"| {s} |" in tiny["_md"]
    raw = {(r["scheme"], r["T"]) for r in tiny["raw"] if r["impl"] == bench.POSENC}
    assert raw == {(s, t) for s in schemes for t in lengths}


def test_ratios_of_none_are_one(tiny):
    for r in tiny["summary"]:
        if r["scheme"] == "none":
            for key in ("step_ratio", "step_ratio_paired_median", "eval_ratio", "eval_ratio_paired_median"):
                assert r[key] == 1.0, (r["impl"], r["T"], key)
        else:
            assert r["step_ratio"] > 0 and r["eval_ratio"] > 0


def test_counted_flops_of_none_equal_the_palm_formula(tiny):
    """For ``none`` every matmul is one the PaLM formula counts (6N + 12 L T d
    per token, full T^2 attention, output layer), so the exact count, which goes
    through the CPU flash-attention formulas added in the benchmark, must equal it."""
    for r in tiny["summary"]:
        if r["impl"] == bench.POSENC and r["scheme"] == "none":
            assert r["flops_train"] == pytest.approx(r["flops_train_palm"], rel=1e-9)
            assert r["flops_eval"] == pytest.approx(r["flops_train_palm"] / 3, rel=1e-9)
    assert tiny["peak"]["flops_per_s"] > 0


def test_flops_of_every_scheme_are_counted(tiny):
    for r in tiny["summary"]:
        assert r["flops_train"] >= r["flops_eval"] > 0, (r["impl"], r["scheme"])
        assert 0 < r["train_peak_fraction"]


def test_xtransformers_part(tiny):
    rows = [r for r in tiny["summary"] if r["impl"] == bench.XT]
    if bench.xtransformers_version() is None:
        assert not rows and any("x-transformers is not installed" in n for n in tiny["notes"])
        return
    shared = [s for s in bench.discover_schemes() if s in bench.XT_SHARED]
    assert sorted((r["scheme"], r["T"]) for r in rows) == sorted((s, t) for s in shared for t in (32, 64))
    for r in tiny["summary"]:
        if r["impl"] == bench.POSENC and r["scheme"] in shared:
            assert r["xt_step_ratio"] > 0


def test_memory_probes_and_ratio(tmp_path):
    res = run_tiny(tmp_path, "--schemes", "none", "alibi", "--no-xtransformers")
    rows = res["summary"]
    assert sorted((r["scheme"], r["T"]) for r in rows) == [("alibi", 32), ("alibi", 64), ("none", 32), ("none", 64)]
    assert {m["method"] for m in res["memory"]} <= {
        "VmHWM after clear_refs",
        "ru_maxrss (not reset; includes the T=1 warm-up)",
    }
    for r in rows:
        assert r["mem_train_bytes"] > 0
        if r["scheme"] == "none":
            assert r["mem_ratio"] == 1.0
    assert any(r.get("t2_floats_per_pair") is not None for r in rows)


def test_rerender_from_json(tiny, tmp_path):
    src = tmp_path / "in" / "bench.json"
    src.parent.mkdir()
    src.write_text(json.dumps({k: v for k, v in tiny.items() if k != "_md"}))
    assert bench.main(["--from-json", str(src), "--out-dir", str(tmp_path / "out")]) == 0
    again = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert again["summary"] == tiny["summary"]
    assert (tmp_path / "out" / "bench.md").read_text() == tiny["_md"]


def test_unknown_scheme_is_refused():
    with pytest.raises(SystemExit, match="unknown scheme"):
        bench.main(["--tiny", "--schemes", "nope"])


def test_quadratic_fit_is_exact():
    f = bench._quadratic([(16, 3 * 16**2 + 5 * 16 + 7), (32, 3 * 32**2 + 5 * 32 + 7), (48, 3 * 48**2 + 5 * 48 + 7)])
    assert f(4096) == pytest.approx(3 * 4096**2 + 5 * 4096 + 7, rel=1e-12)
