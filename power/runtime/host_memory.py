"""Whether this host can hold what the runtime is about to load: asked before a byte of tensor data is read.

The runtime on the CPU keeps every artifact's tensors in host memory, each in its
resident layout (GGUF blocks in the kernels' tiles, or dequantised to float32),
never less than the tensor bytes the headers declare. When those bytes exceed
what this process can still get, loading would end in the kernel's OOM killer
minutes later with no message; it is refused first (PWR520) with both figures.

What the process can still get: `power.runtime.host_room`, which `power plan` asks too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from power.artifacts.gguf_reader import open_regular_file, read_open_header
from power.artifacts.verify import Artifact, present
from power.runtime.errors import RuntimeInputError
from power.runtime.gguf_weights import require_tensor_data
from power.runtime.host_room import mib, room_for


def require_room(artifacts: Sequence[Artifact]) -> None:
    """Refuse an artifact without tensor data (PWR650), then (PWR520) artifacts whose tensor bytes exceed the memory
    this process can still get."""
    for artifact in artifacts:
        present(artifact)
    tensors = {artifact.path: _tensor_bytes(artifact.path) for artifact in artifacts}
    room = room_for(sum(tensors.values()))
    if room.fits:
        return
    parts = ", ".join(f"{path.name} {mib(size)}" for path, size in tensors.items())
    raise RuntimeInputError(
        f"the runtime would hold at least {mib(room.needed)} of weights in host memory ({parts}), and {room.figures()}",
        code="PWR520",
        file=str(artifacts[0].path),
        hint="run on a host with more free memory or a GPU (--device cuda), "
        "or plan a smaller quantisation of the model",
    )


def _tensor_bytes(path: Path) -> int:
    fd, opened = open_regular_file(path)
    try:
        header = read_open_header(fd, opened.st_size, str(path))
        require_tensor_data(fd, header)
    finally:
        os.close(fd)
    return sum(t.nbytes for t in header.tensors)
