"""ragwarm: keeps LLM inference workers warm for retrieval-augmented generation."""

from importlib.metadata import PackageNotFoundError, version

try:
    # The installed distribution's metadata is the one source of the version (pyproject.toml).
    __version__ = version("ragwarm")
except PackageNotFoundError:  # a checkout imported without `pip install -e .`
    __version__ = "0+unknown"
