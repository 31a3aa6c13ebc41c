"""Importing one kernel module of a peer without importing the peer's whole package.

SGLang's package import pulls in its server stack (and its kernel file imports two helper names from
modules that do); FlashInfer's package `__init__` imports every op it has (JIT, comm, MoE, ...). The
kernels the baselines call need none of that, so:

* `load_file` executes one source file of an installed distribution as a private module, with the
  helper modules it imports supplied (`provide`) only for the duration of that import: nothing is left
  in `sys.modules` under the peer's names, so a later real import of the peer is unaffected;
* `load_submodule` imports `package.sub` through a hollow `package` (a module object with `__path__` set
  to the installed folder, its `__init__` never run), so relative imports inside the package resolve
  to the real files.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

from kernels.ssm.baselines.base import PeerUnavailable

_PREFIX = "_ssm_harness_peer"  # the private package the loaded files live under


def load_file(path: str, name: str, provide: dict[str, dict[str, Any]] | None = None) -> types.ModuleType:
    """Execute the source file `path` as module `_ssm_harness_peer.<name>` (cached), with the modules in
    `provide` (module name -> its attributes) visible to its imports while it runs."""
    full = f"{_PREFIX}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if _PREFIX not in sys.modules:
        sys.modules[_PREFIX] = types.ModuleType(_PREFIX)
    spec = importlib.util.spec_from_file_location(full, path)
    if spec is None or spec.loader is None:
        raise PeerUnavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    saved = {m: sys.modules.get(m) for m in (provide or {})}
    try:
        for m, attrs in (provide or {}).items():
            stub = types.ModuleType(m)
            stub.__dict__.update(attrs)
            sys.modules[m] = stub
        sys.modules[full] = module  # Triton's JIT reads the source through the module's file
        spec.loader.exec_module(module)
    except ImportError as e:
        sys.modules.pop(full, None)
        raise PeerUnavailable(f"{Path(path).name} does not import here: {e}") from e
    finally:
        for m, old in saved.items():
            if old is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = old
    return module


def load_submodule(package: str, folder: str, sub: str) -> types.ModuleType:
    """`import package.sub` with `package`'s `__init__` not run (unless the package is imported already)."""
    if package not in sys.modules:
        hollow = types.ModuleType(package)
        hollow.__path__ = [folder]  # a package: its submodules resolve to the installed files
        hollow.__file__ = str(Path(folder) / "__init__.py")
        sys.modules[package] = hollow
    try:
        return importlib.import_module(f"{package}.{sub}")
    except Exception as e:  # noqa: BLE001 - any import-time failure (a missing dependency, no GPU) is the reason
        raise PeerUnavailable(f"{package}.{sub} does not import here: {type(e).__name__}: {e}") from e
