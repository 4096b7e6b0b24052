"""Corpora, tokenizer and the Lightning DataModule.

Text is loaded with ``datasets``: from the Hugging Face hub by default, or from
local files when a data directory is given (``paths.data_dir``, or the
``POSENC_DATA_DIR`` environment variable). A byte-level BPE tokenizer is
trained with ``tokenizers`` on the training split and cached on disk, keyed by
the corpus contents and the tokenizer settings; the token ids of every split
are cached beside it, so a second run neither retrains nor re-tokenizes.

Training samples random contiguous windows; validation and test use
non-overlapping windows of the training length.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import lightning as L
import numpy as np
import torch
from filelock import FileLock
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from .errors import DataError
from .files import atomic, write_json
from .targets import IGNORE

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
SPECIAL_TOKENS = ["<|endoftext|>", "[PAD]", "[CLS]", "[MASK]"]
CACHE_VERSION = 2


@dataclass
class Corpus:
    """Where a corpus comes from.

    Args:
        name: short name, part of the cache key.
        root: local directory; when set, ``files`` are read from it and the
            hub is not used. ``None`` means the hub.
        files: split -> glob patterns relative to ``root``.
        split_fractions: for corpora shipped as one split: the share of lines
            (taken from the end, in order) that becomes validation and test.
        hub: ``{"path": ..., "name": ..., "revision": ...}`` for ``datasets.load_dataset``
            (None values are left out); a split held in one row is split into lines.
        root_setting: the setting that sets ``root`` (named in errors).
    """

    name: str
    root: str | None = None
    files: dict[str, list[str]] = field(default_factory=dict)
    split_fractions: dict[str, float] | None = None
    hub: dict | None = None
    text_column: str = "text"
    root_setting: str = "paths.data_dir (or POSENC_DATA_DIR)"

    @property
    def source(self) -> str:
        return "local" if self.root else "hub"

    def local_files(self) -> dict[str, list[Path]]:
        """Resolve and check the local files of every listed split."""
        root = Path(self.root).expanduser()
        if not root.is_dir():
            raise DataError(
                f"data directory {root} does not exist; set {self.root_setting} to the folder "
                f"that holds the {self.name} files" + (", or unset it to load from the hub" if self.hub else "")
            )
        out = {}
        for split, patterns in self.files.items():
            if not patterns:
                continue
            paths = sorted({Path(p) for pat in patterns for p in glob.glob(str(root / pat), recursive=True)})
            paths = [p for p in paths if p.is_file()]
            if not paths:
                raise DataError(
                    f"no {split} files matching {list(patterns)} under {root} for data={self.name}; "
                    f"check {self.root_setting}"
                )
            for p in paths:
                if p.stat().st_size == 0:
                    raise DataError(f"{p} is empty; remove it or point {self.root_setting} elsewhere")
            out[split] = paths
        return out

    def fingerprint(self) -> dict:
        """What identifies the corpus contents (for cache keys)."""
        if self.root:
            files = self.local_files()
            digest = {}
            for split, paths in files.items():
                h = hashlib.sha256()
                for p in paths:
                    h.update(p.name.encode())
                    h.update(_check_utf8(p))
                digest[split] = h.hexdigest()
            return {"source": "local", "files": digest, "split_fractions": self.split_fractions}
        if not self.hub:
            raise DataError(
                f"data={self.name} reads only the folder you name: set {self.root_setting}=<folder of .txt files>"
            )
        return {"source": "hub", "hub": dict(self.hub), "split_fractions": self.split_fractions}

    def load(self):
        """A ``datasets.DatasetDict`` with train/validation/test and a text column."""
        import datasets

        if self.root:
            files = self.local_files()
            ds = datasets.load_dataset(
                "text", data_files={s: [str(p) for p in ps] for s, ps in files.items()}, keep_linebreaks=True
            )
        else:
            hub = {k: v for k, v in self.hub.items() if v is not None}
            try:
                ds = datasets.load_dataset(hub.pop("path"), hub.pop("name", None), **hub)
            except Exception as e:  # network or hub errors: say what to do offline
                why = str(e).splitlines()[0][:300] if str(e) else ""
                if "scripts are no longer supported" in why:
                    why = f"{self.hub['path']} is a loading-script dataset, which datasets >= 4 no longer runs"
                raise DataError(
                    f"could not load data={self.name} from the hub ({type(e).__name__}: {why}); "
                    f"set {self.root_setting} to a local copy of its files"
                ) from e
            if self.text_column != "text":
                ds = ds.rename_column(self.text_column, "text")
            ds = _lines(ds)
        if self.split_fractions and not all(s in ds for s in SPLITS):
            ds = _split_by_fraction(ds["train"], self.split_fractions)
        missing = [s for s in SPLITS if s not in ds]
        if missing:
            raise DataError(f"data={self.name} has no {missing} split; give files or split_fractions for it")
        return ds


def _check_utf8(path: Path) -> bytes:
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); convert it, e.g. "
            f"`iconv -f latin1 -t utf-8`, or remove it from the data folder"
        ) from e
    return data


def _lines(ds):
    """One row per line (line breaks kept), as the local files are read: hub datasets
    that hold a whole split in one row (Tiny Shakespeare) are split into lines; those
    with a line per row (WikiText) are unchanged."""

    def split(batch):
        return {"text": [line for text in batch["text"] for line in text.splitlines(keepends=True)]}

    return ds.map(split, batched=True, remove_columns=ds["train"].column_names, desc="lines")


def _split_by_fraction(train, fractions: dict[str, float]):
    """Contiguous split of one dataset: train first, then validation, then test."""
    import datasets

    n = len(train)
    n_val = int(n * fractions.get("validation", 0.0))
    n_test = int(n * fractions.get("test", 0.0))
    n_train = n - n_val - n_test
    if min(n_train, n_val, n_test) <= 0:
        raise DataError(f"split_fractions {dict(fractions)} leave an empty split of {n} lines")
    return datasets.DatasetDict(
        train=train.select(range(n_train)),
        validation=train.select(range(n_train, n_train + n_val)),
        test=train.select(range(n_train + n_val, n)),
    )


# ----------------------------------------------------------------- tokenizer
def train_tokenizer(texts, vocab_size: int, min_frequency: int = 2):
    """Byte-level BPE (GPT-2 style) trained on an iterator of strings."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS,
        show_progress=sys.stdout.isatty(),  # a bar on a terminal only: in a log it is noise, and a closed pipe panics it
    )
    return tok


def load_tokenizer(path: str | os.PathLike):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


@dataclass
class PreparedData:
    """Paths of a prepared corpus in the cache."""

    directory: Path
    meta: dict

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / "tokenizer.json"

    def tokens(self, split: str) -> np.ndarray:
        return np.load(self.directory / f"{split}.npy", mmap_mode="r")


def npy_bytes(array: np.ndarray) -> bytes:
    """``array`` in the .npy format (``np.save`` to a path would append ".npy" to it)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def prepare(corpus: Corpus, cache_dir: str | os.PathLike, vocab_size: int, min_frequency: int = 2) -> PreparedData:
    """Train (or reuse) the tokenizer and token-id arrays of ``corpus``.

    The cache folder name is a hash of the corpus fingerprint and tokenizer
    settings; a folder is complete once its ``meta.json`` exists (written last,
    atomically), so an interrupted preparation is redone, never half-used.
    """
    key_src = {
        "corpus": corpus.name,
        "fingerprint": corpus.fingerprint(),
        "vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "special_tokens": SPECIAL_TOKENS,
        "version": CACHE_VERSION,
    }
    key = hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:16]
    directory = Path(cache_dir).expanduser().resolve() / f"{corpus.name}-v{vocab_size}-{key}"
    meta_path = directory / "meta.json"
    if meta_path.exists():
        return PreparedData(directory, json.loads(meta_path.read_text()))
    directory.mkdir(parents=True, exist_ok=True)
    lock = Path(str(directory) + ".lock")
    try:
        with FileLock(str(lock)):  # parallel runs (DDP ranks, sweeps) prepare once
            if meta_path.exists():
                return PreparedData(directory, json.loads(meta_path.read_text()))
            meta = _build(corpus, directory, key_src)
    except BaseException:  # a refused or interrupted preparation leaves no half-made cache behind
        if not meta_path.exists():
            shutil.rmtree(directory, ignore_errors=True)
            lock.unlink(missing_ok=True)
        raise
    return PreparedData(directory, meta)


def _build(corpus: Corpus, directory: Path, key_src: dict) -> dict:
    vocab_size, min_frequency = key_src["vocab_size"], key_src["min_frequency"]
    meta_path = directory / "meta.json"
    log.info("preparing data=%s (%s) into %s", corpus.name, corpus.source, directory)
    ds = corpus.load()
    train_text = ds["train"]["text"]
    tok = train_tokenizer((t for t in train_text), vocab_size, min_frequency)
    atomic(directory / "tokenizer.json", lambda tmp: tok.save(str(tmp)))
    tokenizer = load_tokenizer(directory / "tokenizer.json")
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65536 else np.int32
    counts = {}
    for split in SPLITS:
        encoded = ds[split].map(
            lambda b: {"ids": [e.ids for e in tokenizer.encode_batch(b["text"])]},
            batched=True,
            remove_columns=ds[split].column_names,
            desc=f"tokenizing {split}",
            load_from_cache_file=False,
        )
        ids = np.fromiter((i for row in encoded["ids"] for i in row), dtype=dtype)
        if ids.size < 2:
            raise DataError(f"the {split} split of data={corpus.name} has fewer than 2 tokens")
        atomic(directory / f"{split}.npy", lambda tmp, ids=ids: tmp.write_bytes(npy_bytes(ids)))
        counts[split] = int(ids.size)
    digest = hashlib.sha256()
    for split in SPLITS:
        digest.update((directory / f"{split}.npy").read_bytes())
    meta = {
        **key_src,
        "vocab_size_actual": tokenizer.get_vocab_size(),
        "special_ids": {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS},
        "tokens": counts,
        "source": corpus.source,
        "root": str(Path(corpus.root).resolve()) if corpus.root else None,
        "tokens_sha256": digest.hexdigest(),
    }
    write_json(meta_path, meta)
    return meta


# ------------------------------------------------------------------ datasets
def _dist() -> tuple[int, int]:
    """(rank, world size) of the running process group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class StreamSampler(Sampler[int]):
    """An endless, resumable stream of global sample ids.

    This rank yields c * world + rank for c = start, start + 1, ...; a resumed
    run starts at its global step x batch size and so sees exactly the samples
    an uninterrupted run would have seen next.
    """

    def __init__(self, start: int = 0):
        self.start = start

    def __iter__(self):
        rank, world = _dist()
        c = self.start
        while True:
            yield c * world + rank
            c += 1


class RandomWindows(Dataset):
    """Random contiguous windows of ``seq_len + 1`` tokens, addressed by a global
    sample id g (``StreamSampler``): the window start of g is entry g % BLOCK of a
    generator seeded by (seed, g // BLOCK), so it depends on the seed and g alone.
    Item g is (input, target) = tokens[s : s+L], tokens[s+1 : s+L+1].
    """

    BLOCK = 4096

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int = 0):
        if len(tokens) < seq_len + 1:
            raise DataError(f"the training split has {len(tokens)} tokens, fewer than seq_len+1={seq_len + 1}")
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.num_windows = len(tokens) - seq_len
        self._cached: tuple[int, np.ndarray] = (-1, np.empty(0, dtype=np.int64))

    def start(self, g: int) -> int:
        b = g // self.BLOCK
        if self._cached[0] != b:
            self._cached = (b, np.random.default_rng([self.seed, b]).integers(0, self.num_windows, size=self.BLOCK))
        return int(self._cached[1][g % self.BLOCK])

    def __getitem__(self, g: int):
        s = self.start(g)
        w = torch.from_numpy(self.tokens[s : s + self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


class Windows(Dataset):
    """Non-overlapping windows of ``seq_len`` scored tokens: window i predicts
    tokens[i*L + 1 : i*L + L + 1] from tokens[i*L : i*L + L]. The tail that does not
    fill a window is dropped."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise DataError(f"a split of {len(tokens)} tokens holds no window of {seq_len}")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        s = i * self.seq_len
        w = torch.from_numpy(self.tokens[s : s + self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


class MaskedWindows(Dataset):
    """BERT-style masked-LM samples built from windows of another dataset.

    Each sample is [CLS] followed by the first ``seq_len - 1`` tokens of a
    window. Of the text tokens, ``mask_prob`` are chosen as targets; of those
    80% become [MASK], 10% a random token and 10% stay (Devlin et al. 2019).
    Targets elsewhere are ``IGNORE``. With ``fixed_seed`` the masks of
    sample i depend on (fixed_seed, i) alone, so validation sees the same masks
    every time and a resumed training run the same masks as an uninterrupted
    one; without it they come from the global RNG.
    """

    def __init__(self, base: Dataset, special_ids: dict[str, int], vocab_size: int,
                 mask_prob: float = 0.15, fixed_seed: int | None = None):
        self.base, self.special_ids, self.vocab_size = base, special_ids, vocab_size
        self.mask_prob, self.fixed_seed = mask_prob, fixed_seed

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        x, _ = self.base[i]
        text = x[:-1]
        gen = None
        if self.fixed_seed is not None:
            gen = torch.Generator().manual_seed(self.fixed_seed * 1_000_003 + i)
        r = torch.rand(text.shape, generator=gen)
        chosen = r < self.mask_prob
        if not chosen.any():  # at least one target per sample
            chosen[int(torch.randint(len(text), (1,), generator=gen))] = True
        action = torch.rand(text.shape, generator=gen)
        random_ids = torch.randint(len(SPECIAL_TOKENS), self.vocab_size, text.shape, generator=gen)
        inp = text.clone()
        inp[chosen & (action < 0.8)] = self.special_ids["[MASK]"]
        swap = chosen & (action >= 0.8) & (action < 0.9)
        inp[swap] = random_ids[swap]
        target = torch.where(chosen, text, torch.full_like(text, IGNORE))
        cls = torch.tensor([self.special_ids["[CLS]"]])
        return torch.cat((cls, inp)), torch.cat((torch.tensor([IGNORE]), target))


class LMDataModule(L.LightningDataModule):
    """Language-model data: the corpus, its tokenizer and windowed loaders.

    ``task`` is the run's task object (``posenc.tasks``, built once from ``conf/task/`` by
    ``posenc.train.train`` or ``posenc.runs.run_data`` and passed in): every loader hands its
    split's windows to ``task.dataset``, which makes the task's examples of them. Without a
    task, the windows themselves (next-token prediction).
    """

    def __init__(
        self,
        corpus: Corpus,
        cache_dir: str,
        vocab_size: int = 4096,
        min_frequency: int = 2,
        seq_len: int = 128,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        task=None,
        seed: int = 0,
    ):
        super().__init__()
        if seq_len < 1:
            raise DataError(f"data.seq_len={seq_len} must be at least 1")
        self.corpus = corpus
        self.cache_dir = cache_dir
        self.vocab_size = vocab_size
        self.min_frequency = min_frequency
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.task = task
        self.seed = seed
        self.prepared: PreparedData | None = None

    def prepare_data(self) -> None:
        self.prepared = prepare(self.corpus, self.cache_dir, self.vocab_size, self.min_frequency)

    def setup(self, stage: str | None = None) -> None:
        if self.prepared is None:  # other ranks: the cache is complete now
            self.prepared = prepare(self.corpus, self.cache_dir, self.vocab_size, self.min_frequency)

    @property
    def tokenizer_vocab_size(self) -> int:
        if self.prepared is None:
            self.prepare_data()
        return int(self.prepared.meta["vocab_size_actual"])

    def tokens(self, split: str) -> np.ndarray:
        if self.prepared is None:
            self.prepare_data()
        return self.prepared.tokens(split)

    def _loader(self, ds: Dataset, sampler: Sampler | None, batch_size: int) -> DataLoader:
        # an own generator: creating an iterator must not draw from the global RNG
        # (that would shift dropout masks after a resume)
        return DataLoader(
            ds, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed),
        )

    def _eval_sampler(self, ds: Dataset) -> Sampler | None:
        rank, world = _dist()
        return DistributedSampler(ds, world, rank, shuffle=False) if world > 1 else None

    def _task_dataset(self, ds: Dataset, split: str) -> Dataset:
        return ds if self.task is None else self.task.dataset(self, ds, split)

    def train_dataloader(self) -> DataLoader:
        """Random windows from an endless stream that resumes where the run stopped."""
        ds = self._task_dataset(RandomWindows(self.tokens("train"), self.seq_len, self.seed), "train")
        start = 0
        if self.trainer is not None:  # resumed: skip what the optimizer has already seen
            start = self.trainer.global_step * self.trainer.accumulate_grad_batches * self.batch_size
        return self._loader(ds, StreamSampler(start), self.batch_size)

    def val_dataloader(self) -> DataLoader:
        ds = self._task_dataset(Windows(self.tokens("validation"), self.seq_len), "validation")
        return self._loader(ds, self._eval_sampler(ds), self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        ds = self._task_dataset(Windows(self.tokens("test"), self.seq_len), "test")
        return self._loader(ds, self._eval_sampler(ds), self.eval_batch_size)
