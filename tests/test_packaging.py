"""The wheel holds every package of the tree: setuptools installs only the packages pyproject.toml
lists, and an editable install (CI's) finds the others anyway, so a package left out breaks only
the installed wheel (a GPU run's: seen 2026-12-07, ``fi_profile.families.shared_expert_gate``)."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).parents[1]


def test_every_package_of_the_tree_is_in_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert found - listed == set()
