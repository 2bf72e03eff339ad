"""Shared by the artifact tests: the bundled Gemma file, the factory's fixtures (built once per
run), hand-made headers."""

from __future__ import annotations

import atexit
import shutil
import struct
import tempfile
from functools import lru_cache
from pathlib import Path

from power.artifacts.bundled import ensure_gemma
from power.artifacts.factory import build_fixtures

REPO = Path(__file__).resolve().parents[1]
# Fixtures with tensor data (the header-only ones are sparse files of real sizes).
RUNNABLE = ("dense-target", "hybrid-target", "gemma3-target", "gemma3-mtp-sidecar", "dflash-drafter", "dflash2-drafter",
            "dspark-drafter",
            "dflash-named-dspark", "dflash-drafter-other-tokenizer")
HEADER_ONLY = ("qwen36-27b-q6k", "qwen36-27b-dflash", "qwen36-27b-dflash2", "qwen36-27b-dspark")


@lru_cache(maxsize=1)
def gemma() -> Path:
    return ensure_gemma(REPO / "models")


@lru_cache(maxsize=1)
def fixtures() -> dict[str, Path]:
    directory = Path(tempfile.mkdtemp(prefix="power-fixtures-"))
    atexit.register(shutil.rmtree, directory, True)
    return build_fixtures(directory)


def gguf_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", 4, value)


def kv_string(key: str, value: str) -> bytes:
    return gguf_string(key) + struct.pack("<I", 8) + gguf_string(value)


def tensor_info(name: str, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return (
        gguf_string(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def header(kvs: list[bytes], tensors: list[bytes], *, version: int = 3, magic: bytes = b"GGUF",
           n_tensors: int | None = None, n_kv: int | None = None) -> bytes:
    """A hand-made GGUF header (no padding, no data): counts default to the lists' lengths."""
    counts = struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    return magic + struct.pack("<I", version) + counts + b"".join(kvs) + b"".join(tensors)


def with_data(head: bytes, data_bytes: int, alignment: int = 32) -> bytes:
    """The header padded to the alignment, then `data_bytes` of zeros."""
    return head + b"\0" * (-len(head) % alignment) + b"\0" * data_bytes


def assert_rows_match_alone(model, rows: list[int], taps: tuple[int, ...]) -> None:
    """From the model's current state: every n-row forward of `rows[:n]` (n >= 2) gives row j the logits and hidden
    taps of token j forwarded alone after the same prefix (the trunk runs real rows by arithmetic, not padding)."""
    import torch

    start = model.checkpoint()
    alone = [model.forward([token], taps=taps) for token in rows]
    for n in range(2, len(rows) + 1):
        model.restore(start)
        together = model.forward(rows[:n], taps=taps)
        for j in range(n):
            assert torch.equal(together.logits[j], alone[j].logits[0]), f"row {j} of {n} differs from its lone forward"
            for layer in taps:
                assert torch.equal(together.hidden[layer][j], alone[j].hidden[layer][0])
