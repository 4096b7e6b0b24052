"""The benchmark (``python -m posenc.bench``) in its tiny CI configuration.

No timing asserts (the machine is shared): that it runs, covers every scheme and
length, writes its files, and that every number derived from the measurements
is the one the measurements give: each ratio to ``none`` (and to x-transformers)
is recomputed here from the raw per-round times (best / best, and the median of
the per-round ratios, two rounds), each memory ratio from the probes' peaks; FLOP
counts are checked against the PaLM formula.

The x-transformers comparison is part of the test: without the package
(``pip install -e ".[bench]"``, which the ``dev`` extra includes) it fails.

The fast attention path is checked against the reference path for every
scheme in ``tests/test_attention.py`` (every route against the dense reference).
"""

from __future__ import annotations

import json
import statistics

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
    # two rounds, so that best / best and the median of per-round ratios are different numbers
    return run_tiny(tmp_path_factory.mktemp("tiny"), "--no-memory", "--repeats", "2")


def raw_times(res: dict) -> dict:
    """{(impl, scheme, T): {"train": {round: s}, "eval": {round: s}}} from the raw rows."""
    out: dict = {}
    for r in res["raw"]:
        t = out.setdefault((r["impl"], r["scheme"], r["T"]), {"train": {}, "eval": {}})
        assert r["round"] not in t["train"], r  # one measurement per round
        t["train"][r["round"]], t["eval"][r["round"]] = r["train_s"], r["eval_s"]
    return out


def expected_ratios(t: dict, base: dict) -> dict:
    """Ratios of the times ``t`` to the times ``base`` of the same length, computed here."""
    out = {}
    for mode in ("train", "eval"):
        rounds = sorted(base[mode])
        assert sorted(t[mode]) == rounds  # measured in the same rounds
        out[mode] = min(t[mode].values()) / min(base[mode].values())
        out[mode + "_paired"] = statistics.median(t[mode][r] / base[mode][r] for r in rounds)
    return out


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


def test_ratios_to_none_are_those_of_the_raw_times(tiny):
    """Each scheme's step and eval ratio is its time over none's at the same length:
    best over best, and the median over rounds of the ratio within one round."""
    times = raw_times(tiny)
    assert {len(t["train"]) for t in times.values()} == {2}
    rows = [r for r in tiny["summary"] if r["impl"] == bench.POSENC]
    assert sorted((r["scheme"], r["T"]) for r in rows) == sorted(k[1:] for k in times if k[0] == bench.POSENC)
    for r in rows:
        key = (r["impl"], r["scheme"], r["T"])
        t, base = times[key], times[(bench.POSENC, "none", r["T"])]
        want = expected_ratios(t, base)
        assert r["train_s_min"] == min(t["train"].values()) and r["eval_s_min"] == min(t["eval"].values()), key
        assert r["train_tok_s"] == pytest.approx(r["tokens"] / min(t["train"].values()), rel=1e-12), key
        assert r["step_ratio"] == pytest.approx(want["train"], rel=1e-12), key
        assert r["step_ratio_paired_median"] == pytest.approx(want["train_paired"], rel=1e-12), key
        assert r["eval_ratio"] == pytest.approx(want["eval"], rel=1e-12), key
        assert r["eval_ratio_paired_median"] == pytest.approx(want["eval_paired"], rel=1e-12), key
        if r["scheme"] == "none":
            assert (r["step_ratio"], r["step_ratio_paired_median"], r["eval_ratio"]) == (1.0, 1.0, 1.0), key


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
    """x-transformers runs the schemes it shares with posenc, and posenc's ratio to it is
    posenc's time over x-transformers' (best / best, median of per-round ratios)."""
    assert bench.xtransformers_version() is not None, (
        "x-transformers is not installed: the benchmark's comparison with it is untested; "
        'pip install -e ".[dev]" (or ".[bench]") installs it'
    )
    assert tiny["meta"]["x_transformers"] == bench.xtransformers_version()
    rows = [r for r in tiny["summary"] if r["impl"] == bench.XT]
    shared = [s for s in bench.discover_schemes() if s in bench.XT_SHARED]
    assert len(shared) >= 5, shared
    assert sorted((r["scheme"], r["T"]) for r in rows) == sorted((s, t) for s in shared for t in (32, 64))
    assert not [r for r in rows if "failed" in r]
    times = raw_times(tiny)
    for r in tiny["summary"]:
        if r["impl"] == bench.POSENC and r["scheme"] in shared:
            want = expected_ratios(times[(bench.POSENC, r["scheme"], r["T"])], times[(bench.XT, r["scheme"], r["T"])])
            assert r["xt_step_ratio"] == pytest.approx(want["train"], rel=1e-12), (r["scheme"], r["T"])
            assert r["xt_step_ratio_paired_median"] == pytest.approx(want["train_paired"], rel=1e-12)
            assert r["xt_eval_ratio"] == pytest.approx(want["eval"], rel=1e-12), (r["scheme"], r["T"])
        elif r["impl"] == bench.POSENC:
            assert "xt_step_ratio" not in r, r["scheme"]


def test_memory_probes_and_ratio(tmp_path):
    res = run_tiny(tmp_path, "--schemes", "none", "alibi", "--no-xtransformers")
    rows = res["summary"]
    assert sorted((r["scheme"], r["T"]) for r in rows) == [("alibi", 32), ("alibi", 64), ("none", 32), ("none", 64)]
    assert {m["method"] for m in res["memory"]} <= {
        "VmHWM after clear_refs",
        "ru_maxrss (not reset; includes the T=1 warm-up)",
    }
    peak = {(m["scheme"], m["T"]): m["train_peak"] for m in res["memory"]}
    assert set(peak) == {(r["scheme"], r["T"]) for r in rows}
    for r in rows:
        assert r["mem_train_bytes"] == peak[(r["scheme"], r["T"])] > 0
        assert r["mem_ratio"] == pytest.approx(peak[(r["scheme"], r["T"])] / peak[("none", r["T"])], rel=1e-12)
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
    f = bench.quadratic_fit([(16, 3 * 16**2 + 5 * 16 + 7), (32, 3 * 32**2 + 5 * 32 + 7), (48, 3 * 48**2 + 5 * 48 + 7)])
    assert f(4096) == pytest.approx(3 * 4096**2 + 5 * 4096 + 7, rel=1e-12)


def test_flop_share_efficiency_and_targets_are_the_counted_ones(tiny):
    """FLOP share is a scheme's counted training FLOPs over none's at the same length,
    counted at that length (the tiny lengths are below FLOP_DIRECT_MAX); step ÷ share is
    the step ratio over it; every scheme gets the efficiency target, ALiBi, T5 and KERPLE
    the step target, every scheme without a value term (not Shaw) the memory one (when
    memory is probed: not in this run)."""
    flops = {(f["impl"], f["scheme"], f["T"]): f for f in tiny["flops"]}
    rows = [r for r in tiny["summary"] if r["impl"] == bench.POSENC]
    for r in rows:
        f, f0 = flops[(bench.POSENC, r["scheme"], r["T"])], flops[(bench.POSENC, "none", r["T"])]
        assert dict(f["train_points"])[r["T"]] * r["batch"] == f["train"]  # counted at T itself
        assert r["flop_share"] == pytest.approx(f["train"] / f0["train"], rel=1e-12)
        assert r["flop_efficiency"] == pytest.approx(r["step_ratio"] / r["flop_share"], rel=1e-12)
    assert next(r for r in rows if r["scheme"] == "none")["flop_share"] == 1.0
    assert all(r["flop_share"] > 1 for r in rows if r["scheme"] in ("tupe", "fire", "transformer_xl"))
    T = max(r["T"] for r in rows)
    kinds = {(t["scheme"], t["what"]) for t in tiny["targets"] if t["T"] == T}
    schemes = {r["scheme"] for r in rows} - {"none"}
    assert {s for s, w in kinds if w == "efficiency"} == schemes
    assert {s for s, w in kinds if w == "step"} == {"alibi", "t5_bias", "kerple"}
    assert not any(w == "memory" for _, w in kinds)  # --no-memory
    for t in tiny["targets"]:
        if t["what"] == "efficiency":
            row = next(r for r in rows if r["scheme"] == t["scheme"] and r["T"] == t["T"])
            assert t["value"] == row["flop_efficiency"] and t["met"] == (t["value"] <= 1.15)
    assert "| FLOP share | step ÷ share |" in tiny["_md"]


def test_compiled_models_are_timed(tmp_path):
    """``--compile``: each model compiled in place after its FLOPs are counted and timed
    compiled (here with no warm-up, so the round pays the compilation); the settings say so."""
    from torch._dynamo.utils import counters

    counters.clear()
    res = run_tiny(tmp_path, "--no-memory", "--schemes", "none", "alibi", "--lengths", "32", "--compile")
    assert res["meta"]["settings"]["compile"] is True
    assert counters["stats"]["unique_graphs"] > 0
    assert {r["scheme"] for r in res["summary"] if r["impl"] == "posenc" and r["train_s_min"] > 0} == {"none", "alibi"}
