"""posenc: compare positional-encoding schemes for transformers under identical conditions."""

from pathlib import Path

from omegaconf import OmegaConf

__version__ = "0.1.0"

#: the Hydra config folder (conf/ at the project root); here, not in posenc.train,
#: so that naming it does not import Lightning
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")

# ${abspath:...} in configs: an absolute path, so the MLflow URI and caches do not
# depend on the working directory.
OmegaConf.register_new_resolver("abspath", lambda p: str(Path(p).expanduser().resolve()), replace=True)


def _project_root() -> str:
    from .files import project_root

    return str(project_root())


# ${posenc_root:} in configs (paths.root): POSENC_ROOT, else the project's root (posenc.files.project_root)
OmegaConf.register_new_resolver("posenc_root", _project_root, replace=True)


def _absolute_env_path(name: str) -> None:
    """Make a path given in the environment absolute, once, when posenc is imported:
    ``POSENC_DATA_DIR=../shared/data`` then means the same folder to every later
    reader (configs, evaluation, the processes posenc or DVC start from another
    working directory)."""
    import os

    value = os.environ.get(name)
    if value:
        os.environ[name] = str(Path(value).expanduser().resolve())


_absolute_env_path("POSENC_DATA_DIR")
