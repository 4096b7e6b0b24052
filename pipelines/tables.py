"""The study's tables: extrapolation and masked LM with their seed spread, each scheme
against the reference params.yaml names, and where the study's time went.

    python -m pipelines.tables results/runs/*.json --extrapolation results/extrapolation/*.csv \
        --params params.yaml --lm-reference alibi --lm-margin 0.05 \
        --question fixed_bidirectional --against none sinusoidal learned shaw transformer_xl \
        --mlm-reference none --mlm-margin 0.02 --out-dir results --md-dir figures

Reads what ``pipelines.study`` writes (one ``results/runs/<scheme>.json`` per
scheme, one extrapolation file per scheme). With ``--params``, only the study's
schemes are read, and a study scheme without its files is reported and left
out. Results made with other shared code or settings than the rest
(``provenance``, see ``pipelines.gather.check_provenance``) stop the stage
before anything is written. It writes, each as JSON and Markdown (for the
README):

* ``lm_table``: perplexity at every evaluation length and the ratio ppl(kL) / ppl(L) at
  every multiple, per seed and as mean ± sample sd; each scheme's ratio and perplexity
  against ``--lm-reference``'s at every length, each a family (``tests``: Welch on the log
  scale, equivalence within the factor 1 ± ``--lm-margin``, Holm over the schemes), each
  context-extension row (``rope+pi``) against its own scheme's plain row, paired by seed
  (``rule``), and each scheme's place by its perplexity at the longest length
  (``analysis.lm``);
* ``lm_pairs``: the pairs ``lm_table.pairs`` of ``--params`` names, each group a family per
  quantity and length;
* ``mlm_table``: masked-token accuracy and perplexity, mean ± sd and n, each scheme's
  accuracy against ``--mlm-reference`` as one family (``vs_reference``), and the
  question scheme against each scheme of ``--against`` as another (``tests``);
* ``metrics/<scheme>.json``: the headline numbers of a scheme (``headline``), the
  pipeline's only metrics, so ``dvc metrics show`` prints one short row per scheme;
* ``timing.json``: per study stage (and in total) the seconds of its runs per task
  (training plus evaluation, summed over the processes: core-seconds), its wall time, start-up, training and
  evaluation seconds (worker-seconds: with 2 workers, twice the wall time at most).

The statistics (tests, families, words) are ``analysis.stats``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from posenc.files import write_json, write_text

from analysis.lm import at_length, compare_lm, compare_pairs, lm_markdown, lm_table, parse_pairs
from analysis.stats import against as tested_against
from analysis.stats import compare, comparison_cells, family, mean_sd

from .gather import check_provenance, per_scheme, study_schemes

TEST_HEAD = ["p", "Holm p", "verdict"]


# ------------------------------------------------------------------ masked LM
def mlm_runs(run_files: list[str | Path]) -> dict[str, list[dict]]:
    """{scheme: its runs} of the masked LM (``posenc.tasks.MaskedLM``); {} for a study without it."""
    from posenc.tasks import MaskedLM, load

    runs = defaultdict(list)
    for f in run_files:
        for r in json.loads(Path(f).read_text())["runs"]:
            if isinstance(load(r["task"]), MaskedLM):
                runs[r["scheme"]].append(r)
    return runs


def mlm_split(settings: dict) -> str:
    """The split the study's masked-LM entry (``tasks:``, a ``MaskedLM`` task) scores on."""
    from posenc.taskbase import split_of
    from posenc.tasks import MaskedLM, load

    specs = [spec for name, spec in (settings.get("tasks") or {}).items() if isinstance(load(name), MaskedLM)]
    return split_of((specs[0] if specs else {}).get("evaluate") or {})


def mlm_table(runs: dict[str, list[dict]], question: str, against: list[str], reference: str = "none",
              margin: float | None = None, split: str = "validation") -> dict:
    """Per scheme its seeds, steps and the accuracy and perplexity over its masked bytes of
    ``split`` (the metrics each run recorded there at the end of training: ``val/`` or ``test/``);
    every scheme's accuracy against ``reference``'s, one family (``vs_reference`` in each
    entry), and the question's against each scheme of ``against``, another (``tests``),
    in points with the equivalence margin ``margin`` (``analysis.stats``)."""
    summary, prefix = {}, "test" if split == "test" else "val"
    for scheme, rs in runs.items():
        acc, ppl = [r[f"{prefix}/acc"] for r in rs], [r[f"{prefix}/ppl"] for r in rs]
        (am, asd), (pm, psd) = mean_sd(acc), mean_sd(ppl)
        summary[scheme] = {"seeds": sorted(r["seed"] for r in rs), "n": len(rs), "steps": rs[0].get("global_step"),
                           "acc_mean": am, "acc_sd": asd, "ppl_mean": pm, "ppl_sd": psd, "acc": acc, "ppl": ppl}
    acc = {s: e["acc"] for s, e in summary.items()}
    for scheme, t in tested_against(acc, reference, "points", margin).items():
        summary[scheme]["vs_reference"] = t
    tests, note = {}, None
    if not summary:
        note = "this study has no masked-LM runs"
    elif question not in summary:
        note = (f"`{question}` has no masked-LM runs (causal only, or not in the study): the question cannot be "
                "asked of this table; put a scheme that allows bidirectional attention in mlm_table.question")
    else:
        asked = {o: compare(acc[question], acc[o], "points", margin) | {"against": o}
                 for o in dict.fromkeys(against) if o in acc and o != question}
        tests = family(asked)
    return {"metric": f"masked-token accuracy on the {split} split", "split": split, "reference": reference, "margin": margin,
            "question": question, "tests": tests, "note": note, "summary": summary}


def mlm_markdown(t: dict) -> str:
    if not t["summary"]:
        return f"{t['note'][0].upper()}{t['note'][1:]}.\n"
    ref = t["reference"]
    lines = [f"| scheme | accuracy | masked-token perplexity | seeds | accuracy − `{ref}`'s (95% CI) | "
             f"{' | '.join(TEST_HEAD)} |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for s, e in sorted(t["summary"].items(), key=lambda kv: -kv[1]["acc_mean"]):
        lines.append(f"| `{s}` | {100 * e['acc_mean']:.1f}% ± {100 * e['acc_sd']:.1f} | {e['ppl_mean']:.2f} ± "
                     f"{e['ppl_sd']:.2f} | {e['n']} | " + " | ".join(comparison_cells(e.get("vs_reference"))) + " |")
    q = t["question"]
    if t.get("note"):
        lines += ["", f"Does `{q}` help? {t['note']}."]
    if t["tests"]:
        lines += ["", f"Does `{q}` help? Its accuracy against each scheme params.yaml names (a family of its own):",
                  "", f"| against | difference (95% CI) | t | df | {' | '.join(TEST_HEAD)} |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for other, w in t["tests"].items():
            diff, *rest = comparison_cells(w)
            tt = "—" if w["t"] is None else f"{w['t']:+.2f}"
            df = "—" if w["df"] is None else f"{w['df']:.1f}"
            lines.append(f"| `{other}` | {diff} | {tt} | {df} | {' | '.join(rest)} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ every task at L
def tasks_table(run_files: list[str | Path], names: list[str]) -> dict:
    """Per task of ``names`` (the study's, in its params' order), per scheme in the order of
    ``run_files``: the metrics its validation logs (``Task.validated``), mean ± sd over its seeds,
    and the steps trained (mean). A task is asked what it logs, never named."""
    from posenc.tasks import load

    runs: dict[str, dict[str, list[dict]]] = {n: defaultdict(list) for n in names}
    for f in run_files:
        for r in json.loads(Path(f).read_text())["runs"]:
            if r["task"] in runs:
                runs[r["task"]][r["scheme"]].append(r)
    out = {}
    for name in names:
        task = load(name)
        schemes = {}
        for scheme, rs in runs[name].items():
            cells = {m: dict(zip(("mean", "sd"), mean_sd([r[m] for r in rs]))) for m in task.validated()
                     if all(m in r for r in rs)}
            steps = [r["global_step"] for r in rs if "global_step" in r]
            schemes[scheme] = {"seeds": sorted(r["seed"] for r in rs), "steps": mean_sd(steps)[0] if steps else None,
                               "metrics": cells}
        out[name] = {"title": task.title(), "class": f"{type(task).__module__}.{type(task).__qualname__}",
                     "metrics": task.validated(), "schemes": schemes}
    return out


def tasks_markdown(t: dict) -> str:
    """One table per task: its validation metrics by scheme (shares in %), mean ± sd, or the
    value alone for one seed (no spread to give)."""

    def cell(c: dict | None, share: bool, n: int) -> str:
        k, digits = (100, 1) if share else (1, 3)
        if c is None:
            return "—"
        return f"{k * c['mean']:.{digits}f}" + (f" ± {k * c['sd']:.{digits}f}" if n > 1 else "")

    parts = []
    for name, e in t.items():
        share = {m: m.endswith(("acc", "exact")) for m in e["metrics"]}
        head = " | ".join(f"{m}{' (%)' if share[m] else ''}" for m in e["metrics"])
        title = f", {e['title']}" if e["title"] != name else ""
        lines = [f"**`{name}`**{title} (`{e['class']}`): validation at the end of training, mean ± sd over seeds "
                 "(one seed: its value)", "", f"| scheme | {head} | steps | seeds |", "| --- |" + " ---: |" * (len(e["metrics"]) + 2)]
        for scheme, row in e["schemes"].items():
            cells = " | ".join(cell(row["metrics"].get(m), share[m], len(row["seeds"])) for m in e["metrics"])
            steps = "—" if row["steps"] is None else f"{row['steps']:.0f}"
            lines.append(f"| `{scheme}` | {cells} | {steps} | {len(row['seeds'])} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# ------------------------------------------------------------------ timing
def timing(run_files: list[str | Path]) -> dict:
    stages = {}
    for f in run_files:
        d = json.loads(Path(f).read_text())
        tasks: dict[str, float] = defaultdict(float)
        for r in d["runs"]:
            tasks[r["task"]] += r.get("train_s", 0.0) + r.get("eval_s", 0.0)
        stages[d["scheme"]] = d["timing"] | {"runs": len(d["runs"]),
                                             "task_s": {t: round(v, 2) for t, v in sorted(tasks.items())}}
    keys = ("wall_s", "startup_s", "train_s", "eval_s")
    task_s: dict[str, float] = defaultdict(float)
    for s in stages.values():
        for t, v in s["task_s"].items():
            task_s[t] += v
    return {"stages": stages, "total": {k: round(sum(s[k] for s in stages.values()), 1) for k in keys}
            | {"runs": sum(s["runs"] for s in stages.values()),
               "task_s": {t: round(v, 1) for t, v in sorted(task_s.items())}}}


def headline(lm: dict, mlm: dict) -> dict:
    """Per scheme, the numbers ``dvc metrics show`` prints (seed means): ppl at L and at
    the longest length (``ppl_16L`` for 16 x L), their ratio, and masked-LM accuracy."""
    out = {}
    for scheme, e in lm.items():
        L, r = e["train_len"], e["ratio_longest"]
        longest = at_length(e, r["longest"]).get("mean")
        out[scheme] = {"ppl_L": at_length(e, L).get("mean"), f"ppl_{r['longest'] // L}L": longest, "ratio": r["mean"]}
    for scheme, e in mlm["summary"].items():
        out.setdefault(scheme, {})["mlm_acc"] = e["acc_mean"]
    return {s: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()} for s, row in out.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pipelines.tables", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="results/runs/<scheme>.json files of pipelines.study")
    p.add_argument("--extrapolation", nargs="+", required=True, help="extrapolation results files (<scheme>.csv)")
    p.add_argument("--params", help="the study's params file: read its schemes only, report missing ones")
    p.add_argument("--lm-reference", default="alibi",
                   help="the scheme every other scheme's ppl(longest)/ppl(L) is compared with")
    p.add_argument("--lm-margin", type=float, default=0.05,
                   help="two ratios are equivalent when they differ by a factor within 1 ± this")
    p.add_argument("--question", default="fixed_bidirectional", help="masked LM: the scheme whose help is tested")
    p.add_argument("--against", nargs="*", default=["none", "sinusoidal", "learned", "shaw", "transformer_xl"],
                   help="masked LM: the schemes the question is tested against")
    p.add_argument("--mlm-reference", default="none", help="masked LM: the scheme every other is compared with")
    p.add_argument("--mlm-margin", type=float, default=0.02,
                   help="masked LM: two accuracies are equivalent when they differ by less than this")
    p.add_argument("--out-dir", default="results")
    p.add_argument("--md-dir", default="figures")
    a = p.parse_args(argv)
    out, md = Path(a.out_dir), Path(a.md_dir)
    schemes = study_schemes(a.params) if a.params else None
    runs = per_scheme(a.runs, schemes, "runs")
    check_provenance(runs)
    extrapolation = per_scheme(a.extrapolation, schemes, "extrapolation results")
    lm = compare_lm(lm_table(list(extrapolation.values())), a.lm_reference, a.lm_margin)
    if a.lm_reference not in lm:
        print(f"note: --lm-reference {a.lm_reference} has no extrapolation results: no comparison column",
              file=sys.stderr)
    settings = (yaml.safe_load(Path(a.params).read_text()) or {}) if a.params else {}
    pairs = compare_pairs(lm, parse_pairs((settings.get("lm_table") or {}).get("pairs")), a.lm_margin)
    write_json(out / "lm_table.json", lm)
    write_json(out / "lm_pairs.json", pairs)
    write_text(md / "lm_table.md", lm_markdown(lm, a.lm_reference, pairs))
    mlm = mlm_table(mlm_runs(list(runs.values())), a.question, a.against, a.mlm_reference, a.mlm_margin,
                    mlm_split(settings))
    if mlm["note"]:
        print(f"note: --question {mlm['note']}", file=sys.stderr)
    write_json(out / "mlm_table.json", mlm)
    write_text(md / "mlm_table.md", mlm_markdown(mlm))
    names = list(settings.get("tasks") or {})
    names = names or list(dict.fromkeys(r["task"] for f in runs.values() for r in json.loads(Path(f).read_text())["runs"]))
    tasks = tasks_table(list(runs.values()), names)
    write_json(out / "tasks_table.json", tasks)
    write_text(md / "tasks_table.md", tasks_markdown(tasks))
    write_json(out / "timing.json", timing(list(runs.values())))
    for scheme, row in headline(lm, mlm).items():  # one file per scheme: one row each in `dvc metrics show`
        write_json(out / "metrics" / f"{scheme}.json", row)
    print(lm_markdown(lm, a.lm_reference, pairs))
    print(mlm_markdown(mlm))


if __name__ == "__main__":
    main()
