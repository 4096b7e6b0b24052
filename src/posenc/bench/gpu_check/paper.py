"""The paper profile in the GPU check: its training jobs, and what its study would take on GPUs
from the step times the check measures (part 5)."""

from __future__ import annotations

import argparse

from ...files import project_root

#: the study the estimate is of
PAPER_PARAMS = project_root() / "profiles" / "paper" / "params.yaml"


def study_tasks(params: dict) -> dict:
    """The ``tasks:`` entries of a study's params, also from the params a run recorded before
    tasks had one shape (``lm``, ``mlm``, ``retrieval`` keys of their own, top-level ``seeds``)."""
    if "tasks" in params:
        return params["tasks"]
    lm, mlm, ret = params["lm"], params["mlm"], params["retrieval"]
    return {"lm": {"seeds": params["seeds"], "steps": lm["steps"], "seq_len": lm["train_len"], "batch_size": lm["batch_size"]},
            "mlm": {"seeds": mlm.get("seeds", params["seeds"]), "steps": mlm["steps"], "seq_len": mlm["seq_len"],
                    "batch_size": mlm["batch_size"]},
            "retrieval": {"seeds": ret["seeds"], "steps": ret["cap"], "seq_len": lm["train_len"],
                          "batch_size": ret["batch_size"]}}  # fmt: skip


def paper_jobs(params: dict) -> list[dict]:
    """Every training run of a study's params.yaml: scheme, task, seeds, steps, length and batch (tokens a step).
    Retrieval runs count at their cap (they stop earlier, at the criterion)."""
    kinds = {
        name: (len(str(t["seeds"]).split()), t["steps"], t["seq_len"], t["batch_size"])
        for name, t in study_tasks(params).items()
    }  # fmt: skip
    return [{"scheme": scheme, "task": task, "runs": kinds[task][0], "steps": kinds[task][1], "T": kinds[task][2],
             "batch": kinds[task][3]}
            for scheme, item in params["schemes"].items() for task in item["tasks"].split()]  # fmt: skip


def makespan(durations: list[float], n: int) -> float:
    """Seconds until the last of ``durations`` ends with ``n`` workers, each job to the first free
    worker, the longest first (as a stage's pool takes its jobs when a device frees)."""
    free = [0.0] * min(n, len(durations) or 1)
    for d in sorted(durations, reverse=True):
        free[free.index(min(free))] += d
    return max(free)


def paper_estimate(bench: dict, params: dict, gpus: tuple[int, ...] = (1, 8, 9, 32)) -> dict:
    """GPU-hours of the study's training steps from the measured step times: a run's step at the
    benchmark's T, scaled by the run's tokens per step over the benchmark's (the step's cost is
    close to linear in the batch at a fixed T; evaluation, validation and the retrieval grids are
    not counted). Per task and in all, and the wall time on N GPUs as ``dvc repro`` runs the
    study (``wall_h``): one scheme's stage at a time, its runs (a run per seed and task) spread
    over the GPUs, one per GPU, so a stage lasts at least its longest run and uses at most as
    many GPUs as it has runs; and as the fan-out runs it (``fanout_h``, ``pipelines.fanout``):
    every run of every stage on the GPUs at once, the longest first, so the study lasts at
    least its longest run."""
    step = {(r["scheme"], r["T"]): (r["train_s_min"], r["batch"]) for r in bench["rows"]}
    hours: dict[str, float] = {}
    stages: dict[str, list[float]] = {}
    missing = []
    for j in paper_jobs(params):
        if (j["scheme"], j["T"]) not in step:
            missing.append(f"{j['scheme']} at T = {j['T']}")
            continue
        s, b = step[j["scheme"], j["T"]]
        run_s = j["steps"] * s * j["batch"] / b
        hours[j["task"]] = hours.get(j["task"], 0.0) + j["runs"] * run_s / 3600
        stages.setdefault(j["scheme"], []).extend([run_s] * j["runs"])
    runs = max((len(d) for d in stages.values()), default=0)
    return {"hours": hours, "total_h": sum(hours.values()), "missing": missing, "runs_per_stage": runs,
            "longest_h": max((max(d) for d in stages.values()), default=0.0) / 3600,
            "wall_h": {n: sum(makespan(d, n) for d in stages.values()) / 3600 for n in gpus},
            "fanout_h": {n: makespan([x for d in stages.values() for x in d], n) / 3600 for n in gpus}}


def paper_bench_settings(a: argparse.Namespace) -> tuple[dict, dict]:
    """The paper profile's params, and ``run_bench``'s model, lengths and extra arguments for its
    model at its lengths, vocabulary and tokens per step (on the CPU smoke test: the small
    model, without memory probes)."""
    import yaml

    params = yaml.safe_load(PAPER_PARAMS.read_text())
    lengths = sorted({j["T"] for j in paper_jobs(params)})
    if a.device != "cuda":
        return params, {"model": None, "lengths": lengths, "extra": ("--no-memory",)}
    lm = study_tasks(params)["lm"]
    extra = ("--vocab-size", str(params["vocab_size"]), "--no-memory",
             "--tokens-per-batch", str(lm["seq_len"] * lm["batch_size"]))
    return params, {"model": params["model"], "lengths": lengths, "extra": extra}
