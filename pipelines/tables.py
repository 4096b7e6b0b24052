"""The study's tables: extrapolation and masked LM with their seed spread, each scheme
against a reference fixed in params.yaml before the data, and where the study's time went.

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

* ``lm_table``: perplexity at every evaluation length, mean ± sample sd over
  seeds, and the ratio ppl(16L) / ppl(L) taken per seed, then averaged; each
  scheme's ratios against ``--lm-reference``'s as one family (``vs_reference``:
  Welch on the log scale, equivalence within the factor 1 ± ``--lm-margin``, Holm over
  the table), and each context-extension row (``rope+pi``) against its own scheme's
  plain row, a family of its own (``vs_plain``);
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
import math
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from posenc.files import write_json, write_text

from analysis.stats import against as tested_against
from analysis.stats import compare, comparison_cells, family, mean_sd

from .gather import check_provenance, per_scheme, study_schemes


# ------------------------------------------------------------------ length extrapolation
def lm_table(paths: list[str | Path]) -> dict:
    """Per scheme: ppl mean/sd/n and the per-seed values (seed order) at every evaluation length,
    and the ratio ppl(longest) / ppl(L) per seed."""
    from posenc.evaluate import read_results

    df = read_results(paths)
    df = df[df["method"] == "nonoverlapping"]
    out = {}
    for scheme, sub in df.groupby("scheme"):
        train_len = int(sub["train_len"].iloc[0])
        lengths = {}
        for length, g in sub.groupby("eval_len"):
            vals = [float(v) for v in g.sort_values("seed")["ppl"] if math.isfinite(v)]
            m, sd = mean_sd(vals) if vals else (None, None)
            lengths[int(length)] = {"mean": m, "sd": sd, "n": len(vals), "values": vals}
        top = max(lengths)
        ratios = []
        for _, g in sub.groupby("seed"):
            by_len = dict(zip(g["eval_len"].astype(int), g["ppl"].astype(float)))
            if math.isfinite(by_len.get(top, math.nan)) and math.isfinite(by_len.get(train_len, math.nan)):
                ratios.append(by_len[top] / by_len[train_len])
        rm, rsd = mean_sd(ratios) if ratios else (None, None)
        out[str(scheme)] = {"train_len": train_len, "seeds": sorted(int(s) for s in sub["seed"].unique()),
                            "lengths": lengths, "ratio_longest": {"mean": rm, "sd": rsd, "n": len(ratios),
                                                                  "longest": top, "values": ratios}}
    return out


def plain_scheme(name: str) -> str:
    """The scheme a row was trained as: ``rope`` for ``rope+pi`` and ``rope+pi+ft4L``."""
    return name.split("+")[0]


def compare_ratios(table: dict, reference: str | None, margin: float | None = None) -> dict:
    """Each scheme's ratios ppl(longest) / ppl(L) against ``reference``'s, one family
    (``vs_reference``), and each context-extension row against its plain scheme's, another
    (``vs_plain``); both on the log scale, lower is better (``analysis.stats``). Only rows of
    the same L and longest length as the one they are compared with take part."""
    table = {s: {k: v for k, v in e.items() if k not in ("vs_reference", "vs_plain")} for s, e in table.items()}

    def like(s: str, other: str) -> bool:
        a, b = table[s], table.get(other)
        return bool(b and a["ratio_longest"]["values"] and b["ratio_longest"]["values"]
                    and a["ratio_longest"]["longest"] == b["ratio_longest"]["longest"]
                    and a["train_len"] == b["train_len"])

    values = {s: e["ratio_longest"]["values"] for s, e in table.items()}
    if reference in table and values[reference]:
        plain = {s: values[s] for s in table if "+" not in s and (s == reference or like(s, reference))}
        for s, t in tested_against(plain, reference, "log", margin, higher_is_better=False).items():
            table[s]["vs_reference"] = t
    rules = {s: compare(values[s], values[plain_scheme(s)], "log", margin) | {"against": plain_scheme(s)}
             for s in table if "+" in s and like(s, plain_scheme(s))}
    for s, t in family(rules, higher_is_better=False).items():
        table[s]["vs_plain"] = t
    return table


def at_length(entry: dict, length: int) -> dict:
    """A scheme's statistics at one evaluation length ({} if absent); the keys are ints
    when the table was just built and strings when it was read back from JSON."""
    return entry["lengths"].get(length) or entry["lengths"].get(str(length)) or {}


TEST_HEAD = ["p", "Holm p", "verdict"]


def lm_markdown(table: dict, reference: str | None = None) -> str:
    lengths = sorted({int(k) for e in table.values() for k in e["lengths"]})
    L = min(e["train_len"] for e in table.values())
    head = " | ".join(f"{t} ({t // L}L)" if t % L == 0 else str(t) for t in lengths)
    compared = reference is not None and any("vs_reference" in e for e in table.values())
    ratio = f"ppl({lengths[-1] // L}L) / ppl(L)"
    extra = f" ratio ÷ `{reference}`'s (95% CI) | {' | '.join(TEST_HEAD)} |" if compared else ""
    lines = [f"| scheme | {head} | {ratio} | seeds |{extra}",
             "| --- |" + " ---: |" * (len(lengths) + 2) + " ---: | ---: | ---: | --- |" * compared]
    order = sorted(table, key=lambda s: (table[s]["ratio_longest"]["mean"] is None,
                                         table[s]["ratio_longest"]["mean"] or 0))
    for s in order:
        e = table[s]
        cells = []
        for t in lengths:
            c = at_length(e, t)
            cells.append("n/a" if not c or c["mean"] is None else f"{c['mean']:.2f} ± {c['sd']:.2f}")
        r = e["ratio_longest"]
        ratio = "—" if r["mean"] is None else f"{r['mean']:.2f} ± {r['sd']:.2f}"
        row = f"| `{s}` | {' | '.join(cells)} | {ratio} | {len(e['seeds'])} |"
        if compared:
            row += " " + " | ".join(comparison_cells(e.get("vs_reference"))) + " |"
        lines.append(row)
    rules = {s: e["vs_plain"] for s, e in table.items() if "vs_plain" in e}
    if rules:
        lines += ["", "Context-extension rows against their own scheme's plain row (a family of their own):", "",
                  f"| row | against | ratio ÷ the plain row's (95% CI) | {' | '.join(TEST_HEAD)} |",
                  "| --- | --- | ---: | ---: | ---: | --- |"]
        lines += [f"| `{s}` | `{t['against']}` | " + " | ".join(comparison_cells(t)) + " |"
                  for s, t in sorted(rules.items())]
    return "\n".join(lines) + "\n"


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


def mlm_table(runs: dict[str, list[dict]], question: str, against: list[str], reference: str = "none",
              margin: float | None = None) -> dict:
    """Per scheme its seeds, steps and the accuracy and perplexity over its masked bytes;
    every scheme's accuracy against ``reference``'s, one family (``vs_reference`` in each
    entry), and the question's against each scheme of ``against``, another (``tests``),
    in points with the equivalence margin ``margin`` (``analysis.stats``)."""
    summary = {}
    for scheme, rs in runs.items():
        acc, ppl = [r["val/acc"] for r in rs], [r["val/ppl"] for r in rs]
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
    return {"metric": "masked-token accuracy on the validation split", "reference": reference, "margin": margin,
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
        lines += ["", f"Does `{q}` help? Its accuracy against each scheme named before the data (a family of its own):",
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
    lm = compare_ratios(lm_table(list(extrapolation.values())), a.lm_reference, a.lm_margin)
    if a.lm_reference not in lm:
        print(f"note: --lm-reference {a.lm_reference} has no extrapolation results: no comparison column",
              file=sys.stderr)
    write_json(out / "lm_table.json", lm)
    write_text(md / "lm_table.md", lm_markdown(lm, a.lm_reference))
    mlm = mlm_table(mlm_runs(list(runs.values())), a.question, a.against, a.mlm_reference, a.mlm_margin)
    if mlm["note"]:
        print(f"note: --question {mlm['note']}", file=sys.stderr)
    write_json(out / "mlm_table.json", mlm)
    write_text(md / "mlm_table.md", mlm_markdown(mlm))
    names = list((yaml.safe_load(Path(a.params).read_text()) or {}).get("tasks") or {}) if a.params else []
    names = names or list(dict.fromkeys(r["task"] for f in runs.values() for r in json.loads(Path(f).read_text())["runs"]))
    tasks = tasks_table(list(runs.values()), names)
    write_json(out / "tasks_table.json", tasks)
    write_text(md / "tasks_table.md", tasks_markdown(tasks))
    write_json(out / "timing.json", timing(list(runs.values())))
    for scheme, row in headline(lm, mlm).items():  # one file per scheme: one row each in `dvc metrics show`
        write_json(out / "metrics" / f"{scheme}.json", row)
    print(lm_markdown(lm, a.lm_reference))
    print(mlm_markdown(mlm))


if __name__ == "__main__":
    main()
