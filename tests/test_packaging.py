"""pyproject.toml in the form setuptools builds without a warning (PEP 639's licence fields)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_licence_is_an_spdx_expression_and_no_classifier_repeats_it() -> None:
    """`license` is SPDX with `license-files`, no `License ::` classifier, setuptools >= 77.

    A `license = {text = ...}` table or a `License ::` classifier makes every setuptools
    77+ build (`make install`'s `pip install -e`) print a page of deprecation warnings.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    meta = project["project"]
    assert "Apache-2.0" == meta["license"]
    assert ["LICENSE"] == meta["license-files"]
    assert not [c for c in meta["classifiers"] if c.startswith("License ::")]
    assert ["setuptools>=77"] == project["build-system"]["requires"]
    constraints = (ROOT / "constraints.txt").read_text(encoding="utf-8").lower().split()
    assert not [pin for pin in constraints if pin.startswith("setuptools")]
