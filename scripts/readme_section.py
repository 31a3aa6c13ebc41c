"""Replace a generated section of README.md: the text between a begin and an end marker (scripts/*_summary.py)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def write_section(begin: str, end: str, text: str, readme: Path = README) -> None:
    body = readme.read_text()
    if begin not in body or end not in body:
        raise SystemExit(f"{readme.name} has no {begin} ... {end} section")
    head, rest = body.split(begin, 1)
    readme.write_text(head + begin + "\n" + text + end + rest.split(end, 1)[1])


def read_section(begin: str, end: str, readme: Path = README) -> str:
    """What the section holds now (the tests compare it with what the generator prints)."""
    return readme.read_text().split(begin, 1)[1].split(end, 1)[0]
