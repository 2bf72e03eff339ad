"""What the side-by-side benches share: llama-server built for this CPU, and the instruction paths both engines run.

The speed comparisons run llama-server as `scripts/build-llama-server --native`
builds it (AVX-512/VNNI/BF16 where /proc/cpuinfo has them; the conformance tests
keep the portable AVX2 build); `--portable` in a bench takes the portable one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def llama_server_binary(native: bool = True) -> str | None:
    """The cached (or freshly built) llama-server; None, with the reason on stderr, when it cannot be built."""
    command = [str(REPO / "scripts" / "build-llama-server"), *(["--native"] if native else [])]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        print(f"llama-server: {' '.join(command)} failed (exit {built.returncode}); measuring Power alone\n"
              f"{built.stderr[-2000:]}", file=sys.stderr)
        return None
    return built.stdout.strip().splitlines()[-1]


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            text = cpuinfo.read()
    except OSError:
        return []
    present = set(text.split())
    return [flag for flag in FLAGS if flag in present]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def instruction_paths(binary: str | None) -> dict[str, str]:
    """The CPU, Power's matmul paths and llama-server's build flags, for the bench output."""
    import torch  # here, not at the top: bench/bench_memory.py reads resident memory before torch is imported

    from power.kernels.cpu import available_paths, chosen_path

    paths = {
        "cpu": f"{cpu_name()} ({', '.join(cpu_flags()) or 'no x86 vector flags read'})",
        "power": f"torch {torch.__version__}; quantised products on the {chosen_path()} path "
                 f"(this CPU offers {', '.join(available_paths())})",
    }
    info = Path(binary).parent.parent / "build-info.txt" if binary else None
    if info and info.is_file():
        fields = dict(line.split("=", 1) for line in info.read_text().splitlines() if "=" in line)
        on = [flag.removeprefix("-DGGML_").removesuffix("=ON") for flag in fields.get("cmake_cpu_flags", "").split()
              if flag.endswith("=ON")]
        paths["llama-server"] = (
            f"{fields.get('cache_key', fields.get('llama_cpp_python_version', '?'))}: {' '.join(on)}"
        )
    elif binary:
        paths["llama-server"] = binary
    return paths


def resident_mib(pid: int | str = "self") -> float:
    """VmRSS of a process in MiB (0 when it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def layer_matrices(layer: Any, of: type | None = None) -> dict[str, Any]:
    """The packed matrices (`power.runtime.linear.Linear`, or what stands in their place: `of`) one trunk layer
    multiplies by, by field name: a Gemma 3 layer keeps them in its frozen `weights` record, other layers as their
    own attributes."""
    from power.runtime.linear import Linear

    owner = getattr(layer, "weights", layer)
    return {name: value for name, value in vars(owner).items() if isinstance(value, of or Linear)}


def with_layer_matrices(layer: Any, matrices: dict[str, Any]) -> None:
    """Put `matrices` (field name -> callable) in the layer's place for them (a frozen record is replaced whole)."""
    owner = getattr(layer, "weights", None)
    if owner is not None and dataclasses.is_dataclass(owner):
        layer.weights = dataclasses.replace(owner, **matrices)
        return
    for name, matrix in matrices.items():
        setattr(layer, name, matrix)


@contextlib.contextmanager
def contention(busy: int) -> Iterator[None]:
    """`busy` processes that each keep a core busy (a spinning Python loop) while the block runs: the other
    work of a shared host or a noisy neighbour. 0: none."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
