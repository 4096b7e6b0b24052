"""The refusals posenc words for the user: one line naming the setting and the fix."""


class ConfigError(ValueError):
    """An impossible combination of settings, or a checkpoint that cannot serve."""


class DataError(ValueError):
    """A problem with the data settings or files."""
