"""Build matplotlib's font cache in the background while a run does its real work.

On a fresh machine the first figure pays for matplotlib scanning every system font (about 20 s
measured on an H200 box), after the measurements are done. A run starts `prewarm()` first thing:
when no font cache exists yet, a separate process builds it on another core while the run computes,
and `wait()` (before the figures) joins it. With a cache present it costs one directory listing.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys


def prewarm() -> subprocess.Popen | None:
    """Start building the font cache in a child process when there is none; None when there is."""
    import matplotlib  # light: the font manager (the slow part) is not imported here

    if glob.glob(os.path.join(matplotlib.get_cachedir(), "fontlist-v*.json")):
        return None
    return subprocess.Popen([sys.executable, "-c", "import matplotlib.font_manager"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait(child: subprocess.Popen | None, timeout: float = 120.0) -> None:
    """Let the warm-up finish (the figures would otherwise build the same cache again)."""
    if child is None:
        return
    try:
        child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
