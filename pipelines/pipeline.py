"""The default pipeline, declared once: every stage of ``dvc.yaml`` and what each output is for
(``pipelines.stages``: ``Stage``, ``Out``).

    python -m pipelines.pipeline            # write dvc.yaml, and every profile's pipeline, from STAGES
    python -m pipelines.pipeline --check    # exit 1 when the committed dvc.yaml is not what STAGES makes

The publish stage's artifacts, the report stage's dependencies and the report's table of
results files (``pipelines.results.FILES``) are made from the outputs declared here, and the
study stage's outputs from its tasks (``posenc.tasks.Task.outputs``). Adding a figure: its
module (``pipelines/<it>.py``), its ``Stage`` in ``STAGES``, its template (``docs/templates``);
then this command, which writes dvc.yaml and the profiles' pipelines (``pipelines.profile``).
A study stage's command, dependencies or outputs are what DVC retrains it for: a change to them
re-runs every study stage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .stages import Out, Stage, render

ROOT = Path(__file__).resolve().parents[1]

#: the comment at the top of dvc.yaml
TOP = """`dvc repro` rebuilds every figure from scratch: data -> models -> results -> figures.
Settings live in params.yaml; each stage passes explicit Hydra overrides
(dvc repro does not compose Hydra configs). Training logs to MLflow
(mlflow.db at the project root) like any run.

One `study@<scheme>` stage per scheme trains all its runs (causal LM and
masked LM, every seed) on a pool of `workers` processes and evaluates the
causal-LM runs at every length: DVC runs stages one at a time, so the pool
is what uses both cores. A study stage depends on the code every scheme shares
(the files listed below; posenc.fingerprint.study_core reads them from here)
and on its own scheme's fingerprint (results/fingerprints/<scheme>.json: its
config and every function and class its class reaches), so adding or editing
one scheme re-runs that scheme's stages and the summaries, nothing else.
Per-scheme outputs (results, heatmaps) come out of per-scheme stages; the
summaries only gather them. The trained runs (runs/<scheme>/) are no DVC
outputs: they are not committed, and nothing downstream of a study stage but
its heatmaps stage (and publish) reads them."""

#: the study stage's command (the common overrides of every run, then the scheme's own)
STUDY = (
    "python -m pipelines.study ${key} --params params.yaml --tasks ${item.tasks} --extensions \"${item.extensions}\" "
    "--scheme-overrides \"${item.overrides}\" --workers ${workers} --threads ${threads} --runs-dir runs/${key} "
    "--results-dir results --common \"data=${data} data.vocab_size=${vocab_size} model=${model} trainer=${trainer} "
    "trainer.enable_progress_bar=false trainer.enable_model_summary=false log_checkpoint=false test_at_end=true "
    "trainer.limit_val_batches=20 trainer.limit_test_batches=20 trainer.log_every_n_steps=50 "
    "logger.experiment_name=posenc-study ${common}\""
)

STAGES: list[Stage] = [
    Stage("prepare",
          "python -m pipelines.prepare --out results/prepare.json data=${data} data.vocab_size=${vocab_size}",
          deps=["src/posenc/data.py", "pipelines/prepare.py", "conf/data"], params=["data", "vocab_size"],
          outs=[Out("results/prepare.json", name="prepare")]),
    Stage("fingerprint", "python -m pipelines.fingerprint --params params.yaml --out-dir results/fingerprints",
          deps=["src/posenc/encodings", "src/posenc/native.py", "src/posenc/fingerprint.py", "src/posenc/tasks.py",
                "src/posenc/taskbase.py", "conf/encoding", "conf/task", "pipelines/fingerprint.py",
                "pipelines/gather.py"],
          params=["schemes"], outs=[Out("results/fingerprints", persist=True)],
          about="a file per scheme (results/fingerprints), rewritten only when its content changes"),
    Stage("study", STUDY, foreach="${schemes}", task_outputs=True, persist=True,
          deps=["results/prepare.json", "results/fingerprints/${key}.json",
                # the shared core, the one list of it (posenc.fingerprint.study_core reads it from dvc.yaml)
                "src/posenc/__init__.py", "src/posenc/attention", "src/posenc/compiling.py", "src/posenc/callbacks.py", "src/posenc/data.py",
                "src/posenc/encodings/base.py", "src/posenc/errors.py", "src/posenc/evaluate.py", "src/posenc/files.py",
                "src/posenc/machine.py", "src/posenc/model.py", "src/posenc/module.py", "src/posenc/ranges.py",
                "src/posenc/resume.py", "src/posenc/retrieval.py", "src/posenc/targets.py", "src/posenc/tasks.py", "src/posenc/taskbase.py",
                "src/posenc/runs.py", "src/posenc/tracking.py", "src/posenc/train.py", "src/posenc/config.py",
                "pipelines/__init__.py", "pipelines/study.py", "conf/train.yaml", "conf/data", "conf/hydra",
                "conf/logger", "conf/model", "conf/paths", "conf/task", "conf/trainer"],
          params=["data", "vocab_size", "model", "trainer", "workers", "threads", "common", "tasks",
                  "schemes.${key}"],
          outs=[Out("results/runs/${key}.json", report=True)],
          about="""the deps after the two per-scheme ones are the shared core, the one list of it
(posenc.fingerprint.study_core reads it; not the executor, which cannot change a result, nor
pipelines/commits.py, which records beside the results the commit that made them, nor what only
words or carries the console: posenc.spelling, posenc.streams).
persist: DVC leaves the outputs in place until the study replaces them all at its end, so a
refused, failed or interrupted stage leaves the committed results as they were; besides its
runs file, they are the files each task of params.yaml writes (posenc.tasks.Task.outputs)"""),
    Stage("heatmaps",
          "python -m pipelines.heatmaps ${key} --runs results/runs/${key}.json "
          "--batches ${correlations.batches} --out-dir figures/correlations/${key} "
          "--json results/correlations/${key}.json --maps results/correlations/${key}.npz "
          "--reach results/reach/${key}.csv --multipliers ${tasks.lm.evaluate.multipliers} "
          "--extensions \"${item.extensions}\"",
          foreach="${schemes}",
          deps=["results/runs/${key}.json", "analysis/reach.py", "analysis/correlations.py", "analysis/terms.py",
                "analysis/heatmaps.py", "src/posenc/runs.py", "src/posenc/files.py", "pipelines/heatmaps.py"],
          params=["correlations.batches", "tasks.lm.evaluate.multipliers", "schemes.${key}.extensions"],
          outs=[Out("results/reach/${key}.csv"), Out("figures/correlations/${key}", publish=True),
                Out("results/correlations/${key}.json"), Out("results/correlations/${key}.npz")],
          about="""a scheme's heatmaps and band scores, and how far its causal-LM runs attend
(results/reach), from the runs its study stage just made"""),
    Stage("correlations",
          "python -m pipelines.correlations results/correlations/*.json --params params.yaml "
          "--out-dir figures/correlations --json results/correlations.json --md figures/correlations_table.md",
          deps=["results/correlations", "analysis/overview.py", "analysis/heatmaps.py", "analysis/terms.py",
                "pipelines/correlations.py", "pipelines/gather.py", "src/posenc/files.py"],
          params=["schemes"],
          outs=[Out("figures/correlations/overview.png", publish=True),
                Out("figures/correlations/overview.svg", publish=True),
                Out("figures/correlations_table.md", publish=True, report=True),
                Out("results/correlations.json", publish=True, name="correlations")],
          about="the summaries: they gather per-scheme files and write only their own outputs"),
    Stage("pretrained_correlations",
          "python -m pipelines.pretrained --n ${correlations.pretrained_sentences} "
          "--length ${correlations.pretrained_length} --out-dir figures/pretrained "
          "--json results/pretrained_minilm.json",
          deps=["pipelines/pretrained.py", "pipelines/term_maps.py", "analysis/pretrained.py",
                "analysis/correlations.py", "analysis/overview.py", "analysis/terms.py", "analysis/heatmaps.py",
                "src/posenc/files.py"],
          params=["correlations.pretrained_sentences", "correlations.pretrained_length"],
          outs=[Out("figures/pretrained", publish=True),
                Out("results/pretrained_minilm.json", publish=True, name="minilm")]),
    Stage("tables",
          "python -m pipelines.tables results/runs/*.json --extrapolation results/extrapolation/*.csv "
          "--params params.yaml "
          "--lm-reference ${lm_table.reference} --lm-margin ${lm_table.margin} --question ${mlm_table.question} "
          "--against ${mlm_table.against} --mlm-reference ${mlm_table.reference} --mlm-margin ${mlm_table.margin} "
          "--out-dir results --md-dir figures",
          deps=["results/runs", "results/extrapolation", "pipelines/tables.py", "analysis/lm.py", "analysis/stats.py",
                "pipelines/gather.py", "src/posenc/files.py", "src/posenc/tasks.py", "src/posenc/taskbase.py",
                "conf/task"],
          params=["schemes", "tasks", "lm_table", "mlm_table"],
          outs=[Out("figures/tasks_table.md", report=True), Out("results/tasks_table.json", name="tasks"),
                Out("figures/lm_table.md", publish=True, report=True),
                Out("figures/mlm_table.md", publish=True, report=True),
                Out("results/timing.json", publish=True, name="timing"),
                Out("results/lm_table.json", publish=True, name="lm"),
                Out("results/lm_pairs.json", publish=True, name="lm_pairs"),
                Out("results/mlm_table.json", publish=True, name="mlm"), Out("results/metrics", metric=True)],
          about="its metrics: headline numbers, a file per scheme (`dvc metrics show` prints one short row each)"),
    Stage("buckets",
          "python -m pipelines.buckets results/runs/*.json --params params.yaml --train-len ${tasks.lm.seq_len} "
          "--multipliers ${tasks.lm.evaluate.multipliers} --json results/buckets.json --md figures/buckets_table.md",
          deps=["results/runs", "analysis/buckets.py", "pipelines/buckets.py", "pipelines/heatmaps.py",
                "pipelines/gather.py", "src/posenc/encodings/position_bias.py", "src/posenc/files.py", "conf/encoding"],
          params=["schemes", "tasks.lm.seq_len", "tasks.lm.evaluate.multipliers"],
          outs=[Out("results/buckets.json", name="buckets"), Out("figures/buckets_table.md", report=True)],
          about="""which of T5's distance buckets the causal-LM runs trained (analysis/buckets.py): the far ones
stay at their zero when max_distance is above L"""),
    Stage("figures",
          "python -m pipelines.figures results/extrapolation/*.csv --runs results/runs/*.json --params params.yaml "
          "--method nonoverlapping --out figures/extrapolation --tidy results/extrapolation.csv "
          "--reference ${lm_table.reference} --reference-label \"the tests' reference\"",
          deps=["results/extrapolation", "results/runs", "analysis/extrapolation.py", "analysis/style.py",
                "src/posenc/encodings", "conf/encoding", "pipelines/figures.py", "pipelines/gather.py",
                "src/posenc/files.py"],
          params=["schemes", "lm_table.reference"],
          outs=[Out("figures/extrapolation.png", publish=True), Out("figures/extrapolation.svg", publish=True),
                Out("results/extrapolation.csv", publish=True)],
          about="the extrapolation figure (a scheme's colour and marker by its family, analysis/style.py)"),
    Stage("retrieval",
          "python -m pipelines.retrieval_summary results/retrieval/*.csv --runs results/runs/*.json "
          "--reach results/reach/*.csv --extrapolation results/extrapolation/*.csv --params params.yaml "
          "--criterion ${tasks.retrieval.criterion.value} --cap ${tasks.retrieval.steps} "
          "--against ${retrieval_table.reference} --margin ${retrieval_table.margin} --out-dir figures/retrieval "
          "--md-dir figures --json results/retrieval_table.json --tidy results/retrieval.csv "
          "--reach-tidy results/reach.csv --reach-json results/reach_summary.json",
          deps=["results/retrieval", "results/runs", "results/reach", "results/extrapolation", "analysis/retrieval.py",
                "analysis/reach.py", "analysis/stats.py", "analysis/style.py", "src/posenc/encodings",
                "conf/encoding", "pipelines/retrieval_summary.py", "pipelines/gather.py", "src/posenc/files.py"],
          params=["schemes", "tasks.retrieval.criterion", "tasks.retrieval.steps", "retrieval_table"],
          outs=[Out("figures/retrieval", publish=True), Out("figures/retrieval_table.md", publish=True, report=True),
                Out("figures/retrieval_steps.md", publish=True, report=True),
                Out("results/retrieval_table.json", publish=True, name="retrieval"),
                Out("figures/reach_table.md", publish=True, report=True),
                Out("results/retrieval.csv", publish=True), Out("results/reach.csv", publish=True),
                Out("results/reach_summary.json", publish=True, name="reach")],
          about="""retrieval beyond perplexity: every scheme's exact-match grid (from its study stage)
beside its perplexity curve, and how far its causal-LM runs attend (its heatmaps stage)"""),
    Stage("papers",
          "python -m pipelines.papers --literature docs/literature.yaml --retrieval retrieval-seeds "
          "--out results/papers.json",
          deps=["docs/literature.yaml", "results/lm_table.json", "results/lm_pairs.json",
                "results/retrieval_table.json", "results/correlations.json", "results/pretrained_minilm.json",
                "analysis/papers.py", "analysis/stats.py", "pipelines/papers.py", "pipelines/results.py"],
          params=["lm_table", "retrieval_table"],
          outs=[Out("results/papers.json", publish=True, name="papers")],
          about="""The summaries across tables and studies: each computes its statistics once and writes them to
its results file, which the report only renders. They also read profiles' results (the retrieval
seeds, the controls, the fairness and scale profiles), which are not declared here, so that the
default `dvc repro` never runs a profile: `python -m pipelines.profile <name>` runs them again
(with the report) after a profile's repro. This one: the study against the papers, claim by claim
(analysis/papers.py, docs/literature.yaml)"""),
    Stage("findings",
          "python -m pipelines.findings --retrieval retrieval-seeds --out results/findings.json "
          "--figure figures/fairness --budget-figure figures/budget",
          deps=["results/lm_table.json", "results/lm_pairs.json", "results/mlm_table.json",
                "results/retrieval_table.json", "results/buckets.json", "results/timing.json", "analysis/findings.py",
                "analysis/papers.py", "analysis/scales.py", "analysis/stats.py", "analysis/rates.py",
                "analysis/style.py", "src/posenc/encodings", "conf/encoding", "conf/model", "pipelines/findings.py",
                "pipelines/results.py"],
          params=["model", "common", "tasks", "primary", "report.bucket_control", "lm_table", "mlm_table",
                  "retrieval_table"],
          outs=[Out("results/findings.json", publish=True, name="findings"),
                Out("figures/fairness.png", publish=True, report=True), Out("figures/fairness.svg", publish=True),
                Out("figures/budget.png", publish=True, report=True), Out("figures/budget.svg", publish=True),
                Out("figures/budget_order.png", publish=True, report=True),
                Out("figures/budget_order.svg", publish=True)],
          about="primary hypotheses, controls, fairness, the budget, seeds and power (analysis/findings.py), the "
                "fairness and budget figures (the budget: perplexity, and its order criterion)"),
    Stage("scales",
          "python -m pipelines.scales --profiles scale wikitext-bytes --kendall scale --retrieval retrieval-seeds "
          "--out results/scales.json",
          deps=["results/lm_table.json", "results/mlm_table.json", "results/retrieval_table.json", "results/reach.csv",
                "results/correlations.json", "analysis/scales.py", "analysis/stats.py", "pipelines/scales.py",
                "pipelines/results.py"],
          outs=[Out("results/scales.json", publish=True, name="scales")],
          about="the default study's orderings and findings in the scale and corpus profiles (analysis/scales.py)"),
    Stage("chronology", "python -m pipelines.chronology --out results/chronology.json",
          deps=["pipelines/chronology.py", "pipelines/commits.py", "results/runs"],
          params=["lm_table", "mlm_table", "retrieval_table", "tasks", "primary"],
          outs=[Out("results/chronology.json", name="chronology")],
          about="""which analysis choices (references, margins, seeds, the primary hypotheses) came after which
results, from the committed history (git log of params.yaml, the retrieval-seeds profile's
params and the results files): commit params.yaml before running it. The profile's params are
not declared (a project without the profile has none): its repro runs this stage again. Also
whether the study is confirmatory: an analysis plan (plan.yaml) committed before every study
stage's runs (their records' git HEAD), its fixed settings held by params.yaml. The plan is read
from git, like params.yaml, and is not declared (a study without one has none)"""),
    Stage("bench", "python -m posenc.bench ${bench.args} --no-progress --out-dir figures/bench",
          deps=["src/posenc/__init__.py", "src/posenc/bench", "src/posenc/machine.py", "src/posenc/files.py",
                "src/posenc/attention", "src/posenc/compiling.py", "src/posenc/model.py", "src/posenc/ranges.py",
                "src/posenc/encodings",
                "src/posenc/native.py", "conf"],
          params=["bench.args"], outs=[Out("figures/bench", publish=True, name="bench", part="bench.json")]),
    Stage("publish",
          "python -m pipelines.publish --params params.yaml --runs runs --records results/runs "
          "--out results/mlflow_study.json --experiment posenc-study",
          deps=["params.yaml", "results/runs", "pipelines/publish.py", "src/posenc/tracking.py", "src/posenc/evaluate.py",
                "src/posenc/files.py"],
          outs=[Out("results/mlflow_study.json", name="mlflow", persist=True)], gathers="publish",
          about="""The study in MLflow (pipelines/publish.py): one run `study-<params.yaml hash>` in
the experiment `posenc-study` (where the study's training runs are too) holds every output
declared published (pipelines/pipeline.py) as artifacts (the list is the command line: a
missing one fails the stage), and every training run under runs/ gets the tag study_run_id
pointing at it. A run with the same params.yaml and commit is reused. It depends on the study
stages' records (results/runs), not on runs/, which is not committed: a clone without the runs
keeps the committed record (persist; pipelines/publish.py says why). mlflow.db is no DVC
output: into a fresh store, `dvc repro --force --single-item publish`."""),
    Stage("report", "python -m pipelines.report", timed=False, gathers="report",
          deps=["pipelines/report.py", "pipelines/results.py", "pipelines/pipeline.py", "pipelines/stages.py",
                "pipelines/timed.py", "analysis/words.py", "analysis/stats.py", "docs/templates",
                "docs/literature.yaml", "docs/measured", "pipelines/measure.py", "params.yaml"],
          outs=[Out("docs/results.md"), Out("docs/profiles")],
          about="""the results report (docs/results.md, a page per profile in docs/profiles/) and the README's
generated blocks, from the results files above that the report reads (and each profile's,
profiles/<name>/results): every number a reader sees comes from them, and the report computes none
(the words of the verdicts are analysis/words.py, a dependency of this stage alone).
`python -m pipelines.report --check` fails when a committed one differs"""),
]

#: what `dvc plots show` draws
PLOTS = ["figures/extrapolation.png", "figures/retrieval/curves.png", "figures/retrieval/grid.png",
         "figures/retrieval/steps.png", "figures/retrieval/reach.png", "figures/correlations/overview.png",
         "figures/bench/bench.png"]

#: the comment above dvc.yaml's plots
PLOTS_ABOUT = """`dvc plots show` (dvc_plots/index.html): the study's figures as images, which the page
shows offline; one curve per scheme, seeds as a band (a data plot of the tidy CSV would
draw every scheme and seed as one line, and needs Vega from the internet)"""


def dvc_yaml(stages: Sequence[Stage] = STAGES, root: Path = ROOT) -> str:
    """The text of ``dvc.yaml`` that ``stages`` make (the study's outputs from ``root/params.yaml``)."""
    return render(stages, PLOTS, root, TOP, PLOTS_ABOUT)


def write(root: Path = ROOT, stages: Sequence[Stage] = STAGES) -> list[Path]:
    """Write ``root/dvc.yaml`` and the pipeline of every profile that has one (``pipelines.profile``),
    but a frozen profile's (it keeps the stages that made its results); the files that changed."""
    from . import profile

    changed = []
    target = root / "dvc.yaml"
    text = dvc_yaml(stages, root)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
        changed.append(target)
    for name in profile.profiles(root):
        made = root / "profiles" / name / "dvc.yaml"
        if made.exists() and not profile.frozen(name, root) and made.read_text() != (text := profile.render(name, root)):
            made.write_text(text)
            changed.append(made)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.pipeline", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="fail when dvc.yaml is not what STAGES makes")
    a = p.parse_args(argv)
    if a.check:
        if (ROOT / "dvc.yaml").read_text() != dvc_yaml():
            print("dvc.yaml is not what pipelines/pipeline.py declares: run python -m pipelines.pipeline",
                  file=sys.stderr)
            return 1
        print("dvc.yaml: current")
        return 0
    for path in write():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
