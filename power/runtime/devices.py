"""The --device a command asks for, read before torch is imported.

A run that asks for CUDA where there can be none is refused here, in milliseconds, rather than after torch's import
(seconds): when the installed torch was built without CUDA (its `torch/version.py`, read without importing torch),
or when no NVIDIA driver library can be loaded. Where neither says no, torch decides after its import
(`power.runtime.engine.resolve_device`): this check only refuses what is certain, it never admits a device.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from pathlib import Path

from power.runtime.errors import RuntimeInputError

CHOICES = "auto, cpu, cuda or cuda:N"
NO_CUDA_HINT = "use a CUDA build of torch on a machine with that GPU, or --device cpu"
DRIVER_LIBRARY = "libcuda.so.1"  # the NVIDIA driver's CUDA library, which every CUDA build of torch loads


def cuda_index(device: str) -> int | None:
    """The CUDA device index `device` names (cuda -> 0), None for auto and cpu; PWR601 for any other name."""
    if device in ("auto", "cpu"):
        return None
    cuda = re.fullmatch(r"cuda(?::(\d+))?", device)
    if not cuda:
        raise RuntimeInputError(f"device {device!r} is not supported", code="PWR601", hint=f"choose {CHOICES}")
    return int(cuda.group(1) or 0)


def refuse_absent_device(device: str) -> None:
    """PWR601 when `device` names CUDA on a host where it certainly cannot run; nothing is imported but the standard
    library."""
    if cuda_index(device) is None:
        return
    absent = _absence(_torch_build())
    if absent:
        raise RuntimeInputError(f"device {device!r}: {absent}", code="PWR601", hint=NO_CUDA_HINT)


def _absence(build) -> str | None:
    """Why CUDA cannot run under this torch build, or None where torch must be asked (a ROCm build's devices are
    torch's CUDA devices too, with no NVIDIA driver)."""
    if build is None or getattr(build, "hip", None):
        return None
    if not getattr(build, "cuda", None):
        return f"the installed torch ({getattr(build, '__version__', 'of unknown version')}) is built without CUDA"
    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return f"no NVIDIA driver is installed here ({DRIVER_LIBRARY} does not load)"
    return None


def _torch_build():
    """torch's version.py run alone (it imports only `typing`), not as part of the torch package; None without torch
    (the runtime's import reports that)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    loader_spec = importlib.util.spec_from_file_location("power_torch_build", path)
    if not path.is_file() or loader_spec is None or loader_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return module
