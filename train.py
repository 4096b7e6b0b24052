"""Train one model: ``python train.py encoding=rope data=tinyshakespeare``.

A sweep runs one process per point: ``python train.py -m encoding=none,rope,alibi``.
"""

from posenc.cli import cli

if __name__ == "__main__":
    cli()
