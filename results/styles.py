"""One colour and marker per mode variant, the same in every figure (run figures, drift, the notebook).

Every non-native variant used to be drawn in the same red with the same marker (a figure keyed colours
by the mode's first word, and `compact-accept` is no mode), so a reader could not tell the lines apart,
nor match a line in one figure to the same variant in the next. Here each variant SPEC §3 names has a
fixed colour and marker; a peer's kernel (fla, sglang, flashinfer) is a series of its own, and anything
else gets a colour and marker of its own from a spare palette, chosen from its name so that it too stays
the same across figures (`assign` moves one that collides with another in the same figure).
Grey is kept for references: bounds, goals, the 1.0x line.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

OUR_BACKENDS = ("torch", "triton")  # a row of these is drawn as its variant; a peer's as variant/peer
REFERENCE_GREY = "C7"


@dataclass(frozen=True)
class Style:
    color: str
    marker: str

    def kwargs(self) -> dict[str, str]:
        return {"color": self.color, "marker": self.marker}


# SPEC §3's variants (states.base.MODE_VARIANTS) and the bare modes of runs that predate variants.
FIXED: dict[str, Style] = {
    "native": Style("C0", "o"),
    "compact": Style("C1", "s"),
    "compact-accept": Style("C1", "s"),
    "compact-deferred": Style("C5", "D"),
    "replay": Style("C2", "^"),
    "replay-inline": Style("C2", "^"),
    "replay-precompute": Style("C4", "v"),
    "replay-precompute-tf32x3": Style("C9", "<"),
    "replay-precompute-bf16x3": Style("C8", ">"),
    "replay-precompute-bf16x6": Style("C6", "p"),
    "replay-precompute-tf32": Style("C3", "h"),
    # replay's matrix fold, per dot precision (greens, as replay's own)
    "replay-matrix": Style("#31a354", "H"),
    "replay-matrix-tf32x3": Style("#74c476", "H"),
    "replay-matrix-bf16x3": Style("#006d2c", "H"),
    "replay-matrix-bf16x6": Style("#a1d99b", "H"),
    # compact's verify in matrix form, per dot precision (orange-to-brown, as compact's own)
    "compact-accept-precompute": Style("#e6550d", "P"),
    "compact-accept-precompute-tf32x3": Style("#fdae6b", "X"),
    "compact-accept-precompute-bf16x3": Style("#843c39", "*"),
    "compact-accept-precompute-bf16x6": Style("#a55194", "d"),
    "compact-accept-precompute-tf32": Style("#ff9896", "8"),
    # the deferred commit with the matrix-form verify (deferred's purple family)
    "compact-deferred-precompute": Style("#756bb1", "D"),
    "compact-deferred-precompute-tf32x3": Style("#9e9ac8", "D"),
    "compact-deferred-precompute-bf16x3": Style("#54278f", "D"),
    "compact-deferred-precompute-bf16x6": Style("#bcbddc", "D"),
    "compact-deferred-precompute-tf32": Style("#dadaeb", "D"),
}
# Peers and anything unforeseen: colours and markers that no fixed variant uses.
_SPARE_COLOURS = ("#17becf", "#bcbd22", "#7b4173", "#637939", "#e7969c", "#393b79", "#8c6d31", "#d6616b",
                  "#31a354", "#3182bd", "#fd8d3c", "#756bb1")
_SPARE_MARKERS = ("*", "X", "P", "d", "8", "H", "o", "s", "^", "v")
MODE_COLOURS = {mode: FIXED[mode].color for mode in ("native", "compact", "replay")}


def key(mode: object, variant: object = None, backend: object = None) -> str:
    """What a series is, for its style: `compact-deferred`, or `native/sglang` for a peer's kernel."""
    name = _text(mode) or "-"
    if _text(variant):
        name = f"{name}-{_text(variant)}"
    peer = _text(backend)
    return f"{name}/{peer}" if peer and peer not in OUR_BACKENDS else name


def style(name: str) -> Style:
    """The style of series `name` (a `key`), the same in every figure."""
    if name in FIXED:
        return FIXED[name]
    h = zlib.crc32(name.encode())
    return Style(_SPARE_COLOURS[h % len(_SPARE_COLOURS)], _SPARE_MARKERS[(h // 7) % len(_SPARE_MARKERS)])


def assign(names: Iterable[str]) -> dict[str, Style]:
    """A distinct colour for each of `names` drawn in one figure: the fixed or named style, unless another
    series of the figure has its colour already (two spare names can hash alike), then a free one."""
    out: dict[str, Style] = {}
    taken: set[Style] = set()
    ordered = list(dict.fromkeys(names))
    for name in sorted(ordered, key=lambda n: n not in FIXED):  # the fixed ones keep theirs
        s = style(name)
        colours = {t.color for t in taken}
        if s.color in colours:  # a colour nobody in the figure has, else at least a pair nobody has
            spare = [Style(c, m) for m in _SPARE_MARKERS for c in _SPARE_COLOURS if Style(c, m) not in taken]
            s = next((x for x in spare if x.color not in colours), spare[0])
        taken.add(s)
        out[name] = s
    return {name: out[name] for name in ordered}


def _text(value: object) -> str:
    if value is None:
        return ""
    try:
        if value != value:  # NaN / pd.NA-like blanks
            return ""
    except TypeError:  # pd.NA refuses comparison
        return ""
    return str(value).strip()
