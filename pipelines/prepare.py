"""Build (or reuse) the tokenizer and token cache of a corpus and record where it came from.

    python -m pipelines.prepare data=wikitext2 --out results/prepare.json

Arguments other than --out are Hydra overrides of the training config. The
record names the source (local folder or hub), the cache folder, token counts
and the checksum of the token arrays, so every later stage can say what data
it saw.
"""

from __future__ import annotations

import argparse
import os

from hydra.utils import instantiate

from posenc.config import compose
from posenc.files import portable_path, write_json


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m pipelines.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON record to write")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data=tinyshakespeare")
    a = p.parse_args(argv)
    cfg = compose(a.overrides)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    meta = dm.prepared.meta
    record = {
        "corpus": cfg.data.corpus.name,
        "source": meta["source"],
        # relative to the project: no absolute path of this machine in a committed file
        "root": os.path.relpath(meta["root"]) if meta.get("root") else None,
        "hub": cfg.data.corpus.hub if meta["source"] == "hub" else None,
        "cache": portable_path(dm.prepared.directory),
        "vocab_size": meta["vocab_size_actual"],
        "tokens": meta["tokens"],
        "tokens_sha256": meta["tokens_sha256"],
    }
    write_json(a.out, record)
    print(f"data={record['corpus']} from {record['source']} ({record['root'] or record['hub']}): {record['tokens']}")
    return record


if __name__ == "__main__":
    main()
