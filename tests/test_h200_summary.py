"""The README's H200 section is generated from the committed reference runs (scripts/h200_summary.py),
not typed: it must hold exactly what the script prints from results/reference/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_h200_section_is_the_generated_one():
    spec = importlib.util.spec_from_file_location("h200_summary", ROOT / "scripts" / "h200_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text()
    section = readme.split(module.BEGIN, 1)[1].split(module.END, 1)[0]
    assert section == "\n" + module.summary(), "run `python3 scripts/h200_summary.py --write` after changing the runs"
    # the figures come from the rows: a goal line per issue-13 target, the gate verdict, a page row
    assert "compact deferred | >= 1.8x native" in section and "PASS: 2192 of 2192" in section
