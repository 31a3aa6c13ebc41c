"""The `repro` column: a `harness run` line that reruns one row's case, built from the CLI itself.

The command line is generated from the parameters that `harness run <scenario>` declares (harness/cli.py),
never from the keys of an options dict: a key the CLI does not take cannot leak into the line, and an
option added to the CLI is reproduced without touching this file. Options equal to their CLI default
are left out (the line stays short and reads like what a person would type); options that choose
where output goes (`--out`, `--dump`, `--json`) are left out because they do not change the case.
Paths are made absolute so the line works from any directory, and a run that used the Triton
interpreter on CPU says so with a `TRITON_INTERPRET=1` prefix.
"""

from __future__ import annotations

import functools
import os
import shlex
from pathlib import Path
from typing import Any

# Where the output goes, not what runs: two runs that differ only here produce the same rows.
NOT_REPRODUCED = frozenset({"out", "dump", "as_json"})


@functools.lru_cache(maxsize=None)
def cli_options(scenario: str) -> tuple[tuple[str, str, Any, bool, bool], ...]:
    """`(name, flag, default, is_flag, is_path)` of every option of `harness run <scenario>`."""
    import typer.main

    from harness.cli import app  # imported here: the CLI imports the runner, which imports this module

    group = typer.main.get_command(app)
    try:
        command = group.commands["run"].commands[scenario]
    except KeyError:
        raise ValueError(f"`harness run` has no scenario {scenario!r}") from None
    out = []
    for p in command.params:
        if p.param_type_name != "option":
            continue
        annotation = getattr(getattr(p, "type_descriptor", None), "annotation", None)
        out.append((p.name, p.opts[0], p.default, bool(p.is_flag), annotation is Path))
    return tuple(out)


def repro_command(scenario: str, options: dict[str, Any]) -> str:
    """The `harness run` line that reruns the case described by `options` (CLI option names as keys)."""
    argv = ["harness", "run", scenario]
    for name, flag, default, is_flag, is_path in cli_options(scenario):
        value = options.get(name)
        if name in NOT_REPRODUCED or value is None or value == default:
            continue
        if is_flag:
            argv += [flag] if value else []
            continue
        argv += [flag, os.path.abspath(value) if is_path else str(value)]
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and not str(options.get("device") or "cpu").startswith("cuda")
    triton = any(b in str(options.get("backend") or "") for b in ("triton", "fla"))
    prefix = "TRITON_INTERPRET=1 " if interpreted and triton else ""
    return prefix + shlex.join(argv)


def repro_argv(line: str) -> list[str]:
    """The arguments after `harness` of a repro line (environment prefixes dropped), e.g. for CliRunner."""
    words = shlex.split(line)
    while words and "=" in words[0] and not words[0].startswith("-"):
        words.pop(0)
    if words[:1] != ["harness"]:
        raise ValueError(f"not a harness command line: {line!r}")
    return words[1:]
