"""`power serve` under concurrent clients, beside llama-server with the same slots, on the bundled Gemma 3 270M.

    python bench/bench_serve.py [--clients 1,2,4,8] [--tokens 64] [--runs 3] [--threads 2]
                                [--contention N] [--portable] [--json out.json]

Both engines run as servers on loopback, started once, and are measured in
turns: every measurement alternates which engine goes first, run by run, so
load from other processes on a shared machine lands on both alike. Each server's requests go through one HTTP
client whose connections are kept, as an application's OpenAI client keeps them (a fresh client for each request
would time its own construction, tens of milliseconds that are no server's work). Three parts:

1. Aggregate decode throughput. N concurrent greedy clients, each with its own
   prompt, against a target-only plan (profiles/target-only.toml) with
   `slots` = the largest N; llama-server runs the line Power renders for that
   plan, plus `-np` with the same slot count. Aggregate tok/s = the completion
   tokens of all N clients / the wall time from the first request sent to the
   last answer. Reported with the ratios Power(N) / Power(1) and Power /
   llama-server at each N.
2. n-gram speculation on the echo shape: Power serving profiles/ngram.toml (with
   the same slots, and a verification capacity of slots x (K + 1) rows, so each
   round verifies every slot's whole draft as llama-server does) against
   llama-server launched with the line Power renders for that plan (its n-gram
   flags), at one client and at the largest N.
3. Prefix reuse: time to first token (to the first streamed text) of a request
   whose ~1k-token system prompt a slot already holds, against one whose
   equally long system prompt is new, on a plan with two slots of 2048
   positions; llama-server (its prompt cache) alongside for reference.

`--contention N` runs every measurement beside N busy processes (bench/native.py
`contention`; the servers start and warm up before them) and adds a third
server, llama-server with its polling off (`--poll 0`), to the throughput and
n-gram parts, so Power and llama-server (default and not polling) are seen
under the same contention.

llama-server is the binary `scripts/build-llama-server --native` builds for this
CPU (`--portable`: the AVX2 conformance build), cached after the first build; when
it cannot be built, the bench says so and measures Power alone. Power runs each
plan's own arithmetic (the profiles' default: quantised). The output
names the CPU, Power's matmul paths and llama-server's build flags, and the
resident memory of both servers after the throughput part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import tomli_w
from native import contention, instruction_paths, llama_server_binary, resident_mib

from power.app.bench.traffic import build_shape, unique_lines
from power.app.live import LiveEngine, free_port
from power.documents.plan import load_plan, located
from power.threads import environment_for_other_programs

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "gemma3-270m.toml"
POWER = Path(sys.executable).parent / "power"
SYSTEM_LINES = 72  # about 1,000 Gemma tokens of unique sentences
BOUND_S = 600.0


@dataclass
class Server:
    """A server process on a loopback port."""

    name: str
    command: list[str]
    port: int
    log: Path
    process: subprocess.Popen | None = None
    # One client for every request, its connections kept, as an application's OpenAI client keeps them: a request
    # timed through a fresh client also timed that client's construction (tens of ms), which is no server's work.
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=BOUND_S))

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        env=environment_for_other_programs())
        deadline = time.monotonic() + BOUND_S
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{self.name} did not come up: {self.command}\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        self.client.close()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)

    def _healthy(self) -> bool:
        try:
            return self.client.get(f"{self.base}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


@dataclass
class Sample:
    engine: str
    clients: int
    tokens: int
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Results:
    throughput: list[Sample] = field(default_factory=list)
    ngram: list[Sample] = field(default_factory=list)
    ttft: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    resident_mib: dict[str, float] = field(default_factory=dict)  # after the throughput part, at the largest N


# --- plans and launch lines ----------------------------------------------------------------------------------------


def plan(profile: Path, slots: int, ctx: int, directory: Path, every_draft: bool = False) -> Path:
    """The bundled Gemma manifest planned with `profile`, its runtime.slots and ctx set as given; `every_draft`: a
    verification capacity of slots x (K + 1) rows, so one round verifies every slot's whole draft (as llama-server
    verifies every slot's draft in one batch) instead of sharing the profile's rows between the slots."""
    document = tomllib.loads(profile.read_text())
    document["runtime"] |= {"slots": slots, "ctx": ctx}
    if every_draft:
        rows = slots * (document["spec_draft_max"] + 1)
        document["runtime"]["verify_capacity"] = max(rows, document["runtime"]["verify_capacity"])
    derived = directory / f"{profile.stem}-slots{slots}.toml"
    derived.write_text(tomli_w.dumps(document))
    out = directory / f"{profile.stem}-slots{slots}.plan.json"
    subprocess.run([str(POWER), "plan", str(MANIFEST), str(derived), "--device", "24 GiB", "-o", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def rendered_llama_server(plan_path: Path, binary: str, port: int, threads: int, poll: int | None = None) -> list[str]:
    """The llama-server line Power renders for the plan (its `-np` is the plan's slots), on this port and thread
    count; `poll` adds `--poll` (0: its threads sleep instead of polling for work)."""
    plan = located(load_plan(plan_path), plan_path)
    argv = LiveEngine("llama-server", plan, plan_path, Path(binary), threads=threads).argv(port)
    return argv if poll is None else [*argv, "--poll", str(poll)]


def power_server(plan_path: Path, port: int, args: argparse.Namespace, log: Path) -> Server:
    command = [str(POWER), "serve", str(plan_path), "--port", str(port), "--threads", str(args.threads),
               "--queue-size", "64"]
    return Server("power", command, port, log)


# --- measurements --------------------------------------------------------------------------------------------------


def complete(server: Server, prompt: str, max_tokens: int) -> int:
    """One greedy completion; the completion tokens it produced."""
    response = server.client.post(f"{server.base}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                                        "temperature": 0.0})
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"]


def concurrent(server: Server, prompts: list[str], max_tokens: int) -> Sample:
    """Every prompt sent at once, one client each: completion tokens and the wall time to the last answer."""
    produced = [0] * len(prompts)
    start = threading.Barrier(len(prompts) + 1)

    def client(i: int) -> None:
        start.wait()
        produced[i] = complete(server, prompts[i], max_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return Sample(server.name, len(prompts), sum(produced), time.perf_counter() - began)


def first_text_s(server: Server, prompt: str) -> float:
    """Seconds from sending a streamed request to its first text."""
    began = time.perf_counter()
    with server.client.stream("POST", f"{server.base}/v1/completions", json={
            "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:])["choices"][0].get("text"):
                    return time.perf_counter() - began
    raise RuntimeError(f"{server.base} streamed no text for the prompt")


def client_prompts(n: int) -> list[str]:
    """n distinct prose prompts (the traffic module's unique lines), each asking to go on."""
    return [" ".join(unique_lines(3, seed=100 + i)) + " Then" for i in range(n)]


def in_turns(servers: list[Server], runs: int, measure) -> None:
    for run in range(runs):
        for server in (servers if run % 2 == 0 else servers[::-1]):
            measure(server, run)


# --- the report ------------------------------------------------------------------------------------------------------


def median_tok_s(samples: list[Sample], engine: str, clients: int) -> float | None:
    rates = _rates(samples, engine, clients)
    return statistics.median(rates) if rates else None


def _rates(samples: list[Sample], engine: str, clients: int) -> list[float]:
    return [s.tok_s for s in samples if s.engine == engine and s.clients == clients]


def _spread(samples: list[Sample], engine: str, clients: int) -> str:
    """The median and, in brackets, the range of the runs."""
    rates = _rates(samples, engine, clients)
    return f"{statistics.median(rates):.1f} [{min(rates):.1f}-{max(rates):.1f}]" if rates else "-"


def report(results: Results, clients: list[int], has_llama: bool, busy: int = 0) -> str:
    beside = f", beside {busy} busy processes" if busy else ""
    polled = sorted({s.engine for s in results.throughput + results.ngram if s.engine.startswith("llama-server --")})
    extra_head = "".join(f" {name} | Power / {name} |" for name in polled)
    extra_rule = " ---: | ---: |" * len(polled)

    def extra(samples: list[Sample], n: int, power: float | None) -> str:
        return "".join(f" {_spread(samples, name, n)} | {_ratio(power, median_tok_s(samples, name, n))} |"
                       for name in polled)

    lines = [f"## Aggregate decode tok/s (greedy, target-only plan{beside}; median [range] of runs)", "",
             f"| clients | Power | x Power(1) | llama-server | Power / llama-server |{extra_head}",
             f"| ---: | ---: | ---: | ---: | ---: |{extra_rule}"]
    single = median_tok_s(results.throughput, "power", clients[0])
    for n in clients if single else ():
        power = median_tok_s(results.throughput, "power", n)
        llama = median_tok_s(results.throughput, "llama-server", n)
        lines.append(f"| {n} | {_spread(results.throughput, 'power', n)} | {power / single:.2f} | "
                     f"{_spread(results.throughput, 'llama-server', n)} | {_ratio(power, llama)} |"
                     f"{extra(results.throughput, n, power)}")
    lines += ["", f"## n-gram speculation on the echo shape (aggregate tok/s{beside}, median [range] of runs)", "",
              "| clients | Power (ngram plan) | llama-server (rendered n-gram line) | Power / "
              f"llama-server |{extra_head}",
              f"| ---: | ---: | ---: | ---: |{extra_rule}"]
    for n in sorted({s.clients for s in results.ngram}):
        power = median_tok_s(results.ngram, "power", n)
        llama = median_tok_s(results.ngram, "llama-server", n)
        lines.append(f"| {n} | {_spread(results.ngram, 'power', n)} | {_spread(results.ngram, 'llama-server', n)} | "
                     f"{_ratio(power, llama)} |{extra(results.ngram, n, power)}")
    lines += ["", "## Time to first token with a ~1k-token system prompt (median seconds)", "",
              "| engine | new system prompt | cached system prompt | speed-up |", "| --- | ---: | ---: | ---: |"]
    for engine, ttft in results.ttft.items():
        cold, warm = statistics.median(ttft["cold"]), statistics.median(ttft["warm"])
        lines.append(f"| {engine} | {cold:.3f} | {warm:.3f} | {cold / warm:.1f}x |")
    if results.resident_mib:
        lines += ["", "## Resident memory after the throughput part (MiB)", "",
                  "| engine | RSS MiB |", "| --- | ---: |"]
        lines += [f"| {engine} | {mib:.0f} |" for engine, mib in results.resident_mib.items()]
        power, llama = results.resident_mib.get("power"), results.resident_mib.get("llama-server")
        if power and llama:
            lines.append(f"| Power / llama-server | {power / llama:.2f}x |")
    if not has_llama:
        lines += ["", "llama-server could not be built here: only Power was measured."]
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


# --- main -------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,2,4,8", help="concurrency levels, comma-separated")
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--runs", type=int, default=3, help="runs per engine and level (alternating)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--portable", action="store_true", help="llama-server's portable AVX2 build, not --native")
    parser.add_argument("--parts", default="throughput,ngram,reuse", help="which parts to run, comma-separated")
    parser.add_argument("--contention", type=int, default=0, metavar="N",
                        help="measure beside N busy processes, with llama-server --poll 0 as a third server")
    parser.add_argument("--json", type=Path, default=None, help="also write every sample here")
    args = parser.parse_args()
    clients = sorted({int(c) for c in args.clients.split(",")})
    slots = clients[-1]
    binary = llama_server_binary(native=not args.portable)
    paths = instruction_paths(binary)
    for key, value in paths.items():
        print(f"{key}: {value}")
    work = Path(tempfile.mkdtemp(prefix="power-bench-serve-"))
    print(f"work directory: {work}", file=sys.stderr)
    results = Results()

    def pair(plan_path: Path) -> list[Server]:
        servers = [power_server(plan_path, free_port(), args, work / f"power-{plan_path.stem}.log")]
        for poll in ([None, 0] if args.contention else [None]) if binary else []:
            port, name = free_port(), "llama-server" if poll is None else f"llama-server --poll {poll}"
            servers.append(Server(name, rendered_llama_server(plan_path, binary, port, args.threads, poll), port,
                                  work / f"llama-{plan_path.stem}-{poll}.log"))
        for server in servers:
            server.start()
            complete(server, "Warm up.", 4)
        return servers

    def run_part(servers: list[Server], body) -> None:
        try:
            with contention(args.contention):
                body(servers)
        finally:
            for server in servers:
                server.stop()

    target_only = plan(REPO / "profiles" / "target-only.toml", slots, 512 * slots, work)

    def throughput(servers: list[Server]) -> None:
        for n in clients:
            prompts = client_prompts(n)
            in_turns(servers, args.runs, lambda server, _run, prompts=prompts: _record(
                results.throughput, concurrent(server, prompts, args.tokens)))
        for server in servers:
            results.resident_mib[server.name] = resident_mib(server.process.pid) if server.process else 0.0

    parts = set(args.parts.split(","))
    if "throughput" in parts:
        run_part(pair(target_only), throughput)

    ngram = plan(REPO / "profiles" / "ngram.toml", slots, 512 * slots, work, every_draft=True)
    echo = build_shape("echo", args.tokens).prompt

    def speculation(servers: list[Server]) -> None:
        for n in sorted({1, slots}):
            in_turns(servers, args.runs, lambda server, _run, n=n: _record(
                results.ngram, concurrent(server, [echo] * n, args.tokens)))

    if "ngram" in parts:
        run_part(pair(ngram), speculation)

    reuse = plan(REPO / "profiles" / "target-only.toml", 2, 4096, work)

    def prefix_reuse(servers: list[Server]) -> None:
        def measure(server: Server, run: int) -> None:
            system = " ".join(unique_lines(SYSTEM_LINES, seed=1000 + run)) + "\n"
            ttft = results.ttft.setdefault(server.name, {"cold": [], "warm": []})
            ttft["cold"].append(first_text_s(server, system + "Question: what comes first?\nAnswer:"))
            ttft["warm"].append(first_text_s(server, system + "Question: what comes last?\nAnswer:"))
            print(f"{server.name}: time to first token {ttft['cold'][-1]:.3f} s new, {ttft['warm'][-1]:.3f} s cached",
                  file=sys.stderr)
        in_turns(servers, args.runs, measure)

    if "reuse" in parts:
        run_part(pair(reuse), prefix_reuse)

    print(report(results, clients, binary is not None, args.contention))
    print("\n" + "\n".join(f"{key}: {value}" for key, value in paths.items()))
    if args.json:
        args.json.write_text(json.dumps({"paths": paths, "resident_mib": results.resident_mib,
                                         "throughput": [vars(s) for s in results.throughput],
                                         "ngram": [vars(s) for s in results.ngram], "ttft": results.ttft,
                                         "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))


def _record(samples: list[Sample], sample: Sample) -> None:
    samples.append(sample)
    print(f"{sample.engine} x{sample.clients}: {sample.tokens} tokens in {sample.seconds:.2f} s = "
          f"{sample.tok_s:.1f} tok/s", file=sys.stderr)


if __name__ == "__main__":
    main()
