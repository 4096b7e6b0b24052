"""Key-value retrieval (passkeys) on filler text: the task and its exact-match grid.

A window is filler from the corpus with ``needles`` key-value pairs inserted
and, at its end, a query for each of them (multi-query associative recall,
Arora et al. 2023, as Zoology trains it; with one needle it is Mohtashami &
Jaggi's passkey)::

    filler ... <key_a> 3 8 1 5 0 ... filler ... <key_b> 7 2 9 4 6 ... <query> <key_b> 7 2 9 4 6 <key_a> 3 8 1 5 0

A key is a token that occurs nowhere in the corpus (a marker byte), a value is
``digits`` digits, all distinct within a window, and the filler holds no digit
at all: the answer is never in the filler, and the only way to name it is to
find the key's earlier occurrence and copy what follows it. The loss is on the
answer digits only. Every example is a function of (seed, id), so a resumed run
sees what an uninterrupted one would, and the evaluation grid
(``trial_set``) is the same for every scheme.

Exact match under teacher forcing equals exact match of greedy decoding: if
every answer digit is the argmax given the true digits before it, greedy
decoding emits the same digits.

A trained run's grid (lengths x needle depths) is scored cell by cell (``score_cells``: what
a study's workers run, and ``python -m pipelines.retrieval`` for any run folder), then written
beside the run and logged to its MLflow run (``finish_grid``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError
from .targets import IGNORE

DIGITS = "0123456789"


@dataclass(frozen=True)
class Symbols:
    """Token ids of the task: the ten digits, the query marker and the key markers."""

    digits: tuple[int, ...]
    query: int
    keys: tuple[int, ...]


def task_symbols(token_strings: Sequence[str], present: Sequence[np.ndarray], special_ids: Sequence[int],
                 n_keys: int) -> Symbols:
    """The digits (tokens ``"0"`` .. ``"9"``) and 1 + ``n_keys`` markers: the lowest
    ids that are no special token and occur in none of the ``present`` token arrays
    (every split, so a marker is never in the filler of any split).

    ``token_strings[i]`` is token i's string."""
    vocab = {s: i for i, s in enumerate(token_strings)}
    missing = [d for d in DIGITS if d not in vocab]
    if missing:
        raise DataError(f"the tokenizer has no single-token digits {missing}: the retrieval task needs all ten")
    seen = np.zeros(len(token_strings), dtype=bool)
    for arr in present:
        seen[np.unique(np.asarray(arr))] = True
    unused = [i for i in range(len(token_strings)) if not seen[i] and i not in set(special_ids)
              and not any(c in DIGITS for c in token_strings[i])]
    if len(unused) < 1 + n_keys:
        raise DataError(f"the retrieval task needs {1 + n_keys} marker tokens that occur nowhere in the corpus; "
                        f"the vocabulary has {len(unused)}")
    return Symbols(tuple(vocab[d] for d in DIGITS), unused[0], tuple(unused[1 : 1 + n_keys]))


def filler_stream(tokens: np.ndarray, token_strings: Sequence[str]) -> np.ndarray:
    """``tokens`` with every token whose string holds a digit removed."""
    has_digit = np.array([any(c in DIGITS for c in s) for s in token_strings])
    return np.asarray(tokens)[~has_digit[np.asarray(tokens)]].astype(np.int64)


@dataclass(frozen=True)
class Layout:
    """Sizes of a window: ``length`` input tokens (the sequence is length + 1
    tokens long; inputs are its first ``length``, targets its last ``length``)."""

    length: int
    needles: int = 1
    digits: int = 5

    def __post_init__(self):
        if self.needles < 1 or self.digits < 1:
            raise DataError(f"retrieval needs at least one needle and one digit, got needles={self.needles}, "
                            f"digits={self.digits}")
        if self.needles * self.digits > 10:
            raise DataError(f"needles x digits = {self.needles * self.digits}: values are distinct digits, "
                            "so at most 10 in a window")
        if self.filler < 0:
            raise DataError(f"a window of {self.length} tokens cannot hold {self.needles} needle(s) of "
                            f"{self.digits} digits and their queries ({self.fixed} tokens)")

    @property
    def fixed(self) -> int:
        """Tokens that are not filler: the needles, the query marker, the queries."""
        return 2 * self.needles * (1 + self.digits) + 1

    @property
    def filler(self) -> int:
        return self.length + 1 - self.fixed

    @property
    def scored(self) -> int:
        """How many input positions at the end of a window hold every scored target: the
        query block (needles x (1 + digits) tokens) but its first key."""
        return self.needles * (1 + self.digits) - 1


def build(filler: np.ndarray, starts: Sequence[int], values: np.ndarray, keys: Sequence[int], order: Sequence[int],
          sym: Symbols, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """One window: ``filler`` (layout.filler tokens) with needle n (``keys[n]``
    then ``values[n]``) inserted before filler token ``starts[n]`` (ascending),
    then the query marker and the queries in ``order``. Returns (input, target),
    the target ``IGNORE`` except at the answer digits."""
    parts, prev = [], 0
    for n, s in enumerate(starts):
        parts += [filler[prev:s], [keys[n]], values[n]]
        prev = s
    parts += [filler[prev:], [sym.query]]
    for n in order:
        parts += [[keys[n]], values[n]]
    seq = torch.from_numpy(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))
    target = torch.full((layout.length,), IGNORE, dtype=torch.long)
    pos = layout.length + 1 - len(order) * (1 + layout.digits)  # sequence index of the first query key
    for _ in order:
        target[pos : pos + layout.digits] = seq[pos + 1 : pos + 1 + layout.digits]
        pos += 1 + layout.digits
    return seq[:-1], target


def draw(rng: np.random.Generator, filler: np.ndarray, sym: Symbols, layout: Layout,
         depths: Sequence[float] | None = None):
    """The random parts of one window: a filler span, needle positions (uniform, or
    at the given depths: 0 = first token of the window, 1 = right before the
    query), distinct digits, keys and query order."""
    F = layout.filler
    s = int(rng.integers(0, len(filler) - F + 1))
    span = filler[s : s + F]
    if depths is None:
        starts = np.sort(rng.integers(0, F + 1, size=layout.needles))
    else:
        starts = np.array([round(d * F) for d in depths])
    values = rng.permutation(10)[: layout.needles * layout.digits].reshape(layout.needles, layout.digits)
    values = np.asarray(sym.digits)[values]
    keys = rng.choice(len(sym.keys), size=layout.needles, replace=False)
    order = rng.permutation(layout.needles)
    return span, starts, values, [sym.keys[k] for k in keys], order


class RetrievalExamples(Dataset):
    """Training windows addressed by a global id g (``posenc.data.StreamSampler``):
    window g depends on (seed, g) alone."""

    def __init__(self, filler: np.ndarray, sym: Symbols, layout: Layout, seed: int = 0):
        if len(filler) < layout.filler:
            raise DataError(f"the filler has {len(filler)} tokens, fewer than a window's {layout.filler}")
        self.filler, self.sym, self.layout, self.seed = filler, sym, layout, seed

    def __getitem__(self, g: int):
        rng = np.random.default_rng([self.seed, 7, g])
        span, starts, values, keys, order = draw(rng, self.filler, self.sym, self.layout)
        return build(span, starts, values, keys, order, self.sym, self.layout)


class FixedExamples(Dataset):
    """``n`` windows fixed by ``seed`` (validation and test during training)."""

    def __init__(self, base: RetrievalExamples, n: int):
        self.base, self.n = base, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.base[i]


def trial(filler: np.ndarray, sym: Symbols, length: int, depth: float, digits: int, seed: int, i: int):
    """Trial i of the evaluation grid at ``length``: one needle at ``depth``. The
    filler span, digits and key of trial i are the same at every depth, so the
    depths of a length are compared on the same texts."""
    layout = Layout(length, 1, digits)
    rng = np.random.default_rng([seed, length, i])
    span, _, values, keys, order = draw(rng, filler, sym, layout)
    return build(span, [round(depth * layout.filler)], values, keys, order, sym, layout)


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / n (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@torch.no_grad()
def score_batch(model, x: torch.Tensor, y: torch.Tensor, digits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact match (B,), digits right (B,)) of a batch under teacher forcing; the model
    computes the last ``digits`` positions alone (the answer of a one-needle window)."""
    logits = model(x, last=digits)
    y = y[:, -digits:]
    scored = y != IGNORE
    right = (logits.argmax(-1) == y) & scored
    n_right = right.sum(-1)
    return n_right == scored.sum(-1), n_right


def token_strings(tokenizer_path) -> list[str]:
    """Token i's string, for every id of a prepared corpus's tokenizer."""
    from .data import load_tokenizer  # the data layer imports Lightning; this module does not need it

    tok = load_tokenizer(tokenizer_path)
    return [tok.id_to_token(i) for i in range(tok.get_vocab_size())]


class Task:
    """The task on a prepared corpus (``posenc.data.PreparedData``): its symbols
    and the filler of each split."""

    #: key markers drawn from (a window uses ``needles`` of them)
    N_KEYS = 8

    def __init__(self, prepared, digits: int = 5, needles: int = 1):
        from .data import SPLITS

        self.strings = token_strings(prepared.tokenizer_path)
        self.tokens = {s: prepared.tokens(s) for s in SPLITS}
        self.sym = task_symbols(self.strings, list(self.tokens.values()),
                                list(prepared.meta["special_ids"].values()), self.N_KEYS)
        self.digits, self.needles = digits, needles
        self._filler: dict[str, np.ndarray] = {}

    def filler(self, split: str) -> np.ndarray:
        if split not in self._filler:
            self._filler[split] = filler_stream(self.tokens[split], self.strings)
        return self._filler[split]

    def examples(self, split: str, length: int, seed: int) -> RetrievalExamples:
        return RetrievalExamples(self.filler(split), self.sym, Layout(length, self.needles, self.digits), seed)


DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def batch_tokens_for(model) -> int:
    """Tokens per evaluation batch that ran fastest for the model's kind of attention
    (one CPU thread, ``model=micro``, windows of 256 to 1024; the scores do not
    depend on it). A position-only bias is built once per forward and shared by the
    batch, so big batches amortise it (FIRE at 1024 tokens: 33 ms a window in
    batches of 16, 84 in batches of 4); a content bias (Shaw, skew,
    Transformer-XL, fixed bidirectional) keeps (B, H, T, T) intermediates, and
    one long window at a time stays in cache (Transformer-XL: 37 ms against 101);
    the fused kernel hardly cares (NoPE: 8.5 to 9.7)."""
    if not hasattr(model, "blocks"):  # a stand-in model (tests)
        return 4096
    scheme = model.blocks[0].attn.scheme
    if not scheme.has_bias:
        return 4096
    return 16384 if scheme.position_only_bias else 1024


def evaluate_grid(model, filler: np.ndarray, sym: Symbols, lengths: Sequence[int], depths: Sequence[float] = DEPTHS,
                  digits: int = 5, seed: int = 0, trials: int = 40, batch_tokens: int | None = None,
                  device: str = "cpu", progress: bool = False) -> list[dict]:
    """Exact match and per-digit accuracy of ``model`` on every (length, depth) cell.

    A cell scores ``trials`` trials, ``trial(filler, sym, length, depth, digits, seed, i)``
    for i = 0 .. trials - 1: the same for every model and seed, so the spread between
    training seeds is not mixed with a draw of other trials. Each row holds its 95% Wilson
    interval over those trials (40 trials at 0% give [0, 8.8%]; near 50%, +-15 points).
    A batch holds about ``batch_tokens`` tokens (default: ``batch_tokens_for(model)``).
    Lengths the model cannot represent (a learned table's) get NaN and a note.
    """
    from tqdm.auto import tqdm

    if trials < 1:
        raise ValueError(f"trials={trials}: a cell needs at least one trial")
    cells = [(L, d) for L in lengths for d in depths]
    rows = []
    model.eval()
    for L, d in tqdm(cells, desc="retrieval grid", disable=not progress):
        try:
            model.check_length(L)
        except ValueError as e:
            rows.append({"length": L, "depth": d, "trials": 0, "exact_match": math.nan, "exact_lo": math.nan,
                         "exact_hi": math.nan, "digit_acc": math.nan, "note": f"not applicable: {e}"})
            continue
        exact = right = 0
        batch_size = max(1, (batch_tokens or batch_tokens_for(model)) // L)
        for b in range(0, trials, batch_size):
            xs, ys = zip(*(trial(filler, sym, L, d, digits, seed, i) for i in range(b, min(trials, b + batch_size))))
            e, r = score_batch(model, torch.stack(xs).to(device), torch.stack(ys).to(device), digits)
            exact += int(e.sum())
            right += int(r.sum())
        lo, hi = wilson(exact, trials)
        rows.append({"length": L, "depth": d, "trials": trials, "exact_match": exact / trials, "exact_lo": lo,
                     "exact_hi": hi, "digit_acc": right / (trials * digits), "note": ""})
    return rows


#: the columns of a grid file: who was scored, the cell, and its scores
GRID_COLUMNS = ("scheme", "extension", "seed", "train_len", "run_id", "multiple", "length", "depth", "trials",
                "exact_match", "exact_lo", "exact_hi", "digit_acc", "needle_attention", "note")


def write_rows(rows: Sequence[dict], path, columns: Sequence[str] = GRID_COLUMNS) -> Path:
    """Rows as a CSV file with these columns (a header alone when there are no
    rows: a scheme without retrieval runs), written atomically; returns its path."""
    import pandas as pd

    from .files import write_text

    df = pd.DataFrame(list(rows), columns=list(columns))
    return write_text(path, df.to_csv(index=False, lineterminator="\n"))


# ------------------------------------------------------------------ a trained run's grid
@torch.no_grad()
def needle_attention(model, idx: torch.Tensor, start: int, width: int, rows: int) -> float:
    """How much the top layer looks at a needle: the probability mass the last ``rows``
    query rows (a retrieval window's answer) put on positions ``start`` .. ``start +
    width - 1`` (its key and value), averaged over those rows and the windows ``idx``
    (B, T), for the head that puts the most there. 1: that head reads the needle alone;
    under uniform attention it is about width / T. The probabilities are the model's own,
    from one forward that computes the top layer for those rows alone
    (``Transformer.forward(last=, attention=)``)."""
    probs: list[torch.Tensor] = []
    model(idx, last=rows, attention=probs)
    top = probs[-1]  # (B, H, rows, T)
    return float(top[..., start : start + width].sum(-1).mean((0, 2)).max())


@functools.lru_cache(maxsize=4)
def _loaded(run_dir: str, extension: str | None, base_len: int | None, device: str = "cpu"):
    """(model, task, row labels) of a trained run on ``device``, kept by a worker for the
    cells that follow.

    ``base_len``: the L of the grid's multiples and of the rule's original length
    (a run fine-tuned at 4L is scored on the lengths of the run it came from)."""
    from .runs import open_run, resolve_checkpoint, run_data

    res = resolve_checkpoint(run_dir, "last")
    run, module = open_run(res.path, device, extension, base_len)
    dm = run_data(run.cfg, vocab_size=run.vocab_size)
    labels = {"scheme": run.label(extension), "extension": extension or "", "seed": run.seed,
              "train_len": base_len or run.train_len, "run_id": res.run_id}
    return module.model, Task(dm.prepared, run.task.digits, 1), labels


def score_cells(run_dir: str, cells: list[tuple[int, float]], settings: dict, extension: str | None = None,
                base_len: int | None = None, extra: dict | None = None, device: str = "cpu") -> list[dict]:
    """Grid rows of a trained run on the given (length, depth) cells (with a
    context-extension rule switched on past L), on ``device``; ``extra`` replaces row
    labels (a fine-tuned run's scheme and extension). ``settings``: ``trial_seed``,
    ``trials``, ``attention_trials`` and ``split`` (whose filler; validation when absent). A cell's row is the same whichever cells share
    the call (its trials are drawn from the cell and the trial seed alone): the study
    scores a grid a cell per job on its pool, and a whole grid per submitit job; on the
    first ``attention_trials`` it measures how much the top layer looks at the needle
    (``needle_attention``)."""
    model, task, labels = _loaded(str(run_dir), extension, base_len, device)
    filler, seed = task.filler(settings.get("split", "validation")), settings["trial_seed"]
    rows = []
    for length, depth in cells:
        (row,) = evaluate_grid(model, filler, task.sym, [length], [depth], digits=task.digits, seed=seed,
                               trials=settings["trials"], device=device)
        row["needle_attention"] = math.nan
        if row["trials"] and settings["attention_trials"]:
            idx = torch.stack([trial(filler, task.sym, length, depth, task.digits, seed, i)[0]
                               for i in range(settings["attention_trials"])])
            start = round(depth * Layout(length, 1, task.digits).filler)  # the needle's key
            row["needle_attention"] = needle_attention(model, idx.to(device), start, 1 + task.digits, task.digits)
        rows.append(row)
    L = labels["train_len"]
    return [{**labels, **(extra or {}), "multiple": r["length"] // L, **r} for r in rows]


def log_grid(rows: list[dict], run_id: str | None, uri: str, extension: str | None, files: list[Path]) -> None:
    """MLflow metrics of a run's grid: mean over depths at step = length."""
    if run_id is None:
        return
    import pandas as pd

    from . import tracking

    tail = f"_{extension}" if extension else ""
    means = pd.DataFrame(rows).groupby("length")[["exact_match", "digit_acc"]].mean().dropna()  # n/a lengths
    c = tracking.client(uri)
    tracking.log_curves(c, run_id, {f"retrieval/{k}{tail}": list(means[k].items()) for k in means.columns})
    tracking.log_files(c, run_id, files, "retrieval")


def finish_grid(rows: list[dict], uri: str, run_dir: str, extension: str | None = None) -> tuple[list[dict], str]:
    """A run's whole grid, sorted by (length, depth): written beside the run
    (``retrieval[-<rule>].csv``, the zero-shot rule it was scored with) and logged
    to its MLflow run; returns the rows and a line of progress (the exact match at L)."""
    from .runs import RunFolder

    rows = sorted(rows, key=lambda r: (r["length"], r["depth"]))
    path = write_rows(rows, RunFolder(run_dir).grid(extension))
    log_grid(rows, rows[0]["run_id"], uri, extension, [path])
    at_l = [r["exact_match"] for r in rows if r["multiple"] == 1]
    return rows, f"{rows[0]['scheme']} s{rows[0]['seed']} retrieval grid: exact match at L {100 * sum(at_l) / len(at_l):.1f}%"
