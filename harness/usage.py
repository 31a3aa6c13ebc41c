"""Usage errors in one line, like every other bad input of the CLI (`error: ...`, exit code 2).

Click reports a parse error (`--rounds abc`, `--no-such-option`) as the usage line, a hint and the
error: three lines a log reader has to piece together. The CLI's top group (`OneLineUsage`, given to
`typer.Typer(cls=...)`) turns every usage error raised below it into one line that still says where
the help is. A bare `harness` or `harness run` still prints its help.
"""

from __future__ import annotations

from typing import IO, Any

import typer
from typer.core import TyperGroup

_click = typer.core._click  # typer vendors click; its exception classes live here


class _OneLine(_click.exceptions.ClickException):
    exit_code = 2

    def __init__(self, error: Any) -> None:
        super().__init__(error.format_message())
        self.command = error.ctx.command_path if error.ctx is not None else "harness"

    def show(self, file: IO[Any] | None = None) -> None:
        typer.echo(f"error: {self.message} (see {self.command} --help)", err=True)


class OneLineUsage(TyperGroup):
    """The top group of the CLI, with one-line usage errors."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        return _one_line(lambda: super(OneLineUsage, self).make_context(*args, **kwargs))

    def invoke(self, ctx: Any) -> Any:
        return _one_line(lambda: super(OneLineUsage, self).invoke(ctx))


def _one_line(fn: Any) -> Any:
    try:
        return fn()
    except _click.exceptions.NoArgsIsHelpError:
        raise  # a bare command: its help, as asked
    except _click.exceptions.NoSuchOption as e:
        e.possibilities = close_options(e.option_name, e.possibilities or [])
        raise _OneLine(e) from None
    except _click.exceptions.UsageError as e:
        raise _OneLine(e) from None


def close_options(given: str, options: list[str]) -> list[str]:
    """The options worth suggesting for a mistyped `given`. Click compares whole option strings, so the
    shared `--` alone made `--foo` look like `--out`; compared without it, only real near misses stay
    (`--round` -> `--rounds`)."""
    import difflib

    bare = {o.lstrip("-"): o for o in options}
    return [bare[m] for m in difflib.get_close_matches(given.lstrip("-"), list(bare), n=3, cutoff=0.6)]
