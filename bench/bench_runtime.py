"""Runtime benchmark: Power's prefill and plain decode tok/s on this machine, beside llama.cpp on the same GGUF.

    python bench/bench_runtime.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--threads 2] [--json out.json]

Runs, in one process and one sitting, greedy prefill + decode of the same prompt with:
- Power at each (dtype, verification capacity) given by --configs (capacity 1 is
  the cheapest plain decode; a larger capacity shows the fixed-shape cost every
  speculative plan pays on its plain rounds);
- llama.cpp through `llama-cpp-python`, when it is installed. It is a benchmark-only
  dependency, never a runtime one: `pip install llama-cpp-python` (builds from
  source, ~10-40 minutes on 2 cores; `CMAKE_ARGS="-DGGML_NATIVE=ON"` targets this CPU).

Reports tok/s, the ratio to llama.cpp, the weight bytes each decode step reads and
the achieved bandwidth (bytes x tok/s), and whether the greedy tokens agree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from power.runtime.gguf_weights import GGUFFile
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
PROMPT = ("Speculative decoding drafts a few tokens and the target verifies them in one pass. "
          "The capital of France is Paris, and the capital of Italy is Rome. ")


@dataclass
class Result:
    engine: str
    prefill_tok_s: float
    decode_tok_s: float
    bytes_per_step: int
    tokens: list[int]

    @property
    def bandwidth_gb_s(self) -> float:
        return self.bytes_per_step * self.decode_tok_s / 1e9


def power_run(gguf: GGUFFile, prompt: list[int], decode: int, dtype: str, capacity: int) -> Result:
    trunk = load_trunk(gguf, n_ctx=len(prompt) + decode + 1, verify_capacity=capacity, dtype=dtype)
    trunk.prefill(prompt[:8])  # warm-up: first-call allocations
    trunk.reset()
    started = time.perf_counter()
    token = int(trunk.prefill(prompt).logits[-1].argmax())
    prefill_s = time.perf_counter() - started
    tokens = [token]
    started = time.perf_counter()
    for _ in range(decode - 1):
        token = int(trunk.forward([token]).logits[0].argmax())
        tokens.append(token)
    decode_s = time.perf_counter() - started
    return Result(f"power {dtype} B{capacity}", len(prompt) / prefill_s, (decode - 1) / decode_s,
                  _power_bytes_per_step(trunk), tokens)


def _power_bytes_per_step(trunk) -> int:
    """Every matrix a decode step multiplies by (the layers' and the LM head's), at its stored dtype."""
    matrices = [t for layer in trunk.layers for t in vars(layer).values() if isinstance(t, torch.Tensor) and t.dim() == 2]
    matrices.append(trunk.lm_head)
    return sum(t.numel() * t.element_size() for t in matrices)


def llama_cpp_run(path: Path, prompt: list[int], decode: int, threads: int) -> Result | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed: `pip install llama-cpp-python` to compare (benchmark only)",
              file=sys.stderr)
        return None
    llm = Llama(model_path=str(path), n_ctx=len(prompt) + decode + 8, n_threads=threads, n_batch=512, verbose=False)
    llm.eval(prompt[:8])  # warm-up
    llm.reset()
    started = time.perf_counter()
    llm.eval(prompt)
    prefill_s = time.perf_counter() - started
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    tokens = [token]
    started = time.perf_counter()
    for _ in range(decode - 1):
        llm.eval([token])
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        tokens.append(token)
    decode_s = time.perf_counter() - started
    weight_bytes = sum(info.nbytes for info in GGUFFile(path).tensors.values())
    return Result("llama.cpp", len(prompt) / prefill_s, (decode - 1) / decode_s, weight_bytes, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--configs", default="float32:1,bfloat16:1,bfloat16:8",
                        help="comma-separated dtype:capacity pairs for Power")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    gguf = GGUFFile(args.gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    text = PROMPT * (1 + args.prompt_tokens // len(tokenizer.encode(PROMPT)))
    prompt = tokenizer.encode(text)[: args.prompt_tokens]

    results = []
    reference = llama_cpp_run(args.gguf, prompt, args.decode_tokens, args.threads)
    for config in args.configs.split(","):
        dtype, capacity = config.split(":")
        results.append(power_run(gguf, prompt, args.decode_tokens, dtype, int(capacity)))
    if reference:
        results.append(reference)
    _report(results, reference, args)


def _report(results: list[Result], reference: Result | None, args) -> None:
    print(f"{args.gguf.name}: {args.prompt_tokens} prompt tokens, {args.decode_tokens} decoded, "
          f"{args.threads} threads, torch {torch.__version__}")
    print(f"{'engine':<22}{'prefill tok/s':>14}{'decode tok/s':>14}{'x llama.cpp':>13}{'MB/step':>10}{'GB/s':>8}  greedy agrees")
    rows = []
    for r in results:
        ratio = r.decode_tok_s / reference.decode_tok_s if reference else None
        agree = _agreement(r.tokens, reference.tokens) if reference else None
        print(f"{r.engine:<22}{r.prefill_tok_s:>14.1f}{r.decode_tok_s:>14.2f}{(f'{ratio:.2f}' if ratio else '-'):>13}"
              f"{r.bytes_per_step / 1e6:>10.0f}{r.bandwidth_gb_s:>8.2f}  {agree if agree is not None else '-'}")
        rows.append(asdict(r) | {"bandwidth_gb_s": r.bandwidth_gb_s, "decode_vs_llama_cpp": ratio,
                                 "greedy_prefix_agreeing": agree})
    if args.json:
        args.json.write_text(json.dumps({"gguf": str(args.gguf), "threads": args.threads, "results": rows}, indent=2))


def _agreement(tokens: list[int], reference: list[int]) -> int:
    """How many leading greedy tokens agree with the reference."""
    count = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        count += 1
    return count


if __name__ == "__main__":
    main()
