"""Perplexity at any evaluation length, from a checkpoint (Press et al. 2022).

"Train short, test long" (Press, Smith & Lewis 2022, Figure 1 and Table 2):
a language model trained on windows of L tokens is evaluated on windows of
L, 2L, 4L, ... tokens of the validation split.

Which tokens are scored
-----------------------
Every evaluation length and every method scores the SAME tokens, each
exactly once, so the perplexities differ only by the context the model sees:

* The split's token array ``t`` is cut to a fixed span: the scored targets are
  ``t[1 : N + 1]`` (predicted from ``t[0 : N]``), with
  ``N = floor(min(max_tokens, len(t) - 1) / M) * M`` where ``M`` is the least
  common multiple of the evaluation lengths (for L * 2^k this is simply the
  largest length). ``N`` therefore tiles exactly into windows of every length.
* ``nonoverlapping`` (the paper's default): windows ``[i*T, i*T + T)`` for
  i = 0 .. N/T - 1; every token of every window is scored, so the first token
  of a window has no context. With T = the training length and ``N`` covering
  the first k validation windows this is exactly what training's validation
  loop computes (``posenc.data.Windows``).
* ``passages`` > 1: the span is cut into that many passages of n tokens each (n a
  multiple of M, ``passages * n <= max_tokens``), drawn from the split without
  overlap by a seed (``passage_starts``; the study gives each run its own seed's):
  the split is cut into slots of n scored tokens, and the passages are the slots a
  seeded draw picks. Each passage is scored as a span of its own (the rules above
  apply within it) and the perplexity is over all their tokens. With one passage the
  span is the split's first N tokens, as above.
* ``sliding`` with stride s (s <= T): the first window ``[0, T)`` scores all of
  its T tokens; each later window ends s tokens after the previous one
  (``[e - T, e)`` with e = T + s, T + 2s, ... and finally N) and scores only the
  tokens the previous windows did not score (its last s, or fewer at the end),
  so every scored token but those of the first window sees at least T - s
  tokens of context. With s = T this is the non-overlapping method.

Every window is fed at positions 0 .. T-1 (a fresh sequence, as in the paper).

Schemes that cannot represent a length (``Transformer.check_length`` raises
ValueError: a learned table shorter than T) are reported as not applicable:
``ppl`` is NaN / None and ``note`` holds the reason. Nothing is wrapped or
clipped.

Memory: windows are batched so that batch * T stays under ``token_budget``
(at least one window per batch); the evaluation builds only (B, T) index
tensors and the model's (B, T, V) logits, never anything of size T^2 * D.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .files import portable_path, write_json, write_text
from .runs import open_run, resolve_checkpoint, run_data
from .tracking import default_tracking_uri

log = logging.getLogger(__name__)

METHODS = ("nonoverlapping", "sliding")
DEFAULT_MULTIPLIERS = (1, 2, 4, 8, 16)
DEFAULT_MAX_TOKENS = 65536
DEFAULT_TOKEN_BUDGET = 8192
#: tag on every run with extrapolation metrics: their MLflow step is not a training
#: step but the evaluation length (tokens per window)
STEP_TAG = ("extrapolation.step", "evaluation length in tokens (metric extrapolation/ppl_<method>)")
COLUMNS = (
    "scheme", "seed", "train_len", "eval_len", "method", "stride", "ppl", "nll", "n_tokens", "note", "extension",
    "corpus", "split", "run_id", "checkpoint",
)  # fmt: skip


# ------------------------------------------------------------- token choice
def span_length(n_available: int, lengths: Sequence[int], max_tokens: int | None) -> int:
    """N: the number of scored tokens, a multiple of every length (see module doc).

    ``n_available`` is the size of the token array (N + 1 tokens are needed).
    """
    if not lengths:
        raise ValueError("no evaluation lengths given")
    if min(lengths) < 1:
        raise ValueError(
            f"evaluation lengths must be at least 1, got {list(lengths)}; fix --lengths / --multipliers"
        )
    m = math.lcm(*[int(x) for x in lengths])
    limit = n_available - 1 if max_tokens is None else min(int(max_tokens), n_available - 1)
    n = (limit // m) * m
    if n < 1:
        raise ValueError(
            f"cannot score the same tokens at lengths {list(lengths)}: that needs a multiple of {m} tokens, "
            f"but max_tokens={max_tokens} and the split holds {n_available} tokens; "
            "raise max_tokens or evaluate shorter lengths"
        )
    return n


def passage_starts(n_available: int, lengths: Sequence[int], max_tokens: int | None, passages: int = 1,
                   seed: int | None = None) -> tuple[int, list[int]]:
    """(n, starts): the scored tokens of each passage and where each starts in the split (see
    the module doc); passage i scores t[start + 1 : start + n + 1]. One passage: the split's
    first ``span_length`` tokens. More: n = ``span_length`` of 1 / ``passages`` of the split
    and of ``max_tokens``, and the passages ``passages`` of the split's (n_available - 1) // n
    slots of n, drawn without replacement by ``numpy.random.default_rng(seed)``, in order."""
    if passages < 1:
        raise ValueError(f"passages={passages}: score at least one passage")
    per_passage = None if max_tokens is None else int(max_tokens) // passages
    n = span_length((n_available - 1) // passages + 1, lengths, per_passage)
    if passages == 1:
        return n, [0]
    if seed is None:
        raise ValueError(f"passages={passages}: the passages are drawn by a seed, and none was given")
    slots = (n_available - 1) // n
    chosen = np.random.default_rng(seed).choice(slots, size=passages, replace=False)
    return n, [int(c) * n for c in sorted(chosen)]


def windows(n: int, length: int, method: str, stride: int | None = None) -> list[tuple[int, int]]:
    """(start, first scored index in the window) of every window over N scored tokens.

    Window (s, j) feeds inputs t[s : s+T] and scores the predictions of
    t[s+j+1 : s+T+1]. The scored targets of all windows partition t[1 : N+1].
    """
    if length > n:
        raise ValueError(f"window {length} is longer than the {n} scored tokens")
    if method == "nonoverlapping":
        if n % length:
            raise ValueError(f"{n} scored tokens do not tile into windows of {length}")
        return [(s, 0) for s in range(0, n, length)]
    if method == "sliding":
        s = length if stride is None else int(stride)
        if not 1 <= s <= length:
            raise ValueError(f"stride={s} must be in [1, window={length}] (a larger stride skips tokens)")
        out, end = [(0, 0)], length
        while end < n:
            new_end = min(end + s, n)
            out.append((new_end - length, length - (new_end - end)))
            end = new_end
        return out
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def resolve_stride(length: int, stride: int | None) -> int:
    """The stride used at window ``length``: ``stride`` capped at the window, or T/2 when None."""
    if stride is None:
        return max(1, length // 2)
    if stride < 1:
        raise ValueError(f"stride={stride} must be positive")
    return min(int(stride), length)


# --------------------------------------------------------------- evaluation
@torch.no_grad()
def score(
    model: torch.nn.Module,
    tokens: np.ndarray,
    length: int,
    method: str = "nonoverlapping",
    stride: int | None = None,
    n: int | None = None,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> tuple[float, int]:
    """(summed negative log-likelihood in nats, scored token count) over t[1 : n+1]."""
    n = len(tokens) - 1 if n is None else n
    plan = windows(n, length, method, stride)
    span = torch.from_numpy(np.asarray(tokens[: n + 1]).astype(np.int64))
    batch = max(1, token_budget // length)
    pos = torch.arange(length, device=device)
    cols = torch.arange(length, device=device)
    total, count = 0.0, 0
    bar = tqdm(total=n, unit="tok", desc=f"{method} T={length}", disable=not progress, leave=False)
    for b in range(0, len(plan), batch):
        chunk = plan[b : b + batch]
        starts = torch.tensor([s for s, _ in chunk])
        idx = starts[:, None] + torch.arange(length + 1)  # (B, T+1) indices into the span
        w = span[idx].to(device)
        x, y = w[:, :-1], w[:, 1:]  # (B, T) each
        logits = model(x, pos).float()  # (B, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)  # (B, T)
        first = torch.tensor([j for _, j in chunk], device=device)
        keep = cols[None, :] >= first[:, None]  # (B, T)
        total += float(nll[keep].double().sum())
        k = int(keep.sum())
        count += k
        bar.update(k)
    bar.close()
    if count != n:  # the windows partition the span: anything else is a bug
        raise RuntimeError(f"scored {count} tokens instead of {n} ({method}, T={length})")
    return total, count


def evaluate_model(
    model: torch.nn.Module,
    tokens: np.ndarray,
    lengths: Sequence[int],
    methods: Sequence[str] = ("nonoverlapping",),
    stride: int | None = None,
    max_tokens: int | None = DEFAULT_MAX_TOKENS,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    device: str | torch.device = "cpu",
    progress: bool = True,
    passages: int = 1,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """Rows {eval_len, method, stride, ppl, nll, n_tokens, note, passages} for a posenc Transformer.

    The same tokens (see the module docstring: ``passages`` drawn by ``seed``, whose starts
    ``passages`` gives) are scored at every length and by every method; lengths the model
    cannot represent get ppl NaN and a note.
    """
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {METHODS}")
    lengths = sorted({int(x) for x in lengths})
    n, starts = passage_starts(len(tokens), lengths, max_tokens, passages, seed)
    spans = [tokens[start : start + n + 1] for start in starts]
    was_training = model.training
    model.eval()
    rows = []
    try:
        for length in lengths:
            note = ""
            try:
                model.check_length(length)
            except ValueError as e:
                note = f"not applicable: {e}"
            for method in methods:
                s = resolve_stride(length, stride) if method == "sliding" else length
                row = {"eval_len": length, "method": method, "stride": s, "ppl": math.nan, "nll": math.nan,
                       "n_tokens": 0, "note": note, "passages": " ".join(map(str, starts))}  # fmt: skip
                if not note:
                    t0 = time.perf_counter()
                    scores = [score(model, span, length, method, s, n, token_budget, device, progress)
                              for span in spans]
                    total, count = sum(t for t, _ in scores), sum(c for _, c in scores)
                    row.update(nll=total / count, ppl=math.exp(total / count), n_tokens=count)
                    log.info("T=%d %s: ppl %.3f over %d tokens in %.1fs", length, method, row["ppl"], count,
                             time.perf_counter() - t0)  # fmt: skip
                rows.append(row)
    finally:
        model.train(was_training)
    return rows


# ------------------------------------------------------------------- output
def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_results(rows: Sequence[dict], out: str | os.PathLike) -> list[Path]:
    """Write ``rows`` as ``<out>.csv`` and ``<out>.json`` (records; NaN -> null), atomically."""
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".csv", ".json") else out
    cols = list(COLUMNS) + sorted({k for r in rows for k in r} - set(COLUMNS))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if _clean(r.get(k)) is None else r.get(k)) for k in cols})
    return [
        write_text(stem.with_name(stem.name + ".csv"), buf.getvalue()),
        write_json(stem.with_name(stem.name + ".json"), [{k: _clean(r.get(k)) for k in cols} for r in rows], indent=1),
    ]


def read_results(paths: Iterable[str | os.PathLike]):
    """One pandas DataFrame from results files (.csv or .json records)."""
    import pandas as pd

    frames = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise FileNotFoundError(f"no results file {p}")
        df = pd.read_json(p, orient="records") if p.suffix == ".json" else pd.read_csv(p)
        df["source"] = str(p)
        frames.append(df)
    if not frames:
        raise ValueError("no results files given")
    df = pd.concat(frames, ignore_index=True)
    df["ppl"] = pd.to_numeric(df["ppl"], errors="coerce")
    df["note"] = df["note"].fillna("") if "note" in df else ""
    return df


def log_to_mlflow(
    rows: Sequence[dict], run_id: str, tracking_uri: str, files: Sequence[Path] = (), tags: dict | None = None,
    extension: str | None = None,
) -> None:
    """Metric ``extrapolation/ppl_<method>`` (``..._<extension>`` for a context-extension
    rule) at step = evaluation length (applicable rows only; the tag ``STEP_TAG`` says
    so on the run), tags with the settings, and the results files as artifacts under
    ``extrapolation/``."""
    from . import tracking

    curves: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("ppl") is not None and math.isfinite(r["ppl"]):
            key = f"extrapolation/ppl_{r['method']}" + (f"_{extension}" if extension else "")
            curves.setdefault(key, []).append((int(r["eval_len"]), float(r["ppl"])))
    c = tracking.client(tracking_uri)
    tracking.log_curves(c, run_id, curves)
    tracking.set_tags(c, run_id, {STEP_TAG[0]: STEP_TAG[1], **(tags or {})})
    tracking.log_files(c, run_id, files, "extrapolation")


# ----------------------------------------------------------------- top level
@dataclass
class Settings:
    """What ``evaluate_checkpoint`` does; the CLI's flags map one to one."""

    multipliers: Sequence[int] = DEFAULT_MULTIPLIERS
    lengths: Sequence[int] | None = None  # explicit lengths instead of multipliers x train length
    methods: Sequence[str] = METHODS
    stride: int | None = None  # sliding stride in tokens; None: half the window
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: the whole split (floored)
    split: str = "validation"
    passages: int = 1  # passages of the split, drawn by the run's seed (``passage_starts``)
    token_budget: int = DEFAULT_TOKEN_BUDGET
    device: str = "cpu"
    which: str = "last"
    data_dir: str | None = None
    cache_dir: str | None = None
    runs_dir: str | None = None
    tracking_uri: str | None = None  # where to find / log the run; default: the run's own
    log_mlflow: bool = True
    progress: bool = True
    extension: str | None = None  # a context-extension rule of the scheme (rope: pi, ntk, yarn)
    extra: dict = field(default_factory=dict)


def rows_at_lengths(run_dir: str, rule: str | None, label: dict | None, base_len: int, device: str,
                    multipliers: Sequence[int], max_tokens: int | None, split: str = "validation",
                    passages: int = 1) -> list[dict]:
    """A study's rows of one trained run (``posenc.tasks.CausalLM.evaluate``): perplexity of
    non-overlapping windows at each multiple of ``base_len`` (L) on ``passages`` of ``split``
    drawn by the run's seed, with a zero-shot ``rule`` switched on, or labelled as a fine-tuned
    run (``label``: its scheme and extension)."""
    settings = Settings(methods=("nonoverlapping",), device=device, progress=False, split=split, passages=passages,
                        lengths=[m * base_len for m in multipliers], max_tokens=max_tokens, extension=rule,
                        extra=label | {"train_len": base_len} if label else {})
    return evaluate_checkpoint(run_dir, settings)[0]


def evaluate_checkpoint(ref: str | os.PathLike, settings: Settings | None = None, out: str | None = None):
    """Evaluate one checkpoint (path, run folder or MLflow run id) at every length.

    Returns (rows, files written). Rows carry scheme, seed, train_len, corpus,
    split, run id and checkpoint besides the per-length results.
    """
    s = settings or Settings()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if s.device == "auto" else s.device
    res = resolve_checkpoint(ref, s.which, s.runs_dir, s.tracking_uri)
    # with an extension: the same weights, the scheme scaled past the training length
    run, module = open_run(res.path, device, s.extension)
    train_len = run.train_len
    lengths = list(s.lengths) if s.lengths else [int(m) * train_len for m in s.multipliers]
    tokens = run_data(run.cfg, s.data_dir, s.cache_dir, run.vocab_size).tokens(s.split)
    rows = evaluate_model(module.model, tokens, lengths, s.methods, s.stride, s.max_tokens, s.token_budget, device,
                          s.progress, s.passages, run.seed)
    base = {
        "scheme": run.label(s.extension),
        "extension": s.extension or "",
        "seed": run.seed,
        "train_len": train_len,
        "corpus": run.corpus,
        "split": s.split,
        "run_id": res.run_id,
        "checkpoint": portable_path(res.path),
        **s.extra,
    }
    rows = [{**base, **r} for r in rows]
    files = write_results(rows, out) if out else []
    if s.log_mlflow:
        if res.run_id is None:
            log.warning("no MLflow run known for %s: results not logged to MLflow", res.path)
        else:
            uri = s.tracking_uri or res.tracking_uri or run.tracking_uri
            uri = uri or default_tracking_uri()
            n = next((r["n_tokens"] for r in rows if r["n_tokens"]), 0)
            tags = {"extrapolation.split": s.split, "extrapolation.n_tokens": n, "extrapolation.passages": s.passages,
                    "extrapolation.stride": "half window" if s.stride is None else s.stride}  # fmt: skip
            log_to_mlflow(rows, res.run_id, uri, files, tags, s.extension)
    return rows, files
