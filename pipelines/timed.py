"""Run one DVC stage's command and record when it ran, so that the report can give the
repro's wall time and where it went (``pipelines.report``).

    python -m pipelines.timed results/times/tables.json python -m pipelines.tables ...

Runs the command after the record's path as it is (no shell), with this process's
environment and standard streams. When it succeeds, writes the record: the stage
(the record's file name), when it started and finished (seconds since the epoch) and
its seconds. When it fails, or is interrupted, writes nothing and exits with the
command's status, so DVC keeps nothing of the stage. Ctrl-C reaches the command alone
(it shares the terminal's process group), which stops as it does when run by itself
(a study stage saves its runs' checkpoints and exits 130); this process then passes
that status on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from posenc.files import write_json


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].endswith(".json"):
        print("usage: python -m pipelines.timed <record>.json <command> [args...]", file=sys.stderr)
        return 2
    record, command = Path(argv[0]), argv[1:]
    if command[0] == "python":  # the interpreter running this, as DVC's `python` would be
        command = [sys.executable, *command[1:]]
    started = time.time()
    # a handler, not SIG_IGN: the command starts with Python's own (SIG_IGN would be inherited)
    signal.signal(signal.SIGINT, lambda *_: None)
    rc = subprocess.Popen(command).wait()
    finished = time.time()
    if rc != 0:
        return rc
    write_record(record, started, finished)
    return 0


def write_record(record: Path, started: float, finished: float) -> None:
    """A stage's time record: the stage (the file's name), its start and end (seconds since the
    epoch) and its seconds; what this module writes, and the fan-out for each stage it runs."""
    write_json(record, {"stage": record.stem, "started": round(started, 2), "finished": round(finished, 2),
                        "seconds": round(finished - started, 2)})


def wall(records: Mapping[str, Mapping]) -> dict:
    """A repro's wall time from its stages' records ({stage: record}): ``span`` from the first
    stage's start to the last one's end, ``one_sitting`` (no gap of more than 10 minutes
    between stages: the span is one repro's), ``stages`` (their seconds in all), the seconds
    per kind of stage (``study@alibi`` is a ``study``), and the ``date`` of the last end."""
    spans = sorted((r["started"], r["finished"]) for r in records.values())
    reach, gaps = spans[0][1], []
    for start, end in spans[1:]:
        gaps.append(start - reach)
        reach = max(reach, end)
    kinds: dict[str, float] = {}
    for stage, r in records.items():
        kind = stage.split("@")[0]
        kinds[kind] = kinds.get(kind, 0.0) + r["seconds"]
    finished = max(r["finished"] for r in records.values())
    return {"span": reach - spans[0][0], "one_sitting": all(g < 600 for g in gaps),
            "stages": sum(r["seconds"] for r in records.values()), "kinds": kinds,
            "date": datetime.fromtimestamp(finished, timezone.utc).strftime("%Y-%m-%d")}


if __name__ == "__main__":
    sys.exit(main())
