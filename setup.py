"""Maps the repository's top-level folders onto one import package, ``cuvil``.

The package list is derived from the tree so a new subpackage needs no edit here.
"""

from pathlib import Path

from setuptools import setup

PACKAGE_DIRS = {
    "cuvil": "sdk",
    "cuvil.compiler": "compiler",
    "cuvil.devices": "devices",
    "cuvil.edge_runtime": "edge_runtime",
    "cuvil.coordinator": "coordinator",
}

here = Path(__file__).parent
packages = [
    ".".join((pkg, *init.parent.relative_to(here / folder).parts))
    for pkg, folder in PACKAGE_DIRS.items()
    for init in sorted((here / folder).rglob("__init__.py"))
]

setup(packages=packages, package_dir=PACKAGE_DIRS)
