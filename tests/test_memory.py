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

from power.artifacts.gguf_reader import ArtifactError
from power.documents.arithmetic import ARITHMETICS
from power.runtime.gguf_weights import GGUFFile
from power.runtime.kv_cache import SlotCaches
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]


def logits_after(trunk, tokens: list[int]) -> torch.Tensor:
    trunk.reset()
    return trunk.prefill(tokens).logits


@pytest.mark.parametrize("arithmetic", ARITHMETICS)
@pytest.mark.parametrize("name", ["gemma", "dense-target", "hybrid-target"])
def test_a_built_trunk_needs_nothing_of_the_file(name, arithmetic):
    """After `release()` the file is closed (nothing built reads it again), and the trunk computes the same logits."""
    model = GGUFFile(gemma() if name == "gemma" else fixtures()[name])
    trunk = load_trunk(model, n_ctx=64, verify_capacity=4, arithmetic=arithmetic)
    tokens = [2, 818, 5279, 529] if name == "gemma" else [1, 5, 9, 3]
    before = logits_after(trunk, tokens)
    model.release()
    assert torch.equal(logits_after(trunk, tokens), before)
    with pytest.raises(RuntimeError, match="after the file was released"):
        model.raw("token_embd.weight")


# VmHWM is this process's own peak (ru_maxrss keeps the parent's across fork and exec: pytest's own size).
PROBE = """
import sys
import torch
from power.runtime.gguf_weights import GGUFFile
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))
base = status("VmRSS")
model = GGUFFile(sys.argv[1])
print(status("VmHWM") - base)
"""


def test_opening_a_model_verifies_it_without_a_copy_of_the_file():
    """Issue 40.2: the runtime read the whole GGUF into memory to hash it, then built its weights beside that copy
    (22.9 GB for the 27B target before a weight was built). Opening now hashes the file and keeps only digests."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(gemma())], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) < gemma().stat().st_size // 2  # the header and its arrays (main: the whole file)


def test_a_tensor_changed_after_the_file_was_verified_never_reaches_the_engine(tmp_path):
    """The bytes copied into place are checked against the verifying read's digest of that tensor (PWR116)."""
    path = tmp_path / "dense-target.gguf"
    path.write_bytes(fixtures()["dense-target"].read_bytes())
    model = GGUFFile(path)
    name = next(iter(model.tensors))
    untouched = model.raw(name)
    info = model.info(name)
    with path.open("r+b") as handle:
        handle.seek(info.offset)
        handle.write(bytes([untouched[0].item() ^ 0xFF]))
    with pytest.raises(ArtifactError) as changed:
        model.raw(name)
    assert changed.value.finding.code == "PWR116" and name in changed.value.finding.message


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
             f"    main(['run', '--gguf', {str(fixtures()['dense-target'])!r}, '--prompt', 'The', "
             "'--max-tokens', '3'])\nexcept SystemExit as end:\n"
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


LIMITED_RUN = """
import resource, sys
from power.app.cli import main
import power.runtime.engine
vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[2]), resource.RLIM_INFINITY))
main(["run", "--gguf", sys.argv[1], "--prompt", "The", "--max-tokens", "2"])
"""


def limited_run(path: Path, room: int) -> subprocess.CompletedProcess:
    """`power run --gguf PATH` in a process that may map only `room` more bytes (`ulimit -v`) once Power is imported."""
    return subprocess.run([sys.executable, "-c", LIMITED_RUN, str(path), str(room)], capture_output=True, text=True,
                          timeout=300)


def test_a_header_only_model_is_refused_as_such_before_anything_is_read():
    """Issue 40.2: `power bench --engine power` on the 27B header-only fixtures (22.9 GB of holes) was OOM-killed
    after a minute with no message. It is refused at once, in little memory, naming what the file lacks."""
    done = limited_run(fixtures()["qwen36-27b-q6k"], 2 << 30)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "PWR650" in done.stderr and "holds no tensor data" in done.stderr and "Traceback" not in done.stderr


def test_a_model_the_host_cannot_hold_is_refused_before_loading_with_both_figures():
    """Gemma's 235 MiB of tensors under a 160 MiB allowance: refused (PWR520) before a tensor is read."""
    done = limited_run(gemma(), 160 << 20)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "PWR520" in done.stderr and "at least 235.2 MiB" in done.stderr and "ulimit -v room" in done.stderr


LIMITED_PLAN = """
import resource, sys
from power.app.cli import main
import power.app.commands.plan
if sys.argv[1] != "unlimited":
    vm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[1]), resource.RLIM_INFINITY))
main(["plan", "manifests/gemma3-270m.toml", "profiles/ngram.toml", "--device", "24 GiB"])
"""


@pytest.mark.parametrize("room, verdict", [
    ("unlimited", ": fits"),
    (str(160 << 20), ": does not fit: `power run`, `serve` and `bench` on this host's CPU refuse it "
                     "before loading (PWR520)"),
])
def test_the_plan_judges_this_hosts_memory_with_the_runtimes_figures(room, verdict):
    """Issue 40.2: the plan's host-memory section said "no verdict" where the runtime refuses at load (PWR520). The
    plan now says, for the host it ran on, what the runtime holds against what this process can get: Gemma's 235.2
    MiB of tensors fit a host with room, not a 160 MiB allowance (`ulimit -v`, the figure PWR520 names)."""
    done = subprocess.run([sys.executable, "-c", LIMITED_PLAN, room], capture_output=True, text=True, timeout=300,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("  host memory on this host (")]
    assert "where `power plan` ran; the plan itself is portable): on the CPU the runtime holds at least 235.2 MiB of " \
           "weights (gemma-3-270m-q4_k_m.gguf 235.2 MiB); " in line
    assert line.endswith(verdict)
    assert ("ulimit -v room" in line) == (room != "unlimited")
