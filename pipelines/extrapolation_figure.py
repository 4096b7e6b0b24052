"""Press et al.'s Figure 1 of any results files, from the command line
(``analysis.extrapolation``, which draws it).

    python -m pipelines.extrapolation_figure results/extrapolation/*.csv --out figures/extrapolation
    python -m pipelines.extrapolation_figure results/extrapolation/*.csv --schemes alibi rope sinusoidal
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from analysis import extrapolation as ex


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(prog="python -m pipelines.extrapolation_figure", description=ex.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("results", nargs="+", help="results files (.csv or .json) from pipelines.extrapolate")
    p.add_argument("--out", default="figures/extrapolation", help="output stem: writes <out>.png and <out>.svg")
    p.add_argument("--method", default="nonoverlapping", choices=["nonoverlapping", "sliding"])
    p.add_argument("--title")
    p.add_argument("--schemes", nargs="+", metavar="SCHEME",
                   help="draw only these schemes (plus none as the reference when the data has it)")  # fmt: skip
    a = p.parse_args(argv)
    try:
        fig, files = ex.plot(a.results, a.out, a.method, a.title, schemes=a.schemes)
    except ValueError as e:
        p.error(str(e))
    plt.close(fig)
    for f in files:
        print(f)
    return files


if __name__ == "__main__":
    main(sys.argv[1:])
