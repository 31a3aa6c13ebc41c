"""The README's `harness advise` section is generated from committed runs (scripts/advise_summary.py), not typed:
it must hold exactly what the script prints, and the figures it links must be there."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("advise_summary", ROOT / "scripts" / "advise_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_advise_section_is_the_generated_one():
    module = _script()
    from readme_section import read_section  # scripts/, which the script put on the path

    section = read_section(module.BEGIN, module.END)
    assert section == "\n" + module.summary(), "run `python3 scripts/advise_summary.py --write` after changing the runs"
    # a verdict row per acceptance for each preset, and what the rows do not cover said in words
    for p in ("0.5", "0.7", "0.9"):
        assert re.search(rf"^\| {p} \| 128 \| \S", section, re.M)
    assert "not measured: batch 1, 8, 32, 256, 512" in section or "(the whole sweep)" in section
    links = re.findall(r"\]\((docs/advise/[^)]+\.png)\)", section)
    assert len(links) == 2 * section.count(" on NVIDIA ")  # a choice map and a frontier per preset
    for link in links:
        assert (ROOT / link).is_file(), f"{link} is linked but not committed: run the script with --write"
