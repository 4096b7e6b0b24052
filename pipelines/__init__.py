"""DVC stage commands: thin CLIs over posenc.

Importing this package pins what makes the study's numbers the same on any x86-64 CPU,
for every stage and every job a stage starts (they inherit this environment; a SLURM
job too, as sbatch exports it by default). MKL picks its matrix kernels by CPU vendor:
AVX-512 on an Intel Xeon, AVX2 on AMD, so one study gave other losses on each.
``MKL_ENABLE_INSTRUCTIONS=AVX2`` on the Xeon reproduced an EPYC run's losses exactly, and
on AMD EPYC it changes no result (the same sha256 of matmul outputs with and without it,
and the same tables from ``dvc repro --force``; docs/reproduce.md). Set the variable
yourself (``AVX512``) to trade identical tables for the Xeon's faster matmul.
"""

import os

#: MKL's instruction set for every stage and job of the study: the one both vendors' CPUs run
MKL_PIN = {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
for _key, _value in MKL_PIN.items():
    os.environ.setdefault(_key, _value)
