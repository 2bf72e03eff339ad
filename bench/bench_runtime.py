"""Runtime benchmark: Power's prefill and plain decode tok/s on this machine, beside llama.cpp on the same GGUF.

    python bench/bench_runtime.py [--gguf models/gemma-3-270m-q4_k_m.gguf] [--threads 1,2]
                                  [--prompt-tokens 64,1024] [--contention N] [--json out.json]

Every engine is loaded first; then prefill and decode are measured interleaved,
engine after engine in every run (the A/B protocol's pairing), so load from
other processes on a shared machine lands on all engines alike and the ratios
hold even when the absolute figures move. Each run starts one engine further
along the list, so every engine follows every other equally often: an engine
that always ran right after llama-server prefilled up to a third slower beside
busy processes than the same engine after Power (docs/runtime.md, "How kernel
threads wait"). Reports the median over the runs and the best run (max tok/s,
what a shared host's interruptions cannot make better), at each thread count and
prompt length (`--prompt-tokens`, by default 64 and 1,024: a short prompt hides
the attention over the cache that a real prompt's prefill and the decode after
it spend, docs/runtime.md "Long prompts"). Engines, at each thread count:
- llama-server built for this CPU (`scripts/build-llama-server --native`;
  `--portable` takes the AVX2 conformance build), one slot, greedy, its own
  timings of prompt processing and generation;
- Power at each `arithmetic:capacity` of --configs (power.documents.arithmetic),
  named with the instruction path its products take: the quantised arithmetic
  (what a plan gets without flags) runs a plain decode on one row whatever the
  capacity; the float32 reference pads every step to the capacity;
- llama.cpp through `llama-cpp-python`, when installed (benchmark-only), for
  `--accuracy`.

`--contention N` measures every engine twice, quiet and then beside N busy
processes (bench/native.py `contention`), and adds llama-server with its
polling off (`--poll 0`), so Power and llama-server (default and not polling)
are seen side by side under the same contention, each also over its own quiet
figure.

`--greedy-heads on,off` runs each quantised configuration once with the exact
greedy LM head where the model allows it (what `power run` does by default) and
once with the full head for every row (`--greedy-head off`), interleaved like
every engine: one run gives the head's A/B (docs/runtime.md, "The exact greedy
LM head"). Power's greedy tokens come from forwards that ask for the argmax only.

`--layer-kernels on,off` runs each quantised configuration once with every
layer as one kernel call where the trunk has one (what `power run` does:
Gemma 3 on the CPU kernels, docs/runtime.md "One call a layer") and once op by
op, interleaved like every engine.

`--power-only` leaves llama-server out: with `--contention N`, Power's busy figure
over its quiet one without another engine's threads still polling after its
turn (llama-server's default spins a while after each request).

`--kernel-waits adaptive,sleep` runs each quantised configuration once per
wait of Power's kernel threads (power.threads, docs/runtime.md "How kernel
threads wait"), interleaved like every engine: `sleep` is the passive wait
Power had before its adaptive one, so one run compares them on the same host.

Reports tok/s, the ratio to llama-server, the weight bytes one decode step
reads, the achieved bandwidth (bytes x tok/s), how many leading greedy tokens
agree with llama-server (it quantises activations, so a near-tie can flip a
token), the resident memory of each engine, and the instruction path each ran.

`--accuracy` then scores every engine's logits against Power in float32 (the
exactly dequantised weights), teacher-forced over the prompt and llama.cpp's
continuation: max and mean |logit difference| and top-1 agreement per row.
"""

from __future__ import annotations

from power.threads import environment_for_other_programs, settle_wait_policy

settle_wait_policy()  # before torch loads: OpenMP reads its wait policy once, as torch loads it

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from native import contention, instruction_paths, layer_matrices, llama_server_binary, resident_mib

from power.app.live import free_port
from power.kernels.cpu.build import set_wait
from power.kernels.cpu.greedy import CompactHead
from power.kernels.cpu.waits import KERNEL_WAITS, KernelWait
from power.runtime.gguf_weights import GGUFFile
from power.runtime.linear import QuantLinear
from power.runtime.speculators.ngram import common_prefix_length
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
PROMPT = ("Speculative decoding drafts a few tokens and the target verifies them in one pass. "
          "The capital of France is Paris, and the capital of Italy is Rome. ")


class PowerEngine:
    def __init__(self, trunk, arithmetic: str, capacity: int, wait: str | None = None) -> None:
        """`wait`: how the kernel threads wait during this engine's runs (power.kernels.cpu.waits.KERNEL_WAITS); None:
        Power's own choice, as loaded."""
        self.trunk, self.wait = trunk, wait
        head = "greedy head" if trunk.head_refusal is None else "full head"
        layers = "" if any(getattr(layer, "kernel", None) for layer in trunk.layers) else " op by op"
        self.name = (f"power {arithmetic} B{capacity} ({self.trunk.instruction_path}) {head}{layers}"
                     + (f" {wait}" if wait else ""))

    def run(self, prompt: list[int], decode: int) -> tuple[float, float, list[int]]:
        """(prefill seconds, decode seconds of the tokens after the first, the greedy tokens)."""
        if self.wait is not None:
            set_wait(self.trunk.instruction_path, KernelWait(self.wait, "environment"))
        self.trunk.reset()
        started = time.perf_counter()
        tokens = [_greedy_token(self.trunk.prefill(prompt, argmax_only=True))]
        prefilled = time.perf_counter()
        while len(tokens) < decode:
            tokens.append(_greedy_token(self.trunk.forward([tokens[-1]], argmax_only=True)))
        return prefilled - started, time.perf_counter() - prefilled, tokens

    def resident_mib(self) -> float:
        return resident_mib()

    def bytes_per_step(self) -> int:
        """Every matrix a decode step multiplies by (the layers' and the LM head's, as packed; with the greedy head,
        its pass's stream, the candidates' tiles left out)."""
        matrices = [m for layer in self.trunk.layers for m in layer_matrices(layer).values()]
        head = self.trunk.lm_head
        held_once = isinstance(head, QuantLinear) and isinstance(head.matrix, CompactHead)
        return sum(m.nbytes for m in matrices) + (head.matrix.pass_nbytes if held_once else head.nbytes)

    def all_logits(self, ids: list[int]) -> torch.Tensor:
        self.trunk.reset()
        return self.trunk.prefill(ids, all_logits=True).logits


def _greedy_token(out) -> int:
    """The last row's greedy token: chosen by the greedy head, or the argmax of its logits."""
    return int(out.argmax[-1]) if out.argmax is not None else int(out.logits[-1].argmax())


class LlamaServerEngine:
    """llama-server on loopback, one slot, greedy; prefill and decode times are the server's own timings."""

    name = "llama-server"

    def __init__(self, binary: str, path: Path, n_ctx: int, threads: int, poll: int | None = None) -> None:
        """`poll`: llama-server's `--poll` (0: its threads sleep instead of polling for work); None: its default."""
        self.path, self.port = path, free_port()
        self.name = LlamaServerEngine.name if poll is None else f"llama-server --poll {poll}"
        self.log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        polling = [] if poll is None else ["--poll", str(poll)]
        self.process = subprocess.Popen([binary, "-m", str(path), "-c", str(n_ctx), "-t", str(threads), "-tb",
                                         str(threads), "-np", "1", "--host", "127.0.0.1", "--port", str(self.port),
                                         *polling], stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        env=environment_for_other_programs())
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"llama-server did not come up:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.3)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def run(self, prompt: list[int], decode: int) -> tuple[float, float, list[int]]:
        body = {"prompt": prompt, "n_predict": decode, "temperature": 0, "top_k": 1, "cache_prompt": False,
                "ignore_eos": True, "return_tokens": True}
        answer = httpx.post(f"http://127.0.0.1:{self.port}/completion", json=body, timeout=600).json()
        timings = answer["timings"]
        # The server's first generated token comes with the prompt pass; its decode time covers the rest.
        decode_s = timings["predicted_ms"] / 1e3 * (decode - 1) / max(1, timings["predicted_n"])
        return timings["prompt_ms"] / 1e3, decode_s, [int(t) for t in answer["tokens"]]

    def bytes_per_step(self) -> int:
        return sum(info.nbytes for info in GGUFFile(self.path).tensors.values())

    def resident_mib(self) -> float:
        return resident_mib(self.process.pid)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class LlamaCppEngine:
    """llama.cpp in this process (llama-cpp-python, benchmark-only): every row's logits, for --accuracy."""

    name = "llama.cpp"

    def __init__(self, path: Path) -> None:
        import llama_cpp  # noqa: F401  (ImportError here: not installed)

        self.path = path

    def all_logits(self, ids: list[int]) -> torch.Tensor:
        from llama_cpp import Llama

        scorer = Llama(model_path=str(self.path), n_ctx=len(ids) + 8, n_threads=1, logits_all=True, verbose=False)
        scorer.eval(ids)
        return torch.from_numpy(np.array(scorer.scores[: len(ids)], dtype=np.float32))


def measure(engines: list, prompt: list[int], decode: int, repeats: int) -> dict[str, dict]:
    """Interleaved: each run, every engine in turn prefills the prompt and decodes, run r starting at engine
    r mod len(engines); medians and the best over the runs."""
    prefill_s: dict[str, list[float]] = {e.name: [] for e in engines}
    decode_s: dict[str, list[float]] = {e.name: [] for e in engines}
    tokens: dict[str, list[int]] = {}
    for run in range(repeats):
        first = run % len(engines)
        for engine in engines[first:] + engines[:first]:
            prefill, decoding, tokens[engine.name] = engine.run(prompt, decode)
            prefill_s[engine.name].append(prefill)
            decode_s[engine.name].append(decoding)
    return {e.name: {"prefill_tok_s": len(prompt) / statistics.median(prefill_s[e.name]),
                     "decode_tok_s": (decode - 1) / statistics.median(decode_s[e.name]),
                     "prefill_best_tok_s": len(prompt) / min(prefill_s[e.name]),
                     "decode_best_tok_s": (decode - 1) / min(decode_s[e.name]),
                     "bytes_per_step": e.bytes_per_step(), "resident_mib": e.resident_mib(),
                     "tokens": tokens[e.name]} for e in engines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--prompt-tokens", default="64,1024", help="prompt lengths, comma-separated")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--ctx", type=int, default=4096,
                        help="every engine's context (the bundled profiles' 4096; at least prompt + decode tokens)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per engine (the median is reported)")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--configs", default="quantised:1,float32:1",
                        help="comma-separated arithmetic:capacity for Power")
    parser.add_argument("--kernel-waits", default="",
                        help=f"comma-separated waits of Power's kernel threads ({', '.join(KERNEL_WAITS)}) to run each "
                             "quantised configuration under, interleaved (default: Power's own choice only)")
    parser.add_argument("--greedy-heads", default="on",
                        help="comma-separated on/off: each quantised configuration with the exact greedy LM head where "
                             "the model allows it (on) and with the full head for every row (off), interleaved")
    parser.add_argument("--layer-kernels", default="on",
                        help="comma-separated on/off: each quantised configuration with every layer as one kernel call "
                             "where the trunk has one (on) and op by op (off), interleaved")
    parser.add_argument("--power-only", action="store_true",
                        help="no llama-server: Power's own quiet and busy figures, with no other engine's threads "
                             "still polling after its turn")
    parser.add_argument("--portable", action="store_true", help="llama-server's portable AVX2 build, not --native")
    parser.add_argument(
        "--accuracy",
        action="store_true",
        help="also score every engine's logits against Power float32 (teacher-forced; llama-cpp-python)",
    )
    parser.add_argument("--contention", type=int, default=0, metavar="N",
                        help="also measure beside N busy processes, and llama-server with --poll 0")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    gguf = GGUFFile(args.gguf)
    tokenizer = Tokenizer.from_gguf(gguf)
    lengths = [int(n) for n in args.prompt_tokens.split(",")]
    text = PROMPT * (1 + max(lengths) // len(tokenizer.encode(PROMPT)))
    prompts = {n: tokenizer.encode(text)[:n] for n in lengths}
    n_ctx = max(args.ctx, max(lengths) + args.decode_tokens + 8)
    binary = None if args.power_only else llama_server_binary(native=not args.portable)
    paths = instruction_paths(binary)
    for key, value in paths.items():
        print(f"{key}: {value}")
    report: dict = {"gguf": str(args.gguf), "paths": paths, "runs": {}}
    power = []
    waits = [wait for wait in args.kernel_waits.split(",") if wait] or [None]
    heads = [head == "on" for head in args.greedy_heads.split(",")]
    layer_kernels = [choice == "on" for choice in args.layer_kernels.split(",")]
    for config in args.configs.split(","):
        arithmetic, capacity = config.split(":")
        quantised = arithmetic == "quantised"
        variants = itertools.product(heads if quantised else [True], layer_kernels if quantised else [True])
        for greedy_head, layers in variants:
            trunk = load_trunk(gguf, n_ctx=n_ctx, verify_capacity=int(capacity), arithmetic=arithmetic,
                               greedy_head=greedy_head, layer_kernels=layers)
            for wait in waits if quantised else [None]:
                power.append(PowerEngine(trunk, arithmetic, int(capacity), wait))
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        polls = [None, 0] if args.contention and binary else [None] if binary else []
        servers = [LlamaServerEngine(binary, args.gguf, n_ctx, threads, poll) for poll in polls if binary]
        try:
            engines: list = servers + power
            for length, prompt in prompts.items():
                run = f"{threads} threads, {length} prompt tokens"
                results = measure(engines, prompt, args.decode_tokens, args.repeats)
                _report(results, args, threads, length)
                report["runs"][run] = results
                if args.contention:
                    with contention(args.contention):
                        contended = measure(engines, prompt, args.decode_tokens, args.repeats)
                    _report(contended, args, threads, length, busy=args.contention)
                    _report_contention(results, contended)
                    report["runs"][f"{run}, beside {args.contention} busy"] = contended
        finally:
            for server in servers:
                server.close()
    if args.accuracy:
        scored: list = list(power)
        try:
            scored.insert(0, LlamaCppEngine(args.gguf))
        except ImportError:
            print("llama-cpp-python is not installed: `pip install llama-cpp-python` for --accuracy (benchmark only)",
                  file=sys.stderr)
        prompt = prompts[lengths[0]]
        _report_accuracy(scored, gguf, prompt + power[0].run(prompt, args.decode_tokens)[2][:-1], n_ctx, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _report(results: dict[str, dict], args, threads: int, prompt_tokens: int, busy: int = 0) -> None:
    reference = results.get(LlamaServerEngine.name)
    beside = f", beside {busy} busy processes" if busy else ""
    print(f"\n{args.gguf.name}: {prompt_tokens} prompt tokens, {args.decode_tokens} decoded, ctx {args.ctx}, "
          f"{threads} threads{beside}, torch {torch.__version__}, interleaved in rotating order, median and best of "
          f"{args.repeats}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'engine':<44}{'prefill tok/s':>14}{'x':>6}{'best':>8}{'x':>6}{'decode tok/s':>14}{'x':>6}{'best':>8}"
          f"{'x':>6}{'MB/step':>9}{'GB/s':>7}{'RSS MiB':>9}{'x':>6}  greedy agrees")
    for name, r in results.items():
        r["bandwidth_gb_s"] = r["bytes_per_step"] * r["decode_tok_s"] / 1e9
        if reference:
            for figure in ("prefill_tok_s", "decode_tok_s", "prefill_best_tok_s", "decode_best_tok_s"):
                r[figure.removesuffix("_tok_s") + "_vs_llama_server"] = r[figure] / reference[figure]
            r["resident_vs_llama_server"] = (
                r["resident_mib"] / reference["resident_mib"] if reference["resident_mib"] else 0
            )
            r["greedy_prefix_agreeing"] = common_prefix_length(r["tokens"], reference["tokens"])
        print(f"{name:<44}{r['prefill_tok_s']:>14.1f}{r.get('prefill_vs_llama_server', 0):>6.2f}"
              f"{r['prefill_best_tok_s']:>8.1f}{r.get('prefill_best_vs_llama_server', 0):>6.2f}"
              f"{r['decode_tok_s']:>14.2f}{r.get('decode_vs_llama_server', 0):>6.2f}"
              f"{r['decode_best_tok_s']:>8.2f}{r.get('decode_best_vs_llama_server', 0):>6.2f}"
              f"{r['bytes_per_step'] / 1e6:>9.0f}{r['bandwidth_gb_s']:>7.2f}{r['resident_mib']:>9.0f}"
              f"{r.get('resident_vs_llama_server', 0):>6.2f}"
              f"  {r.get('greedy_prefix_agreeing', '-')}")
    print("(Power's RSS is this process's, holding every Power configuration loaded.)")


def _report_contention(quiet: dict[str, dict], contended: dict[str, dict]) -> None:
    """Each engine's contended figures over its own quiet ones (1.0: unmoved by the busy processes)."""
    print(f"{'engine':<44}{'prefill busy/quiet':>20}{'best':>6}{'decode busy/quiet':>19}{'best':>6}")
    for name, r in contended.items():
        for figure in ("prefill_tok_s", "decode_tok_s", "prefill_best_tok_s", "decode_best_tok_s"):
            r[figure.removesuffix("_tok_s") + "_vs_quiet"] = r[figure] / quiet[name][figure]
        print(f"{name:<44}{r['prefill_vs_quiet']:>20.2f}{r['prefill_best_vs_quiet']:>6.2f}"
              f"{r['decode_vs_quiet']:>19.2f}{r['decode_best_vs_quiet']:>6.2f}")


def _report_accuracy(engines: list, gguf: GGUFFile, ids: list[int], n_ctx: int, report: dict) -> None:
    """Every engine's logits over `ids` against Power float32 at capacity 1 (the exactly dequantised weights)."""
    exact = PowerEngine(load_trunk(gguf, n_ctx=n_ctx, verify_capacity=1, arithmetic="float32"), "float32",
                        1).all_logits(ids)
    print(f"\nlogits vs Power float32 (exact dequantised weights), teacher-forced over {len(ids)} rows")
    print(f"{'engine':<24}{'max |d|':>9}{'mean |d|':>10}{'top-1 agrees':>14}")
    for engine in engines:
        logits = engine.all_logits(ids)
        difference = (logits - exact).abs()
        agree = (logits.argmax(-1) == exact.argmax(-1)).double().mean().item()
        report.setdefault("accuracy", {})[engine.name] = {"max_abs_logit_diff": difference.max().item(),
                                 "mean_abs_logit_diff": difference.mean().item(), "top1_agreement": agree}
        print(f"{engine.name:<24}{difference.max().item():>9.3f}{difference.mean().item():>10.3f}{agree:>14.1%}")


if __name__ == "__main__":
    main()
