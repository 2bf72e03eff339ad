"""Runtime benchmark: Power's prefill and plain decode tok/s on this machine, beside llama.cpp on the same GGUF.

    python bench/bench_runtime.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--threads 2] [--json out.json]

Every engine is loaded first; then prefill and decode are measured interleaved,
round-robin in small slices (the A/B protocol's pairing), so load from other
processes on a shared machine lands on all engines alike and the ratios hold
even when the absolute figures move. Engines:
- Power at each `arithmetic:capacity` of --configs (power.documents.arithmetic),
  named with the instruction path its products take: the quantised arithmetic
  runs a plain decode on one row whatever the capacity; the float32 reference
  pads every step to the capacity;
- llama.cpp through `llama-cpp-python`, when installed. It is a benchmark-only
  dependency, never a runtime one: `pip install llama-cpp-python` (builds from
  source, 10-40 minutes on 2 cores; `CMAKE_ARGS="-DGGML_NATIVE=ON"` targets this CPU).

Reports tok/s, the ratio to llama.cpp, the weight bytes one decode step reads,
the achieved bandwidth (bytes x tok/s), and how many leading greedy tokens agree
with llama.cpp (it quantises activations, so a near-tie can flip a token).

`--accuracy` then scores every engine's logits against Power in float32 (the
exactly dequantised weights), teacher-forced over the prompt and llama.cpp's
continuation: max and mean |logit difference| and top-1 agreement per row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from power.runtime.gguf_weights import GGUFFile
from power.runtime.linear import Linear
from power.runtime.speculators.ngram import common_prefix_length
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
PROMPT = ("Speculative decoding drafts a few tokens and the target verifies them in one pass. "
          "The capital of France is Paris, and the capital of Italy is Rome. ")


class PowerEngine:
    def __init__(self, gguf: GGUFFile, n_ctx: int, arithmetic: str, capacity: int) -> None:
        self.trunk = load_trunk(gguf, n_ctx=n_ctx, verify_capacity=capacity, arithmetic=arithmetic)
        self.name = f"power {arithmetic} B{capacity} ({self.trunk.instruction_path})"

    def prefill(self, prompt: list[int]) -> int:
        self.trunk.reset()
        return int(self.trunk.prefill(prompt).logits[-1].argmax())

    def step(self, token: int) -> int:
        return int(self.trunk.forward([token]).logits[0].argmax())

    def bytes_per_step(self) -> int:
        """Every matrix a decode step multiplies by (the layers' and the LM head's), as packed."""
        matrices = [m for layer in self.trunk.layers for m in vars(layer).values() if isinstance(m, Linear)]
        return sum(m.nbytes for m in [*matrices, self.trunk.lm_head])

    def all_logits(self, ids: list[int]) -> torch.Tensor:
        self.trunk.reset()
        return self.trunk.prefill(ids, all_logits=True).logits


class LlamaCppEngine:
    name = "llama.cpp"

    def __init__(self, path: Path, n_ctx: int, threads: int) -> None:
        from llama_cpp import Llama

        self.path = path
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False)

    def prefill(self, prompt: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(prompt)
        return self._argmax()

    def step(self, token: int) -> int:
        self.llm.eval([token])
        return self._argmax()

    def all_logits(self, ids: list[int]) -> torch.Tensor:
        from llama_cpp import Llama

        scorer = Llama(model_path=str(self.path), n_ctx=len(ids) + 8, n_threads=1, logits_all=True, verbose=False)
        scorer.eval(ids)
        return torch.from_numpy(np.array(scorer.scores[: len(ids)], dtype=np.float32))

    def _argmax(self) -> int:
        """The last row's greedy token (llama-cpp-python keeps no scores unless logits_all)."""
        return int(np.argmax(np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))))

    def bytes_per_step(self) -> int:
        return sum(info.nbytes for info in GGUFFile(self.path).tensors.values())


def measure(engines: list, prompt: list[int], decode: int, repeats: int, slice_steps: int) -> dict[str, dict]:
    """Interleaved: `repeats` prefills per engine (median), then decode in round-robin slices."""
    prefill_s = {e.name: [] for e in engines}
    for _ in range(repeats):
        for engine in engines:
            started = time.perf_counter()
            engine.prefill(prompt)
            prefill_s[engine.name].append(time.perf_counter() - started)
    tokens = {e.name: [e.prefill(prompt)] for e in engines}
    decode_s = {e.name: 0.0 for e in engines}
    while len(tokens[engines[0].name]) < decode:
        for engine in engines:
            stream = tokens[engine.name]
            started = time.perf_counter()
            for _ in range(min(slice_steps, decode - len(stream))):
                stream.append(engine.step(stream[-1]))
            decode_s[engine.name] += time.perf_counter() - started
    return {e.name: {"prefill_tok_s": len(prompt) / statistics.median(prefill_s[e.name]),
                     "decode_tok_s": (decode - 1) / decode_s[e.name],
                     "bytes_per_step": e.bytes_per_step(), "tokens": tokens[e.name]} for e in engines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--ctx", type=int, default=4096,
                        help="every engine's context (the bundled profiles' 4096; at least prompt + decode tokens)")
    parser.add_argument("--repeats", type=int, default=3, help="prefills per engine (the median is reported)")
    parser.add_argument("--slice", type=int, default=4, help="decode steps per engine per turn")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--configs", default="quantised:1,quantised:8,float32:1",
                        help="comma-separated arithmetic:capacity for Power")
    parser.add_argument("--accuracy", action="store_true",
                        help="also score every engine's logits against Power float32 (teacher-forced)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    gguf = GGUFFile(args.gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    text = PROMPT * (1 + args.prompt_tokens // len(tokenizer.encode(PROMPT)))
    prompt = tokenizer.encode(text)[: args.prompt_tokens]
    n_ctx = max(args.ctx, len(prompt) + args.decode_tokens + 8)

    engines = []
    try:
        engines.append(LlamaCppEngine(args.gguf, n_ctx, args.threads))
    except ImportError:
        print("llama-cpp-python is not installed: `pip install llama-cpp-python` to compare (benchmark only)",
              file=sys.stderr)
    for config in args.configs.split(","):
        arithmetic, capacity = config.split(":")
        engines.append(PowerEngine(gguf, n_ctx, arithmetic, int(capacity)))
    results = measure(engines, prompt, args.decode_tokens, args.repeats, args.slice)
    _report(results, args)
    if args.accuracy:
        _report_accuracy(engines, gguf, prompt + results[engines[0].name]["tokens"][:-1], n_ctx, results)
    if args.json:
        args.json.write_text(json.dumps({"gguf": str(args.gguf), "threads": args.threads, "results": results}, indent=2))


def _report(results: dict[str, dict], args) -> None:
    reference = results.get(LlamaCppEngine.name)
    print(f"{args.gguf.name}: {args.prompt_tokens} prompt tokens, {args.decode_tokens} decoded, ctx {args.ctx}, "
          f"{args.threads} threads, torch {torch.__version__}, interleaved")
    print(f"{'engine':<56}{'prefill tok/s':>14}{'x':>6}{'decode tok/s':>14}{'x':>6}{'MB/step':>9}{'GB/s':>7}  greedy agrees")
    for name, r in results.items():
        r["bandwidth_gb_s"] = r["bytes_per_step"] * r["decode_tok_s"] / 1e9
        if reference:
            r["prefill_vs_llama_cpp"] = r["prefill_tok_s"] / reference["prefill_tok_s"]
            r["decode_vs_llama_cpp"] = r["decode_tok_s"] / reference["decode_tok_s"]
            r["greedy_prefix_agreeing"] = common_prefix_length(r["tokens"], reference["tokens"])
        print(f"{name:<56}{r['prefill_tok_s']:>14.1f}{r.get('prefill_vs_llama_cpp', 0):>6.2f}"
              f"{r['decode_tok_s']:>14.2f}{r.get('decode_vs_llama_cpp', 0):>6.2f}{r['bytes_per_step'] / 1e6:>9.0f}"
              f"{r['bandwidth_gb_s']:>7.2f}  {r.get('greedy_prefix_agreeing', '-')}")


def _report_accuracy(engines: list, gguf: GGUFFile, ids: list[int], n_ctx: int, results: dict) -> None:
    """Every engine's logits over `ids` against Power float32 at capacity 1 (the exactly dequantised weights)."""
    exact = PowerEngine(gguf, n_ctx, "float32", 1).all_logits(ids)
    print(f"\nlogits vs Power float32 (exact dequantised weights), teacher-forced over {len(ids)} rows")
    print(f"{'engine':<56}{'max |d|':>9}{'mean |d|':>10}{'top-1 agrees':>14}")
    for engine in engines:
        logits = engine.all_logits(ids)
        difference = (logits - exact).abs()
        agree = (logits.argmax(-1) == exact.argmax(-1)).double().mean().item()
        results[engine.name] |= {"max_abs_logit_diff": difference.max().item(),
                                 "mean_abs_logit_diff": difference.mean().item(), "top1_agreement": agree}
        print(f"{engine.name:<56}{difference.max().item():>9.3f}{difference.mean().item():>10.3f}{agree:>14.1%}")


if __name__ == "__main__":
    main()
