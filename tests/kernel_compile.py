"""Compile every Triton kernel for a Hopper GPU (sm_90) without one: Triton's own LLVM and ptxas, no driver.

Run as a script with TRITON_INTERPRET=0 (the kernels must be JIT functions, not
interpreted ones); prints one JSON line per kernel: {"kernel", "ok", "error"}.
The CPU test suite runs the kernels only through the interpreter, which accepts
some programs the GPU compiler rejects; this catches those here. Two more checks
read the output: a dequantiser's PTX must not fuse a multiply-add (bit-exactness
against gguf.quants needs `d * q - m` as a multiply then a subtract), and no
kernel may spill registers to the stack (`cuobjdump -res-usage`: STACK:0), the
static stand-in for a GPU timing this machine cannot take.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from power.kernels import argmax_triton as argmax  # noqa: E402
from power.kernels import (  # noqa: E402
    attention,
    attention_triton,
    dequant,
    dequant_triton,
    fr_argmax_triton,
    greedy_verify_triton,
    norm_triton,
    qmatmul,
    qmatmul_triton,
    rejection,
    rejection_triton,
)

HOPPER = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def specs():
    """(label, kernel, runtime argument types, constexpr values, compile options) as the launchers use them."""
    argmax_consts = {"CHUNK": argmax.CHUNK, "BLOCK": argmax.BLOCK, "NO_INDEX": argmax.NO_INDEX}
    partials = {"BLOCK_R": argmax.BLOCK_R, "BLOCK_C": argmax.BLOCK_C, "NO_INDEX": argmax.NO_INDEX}
    for dtype in ("fp32", "fp16", "bf16"):
        yield (f"partial_argmax {dtype}", argmax._partial_argmax_kernel,
               {"x_ptr": f"*{dtype}", "val_ptr": "*fp32", "idx_ptr": "*i64", "V": "i32", "n_chunks": "i32"},
               argmax_consts, {})
    yield ("argmax_of_partials", argmax._argmax_of_partials_kernel,
           {"val_ptr": "*fp32", "idx_ptr": "*i64", "out_ptr": "*i64", "R": "i32", "n_chunks": "i32"}, partials, {})
    yield ("greedy_verify accept", greedy_verify_triton._accept_kernel,
           {"val_ptr": "*fp32", "idx_ptr": "*i64", "proposals_ptr": "*i64", "out_ptr": "*i64", "K": "i32",
            "n_chunks": "i32"},
           {"BLOCK_R": 32, "BLOCK_C": argmax.BLOCK_C, "NO_INDEX": argmax.NO_INDEX}, {})
    shared = {"BLOCK_K": 16, "BLOCK_V": rejection_triton.BLOCK_V, "LANES": rejection.LANES, "ACCEPT": rejection.ACCEPT,
              "WEIGHT_SCALE": float(2**rejection.WEIGHT_BITS)}
    draw = {"BLOCK_B": rejection_triton.BLOCK_B, "SAMPLE": rejection.SAMPLE, "RESIDUAL": rejection.RESIDUAL,
            "UNIFORM_BITS": rejection.UNIFORM_BITS}
    for dtype in ("fp32", "fp64"):
        probs = {"p_ptr": f"*{dtype}", "q_ptr": f"*{dtype}", "proposals_ptr": "*i64", "u_ptr": "*fp64",
                 "sums_ptr": "*i64",
                 "K": "i32", "V": "i32", "n_blocks": "i32"}
        yield (f"rejection block sums {dtype}", rejection_triton._block_sums_kernel, probs, shared, {})
        yield (f"rejection draw {dtype}", rejection_triton._draw_kernel, probs | {"out_ptr": "*i64"}, shared | draw, {})
    for dtype in ("fp32", "bf16"):
        yield (f"fr_argmax {dtype}", fr_argmax_triton._fr_partial_kernel,
               {"h_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "val_ptr": "*fp32", "idx_ptr": "*i64", "M": "i32",
                "N": "i32",
                "D": "i32", "n_chunks": "i32"},
               {"CHUNK": argmax.CHUNK, "BLOCK_M": fr_argmax_triton.BLOCK_M, "BLOCK_V": fr_argmax_triton.BLOCK_V,
                "BLOCK_D": fr_argmax_triton.MAX_BLOCK_D, "NO_INDEX": argmax.NO_INDEX},
                {"num_warps": fr_argmax_triton.NUM_WARPS})
    for qtype, code in dequant.TRITON_TYPES.items():
        per_block = dequant.BLOCK_LAYOUT[qtype][0]
        yield (f"dequantize {qtype}", dequant_triton._dequant_kernel, {"raw_ptr": "*u8", "out_ptr": "*fp32",
                                                                       "n_blocks": "i64"},
               {"PER_BLOCK": per_block, "QTYPE": code, "BLOCKS": dequant_triton._TRITON_WEIGHTS // per_block},
               {"enable_fp_fusion": False})
    for qtype, (code, per_block) in qmatmul.CODES.items():
        yield (f"qmatmul {qtype}", qmatmul_triton._qmatmul_kernel,
               {"x_ptr": "*fp32", "w_ptr": "*u8", "y_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                "row_bytes": "i32"},
               {"PER_BLOCK": per_block, "QTYPE": code, "BLOCK_M": qmatmul.BLOCK_M, "BLOCK_N": qmatmul.BLOCK_N,
                "BLOCK_K": qmatmul.BLOCK_K}, {"enable_fp_fusion": False})
    # Gemma 3 270M's attention (4 query heads on 1 KV head, width 256), the fixtures' (2 on 1, width 16), and wide
    # heads: 8 query heads a KV head (6 pad to 8) at width 256 and 512.
    for group, width in ((4, 256), (2, 16), (8, 256), (8, 512)):
        tile = attention.tile(width)
        yield (f"attention G{group} d{width}", attention_triton._attention_kernel,
               {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "out_ptr": "*fp32", "slots_ptr": "*i64",
                "positions_ptr": "*i64", "capacity": "i32", "scale": "fp32", "window": "i32"},
               {"GROUP": group, "HEAD_K": width, "HEAD_V": width, "BLOCK_G": attention.tile(group), "BLOCK_DK": tile,
                "BLOCK_DV": tile, "BLOCK_N": attention.BLOCK_N}, {"num_warps": attention.warps(width)})
        if group > 4:
            continue
        yield (f"cache write d{width}", attention_triton._cache_write_kernel,
               {"k_ptr": "*fp32", "v_ptr": "*fp32", "k_cache_ptr": "*fp32", "v_cache_ptr": "*fp32", "slots_ptr": "*i64",
                "positions_ptr": "*i64", "capacity": "i32"},
               {"HEAD_K": width, "HEAD_V": width, "BLOCK_DK": width, "BLOCK_DV": width}, {})
    for width, has_weight in ((640, True), (256, True), (16, False)):
        yield (f"rms_norm d{width}{'' if has_weight else ' l2'}", norm_triton._rms_norm_kernel,
               {"x_ptr": "*fp32", "w_ptr": "*fp32", "y_ptr": "*fp32", "width": "i32", "weight_rows": "i32",
                "divisor": "fp32", "eps": "fp32"},
               {"HAS_WEIGHT": has_weight, "BLOCK": triton.next_power_of_2(width)}, {})


def compile_one(kernel, types: dict[str, str], constants: dict[str, object],
                options: dict[str, object]) -> dict[str, bytes | str]:
    """The kernel's assembly for sm_90: "ptx" and the ptxas-built "cubin"."""
    signature = dict(types) | {name: "constexpr" for name in constants}
    ordered = {name: signature[name] for name in kernel.arg_names}
    return triton.compile(ASTSource(kernel, ordered, constants), target=HOPPER, options=options).asm


def stack_bytes(cubin: bytes) -> int:
    """Per-thread stack (register spills) of the cubin's kernel, from `cuobjdump -res-usage`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([str(CUOBJDUMP), "-res-usage", file.name], capture_output=True, text=True,
                               check=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))


def finding(label: str, asm: dict[str, bytes | str]) -> str | None:
    if label.startswith("dequantize") and "fma.rn.f32" in asm["ptx"]:
        return "the PTX fuses a multiply-add: dequantised values would differ from gguf.quants"
    spilled = stack_bytes(asm["cubin"])
    return f"spills registers ({spilled} bytes of stack per thread): shrink its tile or add warps" if spilled else None


def main() -> int:
    failures = 0
    for label, kernel, types, constants, options in specs():
        try:
            error = finding(label, compile_one(kernel, types, constants, options))
        except Exception as err:  # any compiler error is the finding; report it and go on
            error = f"{type(err).__name__}: {err}"[:2000]
        failures += error is not None
        print(json.dumps({"kernel": label, "ok": error is None, "error": error}), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
