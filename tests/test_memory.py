"""What the runtime keeps in memory once it is loaded: the weights once, in memory of their own, never the file
beside them; a vocabulary without a Python object per token; a KV cache resident only where positions were
written."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf_helpers import fixtures, gemma

from power.documents.arithmetic import ARITHMETICS
from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import SlotCaches
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk


def logits_after(trunk, tokens: list[int]) -> torch.Tensor:
    trunk.reset()
    return trunk.prefill(tokens).logits


@pytest.mark.parametrize("arithmetic", ARITHMETICS)
@pytest.mark.parametrize("name", ["gemma", "dense-target", "hybrid-target"])
def test_a_built_trunk_keeps_no_view_of_the_file(name, arithmetic):
    """After `release()` the verified copy is freed (nothing built from it still points into it), and the trunk
    computes the same logits as before."""
    model = GGUFFile(gemma() if name == "gemma" else fixtures()[name])
    trunk = load_trunk(model, n_ctx=64, verify_capacity=4, arithmetic=arithmetic)
    tokens = [2, 818, 5279, 529] if name == "gemma" else [1, 5, 9, 3]
    before = logits_after(trunk, tokens)
    assert model.held_bytes == model.size
    model.release()
    assert model.held_bytes == 0
    assert torch.equal(logits_after(trunk, tokens), before)
    with pytest.raises(RuntimeError, match="after the file's bytes were released"):
        model.raw("token_embd.weight")


def test_release_drops_the_headers_long_arrays_and_keeps_its_values():
    model = GGUFFile(gemma())
    assert len(model.get("tokenizer.ggml.tokens")) == 262_144
    model.release()
    assert model.get("tokenizer.ggml.tokens") is None and model.get("tokenizer.ggml.scores") is None
    assert model.get("gemma3.block_count") == 18 and model.architecture == "gemma3"


def test_serving_on_the_cpu_never_loads_triton():
    """The Triton kernels are imported on first use, which a CPU run never makes: importing Triton costs about 70
    MiB of resident memory (its compiler library alone)."""
    probe = ("import sys\n"
             "from power.app.cli import main\n"
             "try:\n"
             f"    main(['run', '--gguf', {str(fixtures()['dense-target'])!r}, '--prompt', 'The', '--max-tokens', '3'])\n"
             "except SystemExit as end:\n"
             "    assert not end.code, end.code\n"
             "print('triton loaded:', 'triton' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "triton loaded: False" in done.stdout


def test_the_tokenizer_keeps_no_python_object_per_token():
    """Gemma's 262,144 pieces as a blob, offsets and an index: the tokenizer holds a few thousand Python objects
    (its verbatim pieces), not one or more per token; the header's lists go with the file's release."""
    model = GGUFFile(gemma())
    tokenizer = Tokenizer.from_gguf(model)
    model.release()
    assert tokenizer.encode("The capital") == [2, 818, 5279] and tokenizer.token_text(5279) == "▁capital"
    gc.collect()
    with_tokenizer = sys.getallocatedblocks()
    del tokenizer
    gc.collect()
    assert with_tokenizer - sys.getallocatedblocks() < 50_000


def resident_bytes(tensor: torch.Tensor) -> int:
    """The resident bytes of the memory mapping that holds `tensor` (/proc/self/smaps)."""
    address = tensor.data_ptr()
    return next(rss for (start, end), rss in mappings() if start <= address < end)


def mappings() -> list[tuple[tuple[int, int], int]]:
    """Every mapping of this process: its address range and resident bytes."""
    found: list[tuple[tuple[int, int], int]] = []
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                start, end = (int(part, 16) for part in fields[0].split("-"))
            elif fields[0] == "Rss:":
                found.append(((start, end), int(fields[1]) * 1024))
    return found


def test_trimming_returns_freed_heap_pages():
    """Small tensors freed below a live one stay resident in the C heap until `heap.trim()` gives them back. In a
    fresh interpreter: the heap of a process that ran other tests may hold the freed pages in another arena."""
    child = f"""
import gc, sys
import torch
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_memory import resident_bytes
from power.runtime import heap
freed = [torch.ones(16_384) for _ in range(400)]  # 64 KiB each: heap allocations, 25 MiB in all
kept = torch.ones(16_384)
del freed
gc.collect()
before = resident_bytes(kept)
heap.trim()
print(before - resident_bytes(kept), float(kept.sum()))
"""
    returned, total = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                     check=True).stdout.split()
    assert int(returned) >= 16 << 20 and float(total) == 16_384


def test_a_cache_becomes_resident_only_where_it_is_written():
    cache = SlotCaches(1, 1, 16_384, 256, 256)[0]  # one slot: 16 MiB for K
    assert cache.k.nbytes == 16 << 20 and torch.count_nonzero(cache.k[:, :64]) == 0
    written = torch.ones(10, 1, 256)
    cache.write(0, written, written)
    # 10 positions of 1 KiB (a huge page at most, where the kernel gives them for anonymous memory)
    assert resident_bytes(cache.k) <= 2 << 20
    assert torch.equal(cache.k[0, :10], torch.ones(10, 256)) and torch.count_nonzero(cache.k[:, 10:]) == 0
