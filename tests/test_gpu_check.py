"""The GPU check (posenc.gpu_check): its script end to end on the CPU, its arithmetic, the
committed report, and the mixed-precision training route whose failure the first GPU run found."""

from __future__ import annotations

import json
import math
import pytest
import torch

from posenc.bench import gpu_check
from posenc.files import project_root

DOCS = project_root() / "docs"


@pytest.mark.slow
def test_the_script_runs_end_to_end_on_the_cpu(tmp_path, data_root, cache_dir, monkeypatch, capsys):
    """``--device cpu``: every part of the check runs (its estimate printed first, the step on
    every route, the benchmark, the long evaluation, training, numerics, evaluation at 4L; not
    NoPE compiled, which Inductor would build for the CPU for minutes) and the report names each
    scheme with its checks passed and the routes it took."""
    monkeypatch.setenv("POSENC_DATA_DIR", str(data_root))
    out = tmp_path / "gpu.md"
    rc = gpu_check.main(["--device", "cpu", "--model", "micro", "--seq-len", "32", "--steps", "12", "--batch-size", "8",
                         "--schemes", "none", "alibi", "shaw", "--bench-lengths", "32", "--bench-repeats", "1",
                         "--long-tokens", "96", "--no-compiled", "--cache-dir", str(cache_dir),
                         "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.startswith("estimated time on one H200: ")
    assert printed.index("estimated time") < printed.index("[1/3] none")
    text = out.with_suffix(".json").read_text()
    res = json.loads(text)
    assert rc == 0, res["failures"]
    assert str(tmp_path) not in text and str(cache_dir) not in text  # no path of this machine in the record
    assert res["settings"]["out"] == "gpu.md" and "<tmp>/bench" in res["bench"]["command"]
    assert [r["scheme"] for r in res["schemes"]] == ["none", "alibi", "shaw"]
    for r in res["schemes"]:
        assert r["steps"] == 12 and abs(r["first_loss"] - math.log(260)) < 0.1 * math.log(260)
        assert r["last_loss"] < r["first_loss"] and r["bf16"] < gpu_check.BF16_TOL and r["fp32"] < gpu_check.FP32_TOL
        assert math.isfinite(r["ppl_4L"])
    assert {r["scheme"]: (r["route"], r["eval_route"]) for r in res["schemes"]} == {
        "none": ("fused", "fused"), "alibi": ("masked", "masked"), "shaw": ("recomputed", "recomputed")}
    steps = {(r["scheme"], r["T"], r["route"]): r for r in res["steps"]["rows"]}
    assert set(steps) == {(s, T, route) for T in (256, 1000) for s, routes in (
        ("none", ("fused", "probabilities")), ("alibi", ("recomputed", "probabilities", "masked")),
        ("shaw", ("recomputed", "probabilities"))) for route in routes}  # on the CPU: no flex step (no backward)
    assert all(r["ok"] and not r["missing"] for r in steps.values()), [r for r in steps.values() if not r["ok"]]
    assert {r["T"] for r in res["bench"]["rows"]} == {32}
    assert [(r["scheme"], r["tokens"], r["finite"], r["route"]) for r in res["long"]["rows"]] == [
        ("none", 96, True, "fused"), ("alibi", 96, True, "masked"), ("shaw", 96, True, "recomputed")]
    text = out.read_text()
    assert "## Long evaluation" in text and "## One training step on every route" in text
    assert "a smoke test of the script, not a GPU check" in text
    assert "| alibi |" in text and "**no**" not in text


def test_a_broken_part_is_reported_and_fails_the_check(tmp_path, data_root, cache_dir, monkeypatch):
    """A scheme whose run raises is written into the report with its error; the exit status is 1."""
    monkeypatch.setenv("POSENC_DATA_DIR", str(data_root))
    real = gpu_check.check_scheme

    def broken(scheme, a, work):
        if scheme == "alibi":
            raise RuntimeError("planted failure")
        return real(scheme, a, work)

    monkeypatch.setattr(gpu_check, "check_scheme", broken)
    out = tmp_path / "gpu.md"
    rc = gpu_check.main(["--device", "cpu", "--model", "micro", "--seq-len", "32", "--steps", "4", "--batch-size", "4",
                         "--schemes", "none", "alibi", "--bench-lengths", "--long-tokens", "0", "--no-route-steps",
                         "--cache-dir", str(cache_dir), "--out", str(out)])  # fmt: skip
    assert rc == 1
    assert "alibi: RuntimeError: planted failure" in out.read_text()


def test_mixed_precision_with_gradient_clipping_trains(make_cfg):
    """bf16-mixed with the default gradient clipping: Lightning refuses to clip for an optimizer that
    unscales its gradients itself (the fused AdamW), which stopped every scheme of the first GPU
    check; the module then takes the loop over parameters. On the CPU here, as on CUDA."""
    from posenc.train import train

    cfg = make_cfg("model=micro", "trainer.precision=bf16-mixed", "trainer.max_steps=3", "trainer.val_check_interval=3",
                   "trainer.limit_val_batches=1", "~logger")  # fmt: skip
    assert cfg.trainer.gradient_clip_val and cfg.optim.fused
    metrics = train(cfg)
    assert math.isfinite(float(metrics["val/loss"]))


def test_paper_estimate_against_a_hand_count():
    """GPU-hours from step times: runs x steps x step seconds x (tokens per step / the benchmark's)."""
    params = {"tasks": {"lm": {"seeds": "0 1", "steps": 100, "seq_len": 8, "batch_size": 4},
                        "mlm": {"seeds": "0 1", "steps": 50, "seq_len": 4, "batch_size": 2},
                        "retrieval": {"seeds": "0", "steps": 200, "seq_len": 8, "batch_size": 4}},
              "schemes": {"a": {"tasks": "lm mlm"}, "b": {"tasks": "lm retrieval"}}}  # fmt: skip
    bench = {"rows": [{"scheme": "a", "T": 8, "batch": 4, "train_s_min": 36.0},
                      {"scheme": "a", "T": 4, "batch": 8, "train_s_min": 72.0},
                      {"scheme": "b", "T": 8, "batch": 4, "train_s_min": 18.0}]}  # fmt: skip
    e = gpu_check.paper_estimate(bench, params)
    lm = (2 * 100 * 36.0 + 2 * 100 * 18.0) / 3600  # 2 seeds of each scheme
    mlm = 2 * 50 * 72.0 * (2 / 8) / 3600  # batch 2 against the benchmark's 8 at T = 4
    retrieval = 1 * 200 * 18.0 / 3600
    assert e["hours"] == pytest.approx({"lm": lm, "mlm": mlm, "retrieval": retrieval})
    assert e["total_h"] == pytest.approx(lm + mlm + retrieval)
    assert e["longest_h"] == pytest.approx(max(100 * 36.0, 200 * 18.0) / 3600)  # a causal-LM run, b retrieval run
    assert e["wall_h"][1] == pytest.approx(e["total_h"])
    # one stage at a time: a's 2 LM runs of 1 h and 2 MLM runs of 0.25 h, then b's retrieval run of 1 h and
    # 2 LM runs of 0.5 h; with 2 GPUs a takes 1.25 h (1 + 0.25 on each) and b 1 h (1; 0.5 + 0.5)
    assert e["wall_h"][32] == pytest.approx(2.0) and e["runs_per_stage"] == 4
    assert gpu_check.paper_estimate(bench, params, gpus=(2,))["wall_h"][2] == pytest.approx(2.25)
    # every run at once (the fan-out): runs of 1, 1, 1, 0.5, 0.5, 0.25 and 0.25 h, the longest first to the
    # first free GPU; on 2 GPUs they end at 2.25 h on both (1 + 1 + 0.25 and 1 + 0.5 + 0.5 + 0.25); on 32,
    # with the longest run, at 1 h, where one stage at a time took 2 h
    e2 = gpu_check.paper_estimate(bench, params, gpus=(2, 32))
    assert e2["fanout_h"] == pytest.approx({2: 2.25, 32: 1.0})
    assert e["missing"] == []


def test_the_committed_report_is_the_committed_run_rendered(tmp_path):
    """docs/gpu.md is what ``--from-json docs/gpu.json`` writes: no figure in it is typed by hand."""
    out = tmp_path / "gpu.md"
    assert gpu_check.main(["--from-json", str(DOCS / "gpu.json"), "--out", str(out)]) == 0
    assert out.read_text() == (DOCS / "gpu.md").read_text()
    res = json.loads((DOCS / "gpu.json").read_text())
    assert res["environment"]["device"] == "cuda" and res["environment"]["gpu"]
    assert not any(str(v).startswith("/") for v in res["settings"].values())  # paths of the project, or names
    assert not res["failures"]


@pytest.mark.parametrize("argv,message", [
    (["--steps", "1"], "--steps and --seq-len must be at least 2"),
    (["--device", "cuda"], "no CUDA GPU is visible"),
])  # fmt: skip
def test_bad_settings_are_refused(argv, message, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        gpu_check.parse_args(argv + (["--device", "cpu"] if "--device" not in argv else []))
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_makespan_takes_the_longest_first_to_the_first_free_worker():
    assert gpu_check.makespan([2, 3, 2, 3, 2], 2) == 7  # 3+2+2 on one, 3+2 on the other
    assert gpu_check.makespan([2, 3], 8) == 3 and gpu_check.makespan([2, 3], 1) == 5


def test_the_estimate_counts_every_run_of_the_paper_profile():
    """The estimate reads profiles/paper/params.yaml: 15 schemes x their tasks (xPos is causal only) = 44 jobs."""
    import yaml

    jobs = gpu_check.paper_jobs(yaml.safe_load(gpu_check.PAPER_PARAMS.read_text()))
    assert len(jobs) == 44 and {j["T"] for j in jobs} == {128, 512}
    assert {j["task"] for j in jobs if j["scheme"] == "xpos"} == {"lm", "retrieval"}


def test_the_routes_and_the_compiled_step_are_timed_side_by_side(tmp_path, monkeypatch):
    """The schemes whose step took the flex route are benchmarked a second time with
    ``--attention-route masked`` (with ``none``, in the same check), and NoPE a second time
    compiled; the report sets each pair side by side. The paper profile only when asked."""
    monkeypatch.setenv("POSENC_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(gpu_check, "check_scheme", lambda s, a, work: {
        "scheme": s, "route": "flex" if s == "alibi" else "fused", "train_s": 1.0, "first_loss": 5.5,
        "last_loss": 5.0, "val_loss": 5.0, "loss_ok": True, "bf16": 1e-3, "fp32": 1e-6, "numerics_ok": True,
        "ppl_L": 9.0, "ppl_4L": 9.5, "eval_s": 1.0})
    monkeypatch.setattr(gpu_check, "route_steps", lambda a, schemes: {
        "lengths": [256], "tokens": 4096, "model": "small", "graphs": 2, "rows": [
            {"scheme": s, "T": 256, "route": route, "loss": 5.5, "loss_diff": 0.0, "grad_diff": 0.0, "grad_diff_at": None,
             "missing": [], "nonfinite": [], "graphs": 0, "ok": True}
            for s, routes in (("none", ("fused",)), ("alibi", ("flex", "masked"))) for route in routes]})
    calls = []

    def bench(a, work, timeout, name="bench", model=None, lengths=None, extra=(), env=None):
        calls.append((name, extra, env))
        ratio = {"bench": 1.05, "bench-masked": 1.8, "paper": 1.1, "compiled": 1.0}[name]
        step = 0.05 if name == "compiled" else 0.1
        rows = [{"scheme": s, "T": T, "batch": 1, "train_tok_s": 1e3, "step_ratio": 1.0 if s == "none" else ratio,
                 "mem_ratio": 1.0, "flop_share": 1.0, "train_s_min": step, "train_peak_fraction": 0.1 / step / 40}
                for T in lengths or [64] for s in ("none", "alibi")]
        return {"seconds": 1.0, "rows": rows, "command": "-m posenc.bench", "peak_flops_per_s": 1e12, "model": "micro"}

    monkeypatch.setattr(gpu_check, "run_bench", bench)
    out = tmp_path / "gpu.md"
    rc = gpu_check.main(["--device", "cpu", "--schemes", "none", "alibi", "--bench-lengths", "64",
                         "--long-tokens", "0", "--paper-bench", "--out", str(out)])
    assert rc == 0
    assert [c[0] for c in calls] == ["bench", "bench-masked", "compiled", "paper"]
    assert calls[1] == ("bench-masked", ("--schemes", "none", "alibi", "--attention-route", "masked"), None)
    assert calls[2][1][-3:] == ("--schemes", "none", "--compile")
    text = out.read_text()
    assert "## The flex route against the float-mask route" in text
    assert "| alibi | 64 | 1.05 | 1.80 | 1.00 | 1.00 |" in text
    assert "| 64 | 100.0 | 50.0 | 0.50 | 2.5% | 5.0% |" in text  # NoPE compiled against eager
    assert "| alibi | 256 | flex | 5.5000 |" in text


@pytest.mark.slow
def test_the_check_fits_in_eight_minutes_by_its_own_estimate(monkeypatch):
    """With its defaults and every scheme, the check's estimate (``estimate``: measured costs of
    the H200 run of 2026-11-26, assumed ones for compilation, both named in it) is within
    ``BUDGET_S``, 480 s; without the route part and the benchmark it is smaller."""
    from posenc.bench.config import discover_schemes

    monkeypatch.setenv("POSENC_DATA_DIR", "data")
    a = gpu_check.parse_args(["--device", "cpu"])
    e = gpu_check.estimate(a, discover_schemes())
    assert set(e["parts"]) == {"steps", "bench", "bench, float-mask routes", "compiled", "long evaluation", "training"}
    assert e["total_s"] == pytest.approx(sum(e["parts"].values()), abs=0.5) and e["total_s"] <= gpu_check.BUDGET_S
    assert set(e["kinds"]["trains"]) == {"alibi", "t5_bias", "t5_bias_scaled", "kerple", "tupe", "fixed_bidirectional"}
    assert e["kinds"]["evaluates"] == ["fire"] and set(e["kinds"]["rotates"]) == {"rope", "xpos"}
    a.route_steps, a.bench_lengths = False, []
    assert gpu_check.estimate(a, discover_schemes())["total_s"] < e["total_s"]


def test_the_routes_of_a_scheme_agree_on_its_step(monkeypatch):
    """The step on every route (part 1) on the CPU for FIRE, whose last MLP bias adds a constant
    to every logit of a row (softmax ignores it: its gradient is zero in exact arithmetic and
    rounding noise on each route, judged against the scale of all the gradients), and CAPE,
    which draws random shifts in training (every route's step from the same random state):
    every route agrees with the float-mask route, and every parameter has a gradient."""
    monkeypatch.setenv("POSENC_DATA_DIR", "data")
    a = gpu_check.parse_args(["--device", "cpu", "--model", "micro"])
    res = gpu_check.route_steps(a, ["fire", "cape"])
    rows = {(r["scheme"], r["T"], r["route"]): r for r in res["rows"]}
    assert set(rows) == {(s, T, route) for T in (256, 1000) for s, routes in (
        ("fire", ("recomputed", "probabilities", "masked")), ("cape", ("fused", "probabilities"))) for route in routes}
    assert all(r["ok"] and not r["missing"] and not r["nonfinite"] for r in rows.values()), rows


def test_a_gradient_zero_in_exact_arithmetic_is_judged_against_the_scale_of_all():
    """``gradient_errors``: a gradient whose own norm is rounding noise is compared with the
    norm it would have were all the gradients spread evenly; a real one with its own."""
    from posenc.attention.flex_gates import gradient_errors

    want = {"w": torch.ones(100), "b": torch.full((4,), 1e-9)}
    have = {"w": torch.ones(100) * 1.01, "b": torch.full((4,), -1e-9)}
    errors = gradient_errors(have, want)
    assert errors["w"] == pytest.approx(0.01)
    assert errors["b"] == pytest.approx(4e-9 / (10 * (4 / 104) ** 0.5), rel=1e-3)  # ||b - b'|| / (||all|| sqrt(4/104))
    have["b"] = torch.ones(4)
    assert gradient_errors(have, want)["b"] > 0.5
