"""Train one model: ``python train.py encoding=rope data=tinyshakespeare``.

A sweep: ``python train.py -m encoding=none,rope,alibi`` (its points one after another; side by
side with ``hydra/launcher=local``, as SLURM jobs with ``hydra/launcher=slurm``, docs/gpus.md).
"""

from posenc.cli import cli

if __name__ == "__main__":
    cli()
