"""Corpora, tokenizer cache, windows and masking on the real local files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.data import (
    SPECIAL_TOKENS,
    Corpus,
    DataError,
    MaskedWindows,
    RandomWindows,
    StreamSampler,
    Windows,
    prepare,
)


def test_tokenizer_and_tokens_are_cached(tmp_path, data_root):
    corpus = Corpus(
        name="tinyshakespeare", root=str(data_root), files={"train": ["tinyshakespeare/input.txt"]},
        split_fractions={"validation": 0.05, "test": 0.05},
    )
    first = prepare(corpus, tmp_path, vocab_size=512)
    assert first.meta["source"] == "local" and first.meta["vocab_size_actual"] == 512
    assert set(first.meta["tokens"]) == {"train", "validation", "test"}
    stamp = (first.directory / "train.npy").stat().st_mtime_ns
    second = prepare(corpus, tmp_path, vocab_size=512)  # reused, not rebuilt
    assert second.directory == first.directory
    assert (second.directory / "train.npy").stat().st_mtime_ns == stamp
    other = prepare(corpus, tmp_path, vocab_size=600)  # new settings, new cache entry
    assert other.directory != first.directory
    # the validation split is the 5% of lines after the training lines, in order
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(first.tokenizer_path))
    text = tok.decode(first.tokens("validation")[:200].tolist())
    lines = (data_root / "tinyshakespeare" / "input.txt").read_text().splitlines(keepends=True)
    n_train = len(lines) - 2 * int(len(lines) * 0.05)
    assert text.startswith("".join(lines[n_train : n_train + 3])[:40])


def test_non_utf8_file_is_refused(tmp_path):
    (tmp_path / "good.txt").write_text("hello world\n" * 50)
    (tmp_path / "bad.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    corpus = Corpus(name="text", root=str(tmp_path), files={"train": ["*.txt"]},
                    split_fractions={"validation": 0.1, "test": 0.1}, root_setting="data.corpus.root")
    with pytest.raises(DataError, match="bad.txt is not UTF-8"):
        prepare(corpus, tmp_path / "cache", vocab_size=300)


def test_empty_folder_is_refused(tmp_path):
    corpus = Corpus(name="text", root=str(tmp_path), files={"train": ["**/*.txt"]}, root_setting="data.corpus.root")
    with pytest.raises(DataError, match="data.corpus.root"):
        prepare(corpus, tmp_path / "cache", vocab_size=300)


def test_windows():
    tokens = np.arange(103, dtype=np.uint16)
    val = Windows(tokens, 10)
    assert len(val) == 10
    x, y = val[3]
    assert x.tolist() == list(range(30, 40)) and y.tolist() == list(range(31, 41))
    train = RandomWindows(tokens, 10, seed=3)
    starts = [train.start(g) for g in range(20_000)]
    assert min(starts) == 0 and max(starts) == len(tokens) - 11  # every window start is reachable
    x, y = train[123]
    assert torch.equal(x[1:], y[:-1]) and x[0].item() == starts[123]
    # a function of (seed, g) alone: a fresh dataset, asked in another order (across blocks of
    # RandomWindows.BLOCK ids), gives the same starts and items
    fresh = RandomWindows(tokens, 10, seed=3)
    ids = [19_999, 5000, 123, 4096, 4095, 0, 12_345]
    assert [fresh.start(g) for g in ids] == [starts[g] for g in ids]
    assert all(torch.equal(fresh[g][0], train[g][0]) and torch.equal(fresh[g][1], train[g][1]) for g in ids)
    # another seed draws other starts: of 20,000 they agree about as often as chance (1 in 93)
    other = RandomWindows(tokens, 10, seed=4)
    agree = sum(other.start(g) == s for g, s in enumerate(starts))
    assert agree < 20_000 * 2 / 93, agree


def test_stream_sampler_resumes():
    it = iter(StreamSampler(start=40))
    assert [next(it) for _ in range(3)] == [40, 41, 42]


def test_masking_follows_bert_rule():
    ids = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    tokens = (np.arange(200_001) % 1000 + 10).astype(np.uint16)
    base = Windows(tokens, 200)
    ds = MaskedWindows(base, ids, vocab_size=1010, mask_prob=0.15, fixed_seed=1)
    xs, ys = zip(*(ds[i] for i in range(len(ds))))
    x, y = torch.stack(xs), torch.stack(ys)
    assert x.shape == (len(ds), 200)
    assert (x[:, 0] == ids["[CLS]"]).all() and (y[:, 0] == -100).all()
    chosen = y != -100
    assert abs(chosen[:, 1:].float().mean().item() - 0.15) < 0.005
    orig = torch.stack([base[i][0][:-1] for i in range(len(ds))])
    assert torch.equal(y[:, 1:][chosen[:, 1:]], orig[chosen[:, 1:]])
    masked = (x[:, 1:] == ids["[MASK]"])[chosen[:, 1:]].float().mean().item()
    kept = (x[:, 1:] == orig)[chosen[:, 1:]].float().mean().item()
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01
    assert not (x[:, 1:][~chosen[:, 1:]] == ids["[MASK]"]).any()
    # every sample has its own mask (one drawn from (fixed_seed, i), not one mask for all)
    assert len({tuple(c.tolist()) for c in chosen}) == len(ds)
    # validation masks are the same every time: a dataset built again, read in another order
    # and with the global RNG elsewhere, gives the same samples; another fixed_seed other masks
    torch.manual_seed(12345)
    again = MaskedWindows(Windows(tokens, 200), ids, vocab_size=1010, mask_prob=0.15, fixed_seed=1)
    for i in (999, 5, 0, 500):
        xa, ya = again[i]
        assert torch.equal(xa, x[i]) and torch.equal(ya, y[i]), i
    other = MaskedWindows(base, ids, vocab_size=1010, mask_prob=0.15, fixed_seed=2)
    differ = sum(not torch.equal(other[i][1] != -100, chosen[i]) for i in range(100))
    assert differ == 100, differ


@pytest.mark.slow
def test_relative_data_dir_is_resolved_once_at_import(tmp_path, data_root):
    """POSENC_DATA_DIR given relative to the starting folder (as the README's
    `export POSENC_DATA_DIR=../shared/data`) still names that folder after the
    process changes directory, in the composed config and for child processes."""
    import os
    import subprocess
    import sys

    start = tmp_path / "a" / "b"
    start.mkdir(parents=True)
    relative = os.path.relpath(data_root, start)
    code = (
        "import os, subprocess, sys\n"
        "import posenc, posenc.train\n"
        "from hydra import compose, initialize_config_dir\n"
        "os.chdir('/')\n"
        "with initialize_config_dir(config_dir=posenc.CONFIG_DIR, version_base='1.3'):\n"
        "    cfg = compose('train')\n"
        "print(cfg.paths.data_dir)\n"
        "print(subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"POSENC_DATA_DIR\"])'],"
        " capture_output=True, text=True).stdout.strip())\n"
    )
    env = {**os.environ, "POSENC_DATA_DIR": relative}
    out = subprocess.run([sys.executable, "-c", code], cwd=start, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    composed, child = out.stdout.split()
    assert composed == child == str(data_root.resolve())
    assert (Path(composed) / "tinyshakespeare" / "input.txt").is_file()


#: what each data= option must ask of the hub (checked against the hub repositories' stored
#: file listings: see the README's Data section) and how the real dataset is shaped
HUB = {
    "wikitext2": (("Salesforce/wikitext", "wikitext-2-v1"), {}, "rows"),
    "wikitext103": (("Salesforce/wikitext", "wikitext-103-v1"), {}, "rows"),
    "tinyshakespeare": (("karpathy/tiny_shakespeare", None),
                        {"revision": "54795ddc6936bb3fc688edc4427abea2006bfab2"}, "one row"),
    "gutenberg": (("deepmind/pg19", None), {}, "script"),
    "text": None,  # own folder only
}


def _stand_in(shape: str):
    """A ``datasets.load_dataset`` that records its call and returns what the hub holds."""
    import datasets

    calls = []
    text = {s: "".join(f"{s} line {i} of the corpus\n" for i in range(40)) for s in ("train", "validation", "test")}

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        if shape == "script":
            raise RuntimeError(f"Dataset scripts are no longer supported, but found {args[0].split('/')[-1]}.py")
        if shape == "one row":
            return datasets.DatasetDict({s: datasets.Dataset.from_dict({"text": [t]}) for s, t in text.items()})
        return datasets.DatasetDict(
            {s: datasets.Dataset.from_dict({"text": t.splitlines(keepends=True)}) for s, t in text.items()})

    return load_dataset, calls


@pytest.mark.parametrize("option", sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "data").glob("*.yaml")))
def test_hub_arguments_of_every_data_option(option, monkeypatch):
    """Each data= option, composed with no local folder, asks the hub for what the
    table says (no setting leaks in from the config it extends) and turns what the
    hub holds into one row per line with train, validation and test."""
    import datasets
    from posenc.config import compose
    from hydra.utils import instantiate

    import posenc.train  # noqa: F401  registers the model schema (schema/model) that conf/model/*.yaml extend
    from posenc.data import DataError

    assert option in HUB, f"conf/data/{option}.yaml has no row in the HUB table of this test"
    cfg = compose([f"data={option}", "paths.data_dir=null"])
    corpus = instantiate(cfg.data.corpus)
    if HUB[option] is None:
        with pytest.raises(DataError, match="reads only the folder you name"):
            corpus.fingerprint()
        return
    (args, kwargs, shape) = HUB[option]
    load_dataset, calls = _stand_in(shape)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    if shape == "script":
        with pytest.raises(DataError, match="loading-script dataset, which datasets >= 4 no longer runs"):
            corpus.load()
    else:
        ds = corpus.load()
        assert set(ds) == {"train", "validation", "test"}
        for split in ds:
            lines = ds[split]["text"]
            assert len(lines) == 40 and lines[3] == f"{split} line 3 of the corpus\n"
    assert calls == [(args, kwargs)]
