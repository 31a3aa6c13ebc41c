"""Repack a wheel without the parts a baseline never imports, so the peers' wheels fit the copies that carry
them to a GPU box with no package registry (scripts/stage_peers.sh).

    python3 scripts/slim_wheel.py IN.whl OUT_DIR --drop flashinfer/data/ --drop flashinfer/experimental/
    python3 scripts/slim_wheel.py IN.whl OUT_DIR --keep sglang/kernels/ops/attention/linear/

`--drop PREFIX` leaves out the files under PREFIX; `--keep PREFIX` keeps only the files under the prefixes
given (the `.dist-info` folder always stays: `importlib.metadata` reads the version from it, and the
adapters check it). The wheel's RECORD is rewritten for the files kept (sha256 and size of each), so pip
installs the slim wheel as the same distribution and version. Prints the sizes before and after.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(src: Path, out_dir: Path, drop: list[str], keep: list[str]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / src.name
    if dst.resolve() == src.resolve():
        raise SystemExit(f"{src}: write the slim wheel to another folder than the original's")
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        info_dir = next(n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info"))
        record = f"{info_dir}/RECORD"

        def wanted(name: str) -> bool:
            if name.startswith(info_dir + "/"):
                return name != record
            if any(name.startswith(p) for p in drop):
                return False
            return not keep or any(name.startswith(p) for p in keep)

        lines = []
        with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if info.is_dir() or not wanted(info.filename):
                    continue
                data = zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
                lines.append(_record_line(info.filename, data))
            zout.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    print(f"{src.name}: {src.stat().st_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.1f} MB "
          f"({len(lines)} files kept of {len(names)})", file=sys.stderr)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--drop", action="append", default=[], help="leave out files under this prefix")
    ap.add_argument("--keep", action="append", default=[], help="keep only files under these prefixes")
    args = ap.parse_args()
    slim(args.wheel, args.out_dir, args.drop, args.keep)


if __name__ == "__main__":
    main()
