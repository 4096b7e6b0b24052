"""posenc: compare positional-encoding schemes for transformers under identical conditions."""

from pathlib import Path

from omegaconf import OmegaConf

__version__ = "0.1.0"

# ${abspath:...} in configs: an absolute path, so the MLflow URI and caches do not
# depend on the working directory.
OmegaConf.register_new_resolver("abspath", lambda p: str(Path(p).expanduser().resolve()), replace=True)
