"""The mutation score of the code the suite exists to keep right (``mutmut``).

    python -m tests.mutation --fresh        # judge every mutant anew, then report (the README's score)
    python -m tests.mutation                # judge the mutants not judged yet (new or changed code)
    python -m tests.mutation --survivors    # judge the surviving mutants again (after adding tests)
    python -m tests.mutation --report-only  # the report of the last run

Scope (``SCOPE``): the positional schemes (``src/posenc/encodings/``), attention
(``attention.py``), the evaluation at any length (``evaluate.py``), the masked-LM
corruption of ``data.py`` (``MaskedWindows``), and what turns runs into claims: the
retrieval task and its grid (``retrieval.py``), attention reach (``analysis/reach.py``),
the statistics (``analysis/stats.py``), the tables and gathering of ``pipelines/``
(``tables.py``, ``gather.py``) and the retrieval summary's statistics and tables
(``analysis/retrieval.py``, not its figures). mutmut's settings are in
``pyproject.toml`` (``[tool.mutmut]``: the files it mutates, the tests it runs, the
lines it leaves alone). It runs from a copy under ``mutants/`` (git-ignored),
``POSENC_DATA_DIR`` must name the corpora as for the tests, and judging the whole
scope (about 8,600 mutants) takes hours on 2 cores (a 2-core EPYC judged 6,477 in two hours,
30 to 75 a minute). Without ``--fresh`` it keeps
mutmut's verdicts for functions whose code did not change (mutmut's own cache), so a
"killed" can be older than the tests; ``--survivors`` re-judges every survivor that is
not listed as equivalent with the tests as they are.

A mutant that survives is either killed by a test or listed in ``EQUIVALENT``
(``tests/mutation_equivalent.txt``) with the changed line and why no test can tell
it from the original (it computes the same values). A listed mutant whose changed
line no longer matches is reported as stale: its verdict must be looked at again.

Score = killed / (mutants in scope - equivalent ones); the report also counts
survivors, timeouts and mutants no test reaches, gives the score per part (the old
scope together, then each file of the new scope, ``parts_table``), and writes
``docs/mutation.md``.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the scope judged before the retrieval, reach, statistics and tables code joined it
OLD_SCOPE = ("posenc.encodings.*", "posenc.attention.*", "posenc.evaluate.*", "posenc.data.xǁMaskedWindowsǁ*")
SCOPE = (
    *OLD_SCOPE,
    # what turns runs into the retrieval and reach claims, and the statistics of every table
    "posenc.retrieval.*", "analysis.reach.*", "analysis.stats.*", "pipelines.tables.*", "pipelines.gather.*",
    *(f"analysis.retrieval.x_{f}__mutmut_*" for f in ("run_records", "base_scheme", "per_run", "used", "summary",
                                                       "_pct", "_spread", "_seeds", "table_markdown",
                                                       "steps_markdown")),
)
EQUIVALENT = REPO / "tests" / "mutation_equivalent.txt"
REPORT = REPO / "docs" / "mutation.md"
KILLED = {"killed", "timeout", "caught by type check"}
NOT_JUDGED = "not checked"  # mutmut's status of a mutant no run has judged yet
SPINNER = set("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")  # the first character of mutmut's progress lines, left out of its output's tail


@dataclass
class Equivalent:
    name: str
    line: str  # the changed line as the mutant has it
    why: str


def mutmut(*args: str, check: bool = True) -> str:
    exe = Path(sys.executable).with_name("mutmut")
    r = subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"mutmut {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return r.stdout


def verdicts() -> dict[str, int | None]:
    """{mutant: exit code or None (not judged)} of the generated mutants in scope, read from
    mutmut's files under mutants/."""
    import json

    out: dict[str, int | None] = {}
    for meta in (REPO / "mutants").rglob("*.meta"):
        for name, code in json.loads(meta.read_text()).get("exit_code_by_key", {}).items():
            if any(fnmatch.fnmatch(name, p) for p in SCOPE):
                out[name] = code
    return out


def run(names: list[str] | tuple[str, ...], max_children: int) -> None:
    """``mutmut run`` of the named mutants (names or patterns; mutmut judges each again)."""
    exe = str(Path(sys.executable).with_name("mutmut"))
    r = subprocess.run([exe, "run", "--max-children", str(max_children), *names], cwd=REPO,
                       capture_output=True, text=True)  # fmt: skip
    out = r.stdout.replace("\r", "\n")
    # 1: some mutants survived; but mutmut also ends with 1, having judged nothing, when the tests
    # fail on the unmutated code (its "stats" run), and says so only in its output
    if r.returncode not in (0, 1) or "failed to collect stats" in out:
        tail = "\n".join([ln for ln in out.splitlines() if ln.strip() and ln.lstrip()[:1] not in SPINNER][-40:])
        raise SystemExit(f"mutmut run failed (exit {r.returncode}); the end of its output:\n{tail}\n"
                         f"{r.stderr[-3000:]}\n"
                         "(the tests must pass on the unmutated copy under mutants/: set debug = true under "
                         "[tool.mutmut] in pyproject.toml to see them)")


def results() -> dict[str, str]:
    """{mutant: status} of every mutant mutmut knows, in scope."""
    out = {}
    for line in mutmut("results", "--all", "true").splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name and any(fnmatch.fnmatch(name, p) for p in SCOPE):
            out[name] = status.strip()
    return out


def source_of(name: str) -> Path:
    """The file a mutant belongs to (``posenc.encodings.position_bias.x...`` -> src/posenc/encodings/position_bias.py,
    ``analysis.reach.x...`` -> analysis/reach.py): the module is every dotted part before the
    mangled function (``x_<function>`` or ``xǁ<class>ǁ<method>``), so a module whose own name
    starts with x (``posenc.encodings.xpos``) is kept whole."""
    parts = name.split(".")
    at = next((i for i, p in enumerate(parts) if p.startswith(("x_", "xǁ"))), len(parts) - 1)
    module = parts[:at]
    if (REPO / "src" / module[0]).is_dir():  # the package under src/ (mutmut strips "src." from the name)
        module = ["src", *module]
    return Path(*module).with_suffix(".py")


def diff_of(name: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) of the mutant, stripped, from mutmut's diff."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        diff = get_diff_for_mutant(name, path=source_of(name))
    finally:
        os.chdir(cwd)
    lines = diff.splitlines()
    removed = [ln[1:].strip() for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:].strip() for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return removed, added


def changed_line(name: str) -> str:
    """The first line the mutant adds."""
    added = diff_of(name)[1]
    return added[0] if added else ""


_DEVICE = re.compile(r",?device=[\w.]+,?")


def device_only(name: str) -> bool:
    """Whether the mutant changes nothing but where a tensor is made: a ``device=`` argument
    set to None or left out, or the ``dev`` variable that holds it set to None. On CPU, where
    the suite runs, every such tensor lands on the same device, so no test can tell."""
    removed, added = diff_of(name)
    if len(removed) != 1 or len(added) != 1:
        return False
    if re.fullmatch(r"dev = [\w.]+\.device", removed[0]) and added[0] == "dev = None":
        return True
    strip = lambda ln: _DEVICE.sub(",", ln.replace(" ", "")).replace(",)", ")").replace("(,", "(")  # noqa: E731
    return "device" in removed[0] and strip(removed[0]) == strip(added[0])


#: the arguments of argparse that only document a command line: what ``--help`` and the usage line say
_DOC = re.compile(r"""\b(?:help|prog|description|epilog)=(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[\w.]+)"""
                  r"|\bformatter_class=(?!None\b)[\w.]+")


def help_only(name: str) -> bool:
    """Whether the mutant changes nothing but the documentation of a command line: an
    argparse ``help=``, ``prog=``, ``description=`` or ``epilog=`` changed, set to None or left
    out, or ``formatter_class=`` left out (not set to None, which breaks every usage message).
    What the command reads and computes is the same; only the text of ``--help`` differs,
    whose wording, like that of errors and log lines, the score does not measure."""
    removed, added = diff_of(name)
    before, after = " ".join(removed), " ".join(added)
    if not removed or before == after:
        return False
    if not re.search(r"ArgumentParser\(|add_argument\(|^(help|prog|description|epilog|formatter_class)=", before):
        return False
    norm = lambda ln: re.sub(r",+", ",", _DOC.sub("", ln).replace(" ", "")).replace(",)", ")").replace("(,", "(")  # noqa: E731
    return norm(before) == norm(after)


def load_equivalent(path: Path = EQUIVALENT) -> dict[str, Equivalent]:
    """Blocks of three lines: the mutant's name, ``+ <changed line>``, ``why: <reason>``."""
    out, lines = {}, [ln.rstrip("\n") for ln in path.read_text().splitlines()] if path.exists() else []
    lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    for i in range(0, len(lines), 3):
        name, plus, why = lines[i : i + 3]
        if not plus.strip().startswith("+ ") or not why.strip().startswith("why: "):
            raise SystemExit(f"{path}: entry {name!r} needs a '+ <line>' and a 'why: <reason>' line")
        out[name.strip()] = Equivalent(name.strip(), plus.strip()[2:].strip(), why.strip()[5:].strip())
    return out


def part_of(name: str) -> str:
    """The part of the scope a mutant is counted in: ``old scope`` (``OLD_SCOPE``), or its file."""
    if any(fnmatch.fnmatch(name, p) for p in OLD_SCOPE):
        return "old scope"
    return source_of(name).as_posix()


def parts_table(status: dict[str, str], equivalent: set[str]) -> list[str]:
    """The score per part (``part_of``): the old scope, then each file of the new scope, then the
    new scope together; each with its mutants, the killed, the equivalent, the rest judged (survived,
    no test reached it, or listed as equivalent with a stale line), those not judged yet, and
    killed / (mutants - equivalent - not judged)."""
    counts: dict[str, list[int]] = {}
    for n, s in status.items():
        c = counts.setdefault(part_of(n), [0, 0, 0, 0, 0])
        c[0] += 1
        if s in KILLED:
            c[1] += 1
        elif s == NOT_JUDGED:
            c[4] += 1
        elif n in equivalent:
            c[2] += 1
        else:
            c[3] += 1
    new = [k for k in counts if k != "old scope"]
    rows = [k for k in ("old scope",) if k in counts] + sorted(new)
    new_total = [sum(counts[k][i] for k in new) for i in range(5)]

    def row(label: str, c: list[int]) -> str:
        judged = c[0] - c[2] - c[4]
        score = f"{100 * c[1] / judged:.1f}%" if judged else "—"
        return f"| {label} | {c[0]} | {c[1]} | {c[2]} | {c[3]} | {c[4]} | {score} |"

    out = ["## Score per part", "",
           "| part | mutants | killed | equivalent | not killed | not judged | score |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    out += [row("old scope (encodings, attention, evaluate, MaskedWindows)" if k == "old scope" else f"`{k}`",
                counts[k]) for k in rows]
    if new:
        out.append(row("**new scope together**", new_total))
    return out


def commit() -> str:
    """The commit the report is written at, with ``+changes`` if the working tree differs from it
    (the report itself, which every run rewrites, left out)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    report = REPORT.relative_to(REPO).as_posix()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", f":(exclude){report}"], cwd=REPO).returncode != 0
    return head.stdout.strip() + (" +changes" if dirty else "")


def report(status: dict[str, str]) -> tuple[str, dict]:
    equivalent = load_equivalent()
    survived = sorted(n for n, s in status.items() if s not in KILLED and s != NOT_JUDGED)
    pending = sum(1 for s in status.values() if s == NOT_JUDGED)
    equiv_ok, by_device, by_help, stale, open_ = [], [], [], [], []
    for n in survived:
        e = equivalent.get(n)
        if e is not None:
            (equiv_ok if changed_line(n) == e.line else stale).append(n)
        elif device_only(n):
            by_device.append(n)
        elif help_only(n):
            by_help.append(n)
        else:
            open_.append(n)
    killed = sum(1 for s in status.values() if s in KILLED)
    unreached = sum(1 for n in open_ if status[n] == "no tests")
    denominator = len(status) - pending - len(equiv_ok) - len(by_device) - len(by_help)
    score = killed / denominator if denominator else float("nan")
    counts = {"mutants": len(status), "pending": pending, "killed": killed,
              "equivalent": len(equiv_ok) + len(by_device) + len(by_help),
              "survived": len(open_),
              "stale": len(stale), "score": score}
    by_status: dict[str, int] = {}
    for s in status.values():
        by_status[s] = by_status.get(s, 0) + 1
    lines = [
        "# Mutation score", "",
        "`python -m tests.mutation` (mutmut; scope and settings in `tests/mutation.py` and `pyproject.toml`),",
        f"written at commit `{commit()}`.", "",
        f"- mutants in scope: {len(status)} ({', '.join(f'{k} {v}' for k, v in sorted(by_status.items()))})",
        f"- killed (a test fails, or it times out): {killed}",
        f"- equivalent, listed in `tests/mutation_equivalent.txt` with the reason (its line checked): {len(equiv_ok)}",
        f"- equivalent on CPU, found by rule (only a `device=` changes; `device_only`): {len(by_device)}",
        f"- equivalent by rule, only the text of a command's `--help` changes (`help_only`): {len(by_help)}",
        f"- survived, not listed: {len(open_)} (of them no judge reaches {unreached}: mutmut's `no tests`, "
        f"counted as not killed); listed but the line changed (stale): {len(stale)}",
        f"- not judged yet (left out of the score; see the table per part): {pending}",
        f"- **score: {killed} / {denominator} = {100 * score:.1f}%** of the judged non-equivalent mutants", "",
        *parts_table(status, set(equiv_ok) | set(by_device) | set(by_help)), "",
    ]
    if open_ or stale:
        lines += ["## Survivors to look at", ""]
        lines += [f"- `{n}`: `{changed_line(n)}`" for n in open_ + stale] + [""]
    lines += ["## Equivalent mutants", "", "| mutant | changed line | why it computes the same |", "| --- | --- | --- |"]
    lines += [f"| `{n}` | `{equivalent[n].line}` | {equivalent[n].why} |" for n in equiv_ok]
    lines += [f"| `{n}` | `{changed_line(n)}` | only the device changes (CPU) |"  # noqa: E501
              for n in by_device]
    lines += [f"| `{n}` | `{changed_line(n)}` | only the text of `--help` changes |" for n in by_help]
    return "\n".join(lines) + "\n", counts


def judged_in(report: Path) -> int | None:
    """How many mutants a written report judged (in scope, less those not judged yet); None without one."""
    text = report.read_text() if report.exists() else ""
    scope = re.search(r"^- mutants in scope: (\d+)", text, re.M)
    pending = re.search(r"^- not judged yet[^:]*: (\d+)", text, re.M)
    return int(scope.group(1)) - int(pending.group(1)) if scope and pending else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report-only", action="store_true", help="no run: the report of the last one")
    p.add_argument("--fresh", action="store_true", help="remove mutants/ first (all verdicts are redone)")
    p.add_argument("--survivors", action="store_true", help="judge the surviving mutants again")
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    p.add_argument("--replace", action="store_true",
                   help="write the report even where it judged fewer mutants than the one it replaces")
    p.add_argument("--only", nargs="+", metavar="PATTERN",
                   help="judge only the mutants in scope that match one of these (e.g. 'analysis.*'); "
                        "the report counts the rest as not judged")
    a = p.parse_args(argv)
    if not os.environ.get("POSENC_DATA_DIR"):
        raise SystemExit("set POSENC_DATA_DIR to the corpora, as for the tests")
    if a.fresh and (REPO / "mutants").exists():
        shutil.rmtree(REPO / "mutants")
    if a.report_only:
        pass
    elif not (REPO / "mutants").exists():
        run(a.only or SCOPE, a.max_children)  # generates the mutants and judges every one in scope
    else:
        # mutmut re-judges every mutant it is given by name, so name only the ones wanted:
        # first a run of one small function, which regenerates the mutants of changed code
        run(["posenc.encodings.base.xǁPositionalSchemeǁlogit_scale__mutmut_*"], a.max_children)
        listed = load_equivalent()
        todo = [n for n, code in verdicts().items()
                if code in (None, 33)  # not judged, or no test ran it
                or (a.survivors and code == 0 and n not in listed and not device_only(n)
                    and not help_only(n))]  # fmt: skip
        if a.only:
            todo = [n for n in todo if any(fnmatch.fnmatch(n, p) for p in a.only)]
        if todo:
            run(todo, a.max_children)
    text, counts = report(results())
    if not a.report_only and counts["mutants"] == counts["pending"]:
        raise SystemExit("no mutant was judged: docs/mutation.md is left as it was")
    judged, before = counts["mutants"] - counts["pending"], judged_in(REPORT)
    if before is not None and judged < before and not a.replace:
        raise SystemExit(f"this run's verdicts cover {judged} mutants, the report they would replace {before} "
                         f"(a stopped run, or verdicts lost): {REPORT.name} is left as it was; --replace writes it")
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)
    print(re.sub(r"\n## Equivalent mutants.*", "", text, flags=re.S))
    print(f"written: {REPORT.relative_to(REPO)}")
    return 0 if counts["survived"] == 0 and counts["stale"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
