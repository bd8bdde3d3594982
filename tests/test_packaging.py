"""What a package index shows: the licence pyproject states is the file shipped, the long description
holds no link that breaks off the repository (relative links, images), and the page has URLs and
classifiers."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_file_is_the_apache_2_text_pyproject_names():
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 150


def test_the_long_description_links_only_absolute_addresses():
    readme = ROOT / PROJECT["readme"]
    assert readme.suffix == ".md" and readme != ROOT / "README.md"  # README.md links files of the repository
    text = readme.read_text()
    targets = re.findall(r"\]\(([^)\s]+)", text) + re.findall(r"""(?:src|href)=["']([^"']+)""", text)
    assert targets, "the description links the paper"
    assert all(t.startswith("https://") for t in targets), [t for t in targets if not t.startswith("https://")]
    assert "![" not in text and "<img" not in text  # no image the index would have to fetch


def test_the_index_page_has_urls_and_classifiers():
    assert PROJECT["urls"] and all(u.startswith("https://") for u in PROJECT["urls"].values())
    classifiers = PROJECT["classifiers"]
    assert any(c.startswith("Programming Language :: Python :: 3") for c in classifiers)
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert any(c.startswith("Intended Audience") for c in classifiers)
    assert not any(c.startswith("License ::") for c in classifiers)  # PEP 639: the SPDX expression says it
