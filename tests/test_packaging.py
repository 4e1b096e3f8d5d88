"""specserve's packages against the installed ones: a package of ours with the import name of an installed
distribution hides it from the working directory (Ray workers and pytest import from there), as `kernels`
hid Hugging Face's kernel hub package, which transformers 5.25 depends on and imports."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_installed_distribution_shares_a_package_name_of_ours():
    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    ours = [pattern.removesuffix("*") for pattern in includes]
    assert ours and all((ROOT / name / "__init__.py").is_file() for name in ours)
    providers = importlib.metadata.packages_distributions()
    shared = {name: others for name in ours if (others := set(providers.get(name, ())) - {"specserve"})}
    assert not shared, f"installed distributions with the import name of a package of ours: {shared}"
