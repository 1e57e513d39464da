"""Only the package list lives here (pyproject.toml has the rest): the code packages, found, plus the two data
packages that pyproject.toml maps onto the repository's registry/ and traces/ folders (pyproject alone cannot list
a mapped package next to found ones)."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["moetier*", "backends*", "conformance*", "adapters*"])
      + ["moetier.shipped.registry", "moetier.shipped.traces"])
