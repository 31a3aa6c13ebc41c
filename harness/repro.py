"""The `repro` column: a `harness run` line that reruns one row's case, built from the CLI's own options.

The command line is generated from the parameters that `harness run <scenario>` declares, never from the
keys of an options dict: a key the CLI does not take cannot leak into the line, and an option added to
the CLI is reproduced without touching this file. Options equal to their CLI default are left out (the
line stays short and reads like what a person would type); options that choose where output goes
(`--out`, `--dump`, `--json`) are left out because they do not change the case. Paths are made absolute
so the line works from any directory, and a run that used the Triton interpreter on CPU says so with a
`TRITON_INTERPRET=1` prefix.

The CLI (harness/cli.py) reads its options off its own commands and hands a `Repro` to the runner: this
module and the runner never import the CLI, so the import graph has no circle through it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

# Where the output goes, not what runs: two runs that differ only here produce the same rows.
NOT_REPRODUCED = frozenset({"out", "dump", "as_json"})


class CliOption(NamedTuple):
    """One option of `harness run <scenario>` as the repro line needs it."""

    name: str  # the parameter name, which is the options-dict key
    flag: str  # `--history-len`
    default: Any
    is_flag: bool  # a switch without a value (`--json`)
    is_path: bool  # written absolute


@dataclass(frozen=True)
class Repro:
    """Builds repro lines from `options_of[scenario]`, the options of `harness run <scenario>` (plain data,
    so it crosses to the worker processes of a distributed run)."""

    options_of: Mapping[str, tuple[CliOption, ...]]

    def __call__(self, scenario: str, options: dict[str, Any]) -> str:
        """The `harness run` line that reruns the case described by `options` (CLI option names as keys)."""
        try:
            declared = self.options_of[scenario]
        except KeyError:
            raise ValueError(f"`harness run` has no scenario {scenario!r}") from None
        argv = ["harness", "run", scenario]
        for name, flag, default, is_flag, is_path in declared:
            value = options.get(name)
            if name in NOT_REPRODUCED or value is None or value == default:
                continue
            if is_flag:
                argv += [flag] if value else []
                continue
            argv += [flag, os.path.abspath(value) if is_path else str(value)]
        device = str(options.get("device") or "cpu")
        interpreted = os.environ.get("TRITON_INTERPRET") == "1" and not device.startswith("cuda")
        triton = any(b != "torch" for b in str(options.get("backend") or "torch").split(","))
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
