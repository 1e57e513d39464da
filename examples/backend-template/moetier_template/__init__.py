"""moetier's template backend: numpy compute over moetier's O_DIRECT reader (moetier_template.backend), with the
records its conformance run needs (``registry_dir()``: the ``moetier.registries`` entry point)."""
from pathlib import Path


def registry_dir() -> Path:
    """The folder of this package's records: recipe/tiny-ci-template.json and the engine record it names."""
    return Path(__file__).resolve().parent / "registry"
