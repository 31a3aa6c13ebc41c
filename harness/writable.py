"""Is an output path usable? Checked before any work, so `--out`, `--dump` and `--junit` fail in one line
instead of after the run (or with a traceback).

A path is usable when it (or, for one that does not exist yet, the nearest existing folder above it)
is a folder where a file can be created. The check creates and removes a probe there rather than
asking `os.access`, which says yes to root everywhere and knows nothing of /proc or read-only mounts.
Nothing is left behind: folders that do not exist yet are not created.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def check_output_dir(path: str | Path, flag: str) -> None:
    """ValueError naming `flag` unless `path` is, or can become, a folder we can write into."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder")
    _probe(_nearest_existing(p), path, flag)


def check_output_file(path: str | Path, flag: str) -> None:
    """ValueError naming `flag` unless a file can be written at `path` (its folder may not exist yet)."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder, not a file")
    if p.exists() and not p.is_file():  # /dev/full takes the probe and fails the write, after all the work
        raise ValueError(f"{flag} {path} is not a regular file (a device, pipe or socket); give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{flag} {path} cannot be overwritten")
    _probe(_nearest_existing(p.parent), path, flag)


def check_output_file_in(path: str | Path, flag: str, made: str | Path | None = None) -> None:
    """`check_output_file`, and the file's folder must exist already, or be `made` (a folder the command
    creates itself, such as the gate's --out root): a report written into a folder nobody made is a typo
    as often as not, and would otherwise be found out only when the command ends."""
    check_output_file(path, flag)
    folder = Path(path).absolute().parent
    if not folder.is_dir() and (made is None or folder != Path(made).absolute()):
        raise ValueError(f"{flag} {path}: folder {folder} does not exist; make it first")


def _nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists():
        p = p.parent
    return p


def _probe(folder: Path, path: str | Path, flag: str) -> None:
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: {folder} is a file, so no folder can be made below it")
    try:
        probe = tempfile.mkdtemp(prefix=".harness-probe-", dir=folder)
        os.rmdir(probe)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write in {folder} ({e.strerror or e})") from None
