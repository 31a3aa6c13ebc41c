"""scripts/sass_stats.py's per-source-line table: instructions go to the line marker above them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from sass_stats import count_by_line  # noqa: E402

DISASSEMBLY = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	//## File "/src/kernels/ssm/replay_precompute.py", line 140
        /*0010*/                   LDG.E R4, desc[UR14][R4.64] ;
        /*0020*/              @!P0 FADD R28, R25, R28 ;
	//## File "/venv/triton/language/standard.py", line 263
        /*0030*/                   FADD R28, R25, R28 ;
	//## File "/src/kernels/ssm/replay_precompute.py", line 140
        /*0040*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
"""


def test_instructions_are_counted_on_the_line_above_them():
    table = count_by_line(DISASSEMBLY)
    assert dict(table[("?", 0)]) == {"LDC": 1}
    assert dict(table[("replay_precompute.py", 140)]) == {"LDG": 1, "FADD": 1, "HMMA": 1}  # predicated FADD too
    assert dict(table[("standard.py", 263)]) == {"FADD": 1}
    assert sum(sum(c.values()) for c in table.values()) == 5
