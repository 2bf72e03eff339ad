"""Power's plan against what a real llama-server allocates: launch it, read its logged buffers, compare by component.

A `Case` is one set of settings (context, slots, unified KV, flash attention,
batches, KV type, an n-gram draft). The same settings become a Power profile
(compiled for llama-server on a CPU device, where llama.cpp logs every buffer),
whose llama-server line Power renders (`render.engine_launch`); the server runs on a loopback port with debug
logging until /health answers, is stopped with SIGTERM (so it logs its compute
buffer again, to 4 decimals, on the way out), and its log is parsed:

    load_tensors:   CPU_Mapped model buffer size =   235.16 MiB
    load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
    llama_context:        CPU  output buffer size =     1.00 MiB
    llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
    llama_kv_cache: size =   12.00 MiB (  4096 cells,   3 layers,  1/1 seqs), K (f16): ...
    llama_memory_recurrent:        CPU RS buffer size =     0.03 MiB
    ~llama_context:        CPU compute buffer size is  22.7696 MiB, matches expectation of  22.7696 MiB

Each component passes when Power is within 2% or 1 MiB of llama-server (whichever is larger).
tests/test_llama_conformance.py runs `MATRIX`; bench/bench_sizing.py prints the table.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from power.app.live import free_port
from power.artifacts import factory
from power.artifacts.bundled import ensure_gemma
from power.artifacts.gguf_writer import FileType, Q
from power.documents.plan import ResolvedPlan
from power.orchestrator.engines.sizing.model import MiB
from power.orchestrator.inputs.loading import load_manifest, load_profile
from power.orchestrator.inputs.schema import DeviceSpec, HostSpec
from power.orchestrator.launch.render import Listen, engine_launch
from power.orchestrator.planning.compile import ArtifactMemo, compile_plan
from power.threads import environment_for_other_programs

TOLERANCE = 0.02
TOLERANCE_BYTES = MiB
START_TIMEOUT_S = 120.0

# Power's component -> (the llama_context in construction order: 0 the target's, 1 the draft's; its buffer).
LOGGED = {
    "target weights": (0, "CPU_Mapped"),
    "CPU repack": (0, "CPU_REPACK"),
    "target KV (global)": (0, "KV global"),
    "target KV (sliding)": (0, "KV sliding"),
    "recurrent state": (0, "RS"),
    "output buffer": (0, "output"),
    "target compute buffer": (0, "compute"),
    "MTP KV": (1, "KV global"),
    "MTP output buffer": (1, "output"),
    "MTP compute buffer": (1, "compute"),
}

_CONTEXT = re.compile(r"llama_context: constructing llama_context")
_MODEL = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_OUTPUT = re.compile(r"llama_context:\s+\S+\s+output buffer size =\s+([\d.]+) MiB")
_ISWA = re.compile(r"llama_kv_cache_iswa: creating\s+(non-SWA|SWA) KV cache")
_KV = re.compile(r"llama_kv_cache: size =\s+([\d.]+) MiB")
_RS = re.compile(r"llama_memory_recurrent:\s+\S+ RS buffer size =\s+([\d.]+) MiB")
_COMPUTE = re.compile(r"sched_reserve:\s+\S+ compute buffer size =\s+([\d.]+) MiB")
_COMPUTE_EXIT = re.compile(r"~llama_context:\s+\S+ compute buffer size (?:is|of)\s+([\d.]+) MiB")


@dataclass(frozen=True)
class Case:
    """One launch: a model and the settings of its profile (llama-server runs the line Power renders for them)."""

    name: str
    model: str  # a key of `models()`
    ctx: int
    slots: int = 1
    kv_unified: bool = False
    flash_attn: bool = True
    batch: int = 2048
    ubatch: int = 512
    kv_cache_type: str = "f16"
    ngram_draft: int | None = None  # an n-gram drafter proposing up to this many tokens (llama.cpp ngram-mod)
    mtp_draft: int | None = None  # the target's MTP head drafting this many tokens (llama.cpp draft-mtp)

    @property
    def drafter(self) -> str | None:
        return "ngram" if self.ngram_draft is not None else "mtp" if self.mtp_draft is not None else None

    def profile(self) -> str:
        if self.drafter is None:
            speculation = 'spec_mode = "none"\n'
        else:
            k = self.mtp_draft or 64
            speculation = f'spec_mode = "{self.drafter}"\nspec_draft_max = {k}\nspec_mtp_recurrent_snapshots = {k}\n'
        ngram = f"ngram_draft_min = 1\nngram_draft_max = {self.ngram_draft}\n" if self.ngram_draft is not None else ""
        return (f'schema = "power.profile/v1"\nname = "{self.name}"\n{speculation}[runtime]\nctx = {self.ctx}\n'
                f"slots = {self.slots}\nkv_unified = {str(self.kv_unified).lower()}\n"
                f"flash_attn = {str(self.flash_attn).lower()}\nbatch = {self.batch}\nubatch = {self.ubatch}\n"
                f'kv_cache_type = "{self.kv_cache_type}"\n{ngram}')


@dataclass(frozen=True)
class Row:
    case: str
    component: str
    power: int
    llama: int
    basis: str

    @property
    def error(self) -> float:
        return (self.power - self.llama) / self.llama if self.llama else 0.0

    @property
    def ok(self) -> bool:
        return abs(self.power - self.llama) <= max(TOLERANCE * self.llama, TOLERANCE_BYTES)


MATRIX: tuple[Case, ...] = (
    Case("gemma3 c4096 np1 fa-on", "gemma3", 4096),
    Case("gemma3 c4096 np3 fa-off (grows to 4608)", "gemma3", 4096, slots=3, flash_attn=False),
    Case("gemma3 c16384 np4 fa-off", "gemma3", 16384, slots=4, flash_attn=False),
    Case("gemma3 c16384 np4 fa-off unified", "gemma3", 16384, slots=4, kv_unified=True, flash_attn=False),
    Case("gemma3 c32768 np2 fa-on unified ub256 b1024", "gemma3", 32768, slots=2, kv_unified=True, ubatch=256,
         batch=1024),
    Case("gemma3 c4096 np4 fa-on ngram-mod 16", "gemma3", 4096, slots=4, ngram_draft=16),
    Case("gemma3 c1000 b4096 ub4096 fa-on (clamped)", "gemma3", 1000, batch=4096, ubatch=4096),
    Case("gemma3 c4096 fa-on q8_0 KV", "gemma3", 4096, kv_cache_type="q8_0"),
    Case("qwen3 c4096 np2 fa-off", "qwen3", 4096, slots=2, flash_attn=False),
    Case("qwen35 c4096 np4 fa-on unified", "qwen35", 4096, slots=4, kv_unified=True),
    Case("qwen35 c4096 np2 fa-on draft-mtp 3", "qwen35", 4096, slots=2, mtp_draft=3),
    Case("llama c2048 fa-off", "llama", 2048, flash_attn=False),
    Case("qwen2 c2048 np2 fa-on", "qwen2", 2048, slots=2),
)


def models(directory: Path, repo_models: Path) -> dict[str, Path]:
    """The bundled Gemma 3 270M, the factory's dense (qwen3) and hybrid (qwen35) targets, and header-only llama and
    qwen2 targets of the dense fixture's shape (zero weights: llama.cpp allocates for them as for real ones)."""
    directory.mkdir(parents=True, exist_ok=True)
    built = {"gemma3": ensure_gemma(repo_models), "qwen3": factory.build_dense_target(directory),
             "qwen35": factory.build_hybrid_target(directory)}
    for arch in ("llama", "qwen2"):
        shapes = {name: shape for name, shape in factory.dense_tensor_shapes(factory.DENSE).items()
                  if "_norm" not in name or name.endswith(("attn_norm.weight", "ffn_norm.weight")) or
                  name.startswith("output_norm")}
        tensors = {name: (shape, Q.F32 if len(shape) == 1 else Q.F16) for name, shape in shapes.items()}
        metadata = (factory.dense_metadata(factory.DENSE, arch, f"header-only {arch}", FileType.MOSTLY_F16)
                    | factory.tokenizer_metadata(factory.TOKENIZER))
        built[arch] = factory.write_sparse_gguf(directory / f"{arch}-target.gguf", arch, metadata, tensors)
    return built


def plan_for(case: Case, model: Path, directory: Path, memo: ArtifactMemo) -> ResolvedPlan:
    """Power's plan for the case's settings, for llama-server on a CPU device (where llama.cpp logs every buffer)."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / "manifest.toml"
    drafters = f'\n[[drafters]]\nkind = "{case.drafter}"\n' if case.drafter else ""
    manifest.write_text(f'schema = "power.manifest/v1"\nname = "conformance"\n[target]\npath = "{model}"\n'
                        f'sha256 = "{memo.sha256(model)}"\n{drafters}')
    profile = directory / "profile.toml"
    profile.write_text(case.profile())
    host = HostSpec(name="conformance", devices=[DeviceSpec(model="CPU", vram=256 * 1024**3, kind="cpu")], headroom=0)
    plan, findings = compile_plan(load_manifest(manifest), load_profile(profile), host, artifacts=memo,
                                  engine="llama-server")
    if plan is None:
        raise ValueError(f"{case.name}: no plan: {'; '.join(f.render() for f in findings)}")
    return plan


def launch_argv(binary: Path, plan: ResolvedPlan, port: int, threads: int) -> list[str]:
    """The llama-server line Power renders for the plan, unchanged (`--fit off` included: the render pins it), then
    only what observes the run: debug logging, the machine's threads, no warm-up request."""
    launch = engine_launch(plan, "llama-server", Path(), Listen("127.0.0.1", port))  # a plan file names only Power's
    return [str(binary), *launch.argv[1:], "-lv", "5", "-t", str(threads), "--no-warmup"]


def run_llama_server(binary: Path, plan: ResolvedPlan, case: Case, log: Path, threads: int = 2) -> str:
    """Launch the rendered llama-server line for the case's plan (`launch_argv`), wait for /health, stop it with
    SIGTERM; its log text."""
    port = free_port()
    argv = launch_argv(binary, plan, port, threads)
    with log.open("w") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=environment_for_other_programs())
        try:
            healthy = _wait_healthy(process, port)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    text = log.read_text(errors="replace")
    if not healthy:
        raise RuntimeError(f"{case.name}: llama-server never answered /health ({' '.join(argv)}):\n{text[-3000:]}")
    return text


def _wait_healthy(process: subprocess.Popen, port: int) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    return False


def logged_buffers(log: str) -> list[dict[str, int]]:
    """The buffers of each llama_context in construction order, in bytes; the model buffers logged before a context
    count with it. llama.cpp prints MiB with 2 decimals, and the compute buffer again at exit with 4 (the contexts are
    freed in reverse order)."""
    contexts: list[dict[str, int]] = []
    pending: dict[str, int] = {}
    exits: list[int] = []
    cache = "KV global"
    for line in log.splitlines():
        if _CONTEXT.search(line):
            contexts.append(pending)
            pending, cache = {}, "KV global"
            continue
        current = contexts[-1] if contexts else pending
        if match := _MODEL.search(line):
            pending[match.group(1)] = _bytes(match.group(2))
        elif match := _OUTPUT.search(line):
            current["output"] = _bytes(match.group(1))
        elif match := _ISWA.search(line):
            cache = "KV global" if match.group(1) == "non-SWA" else "KV sliding"
        elif match := _KV.search(line):
            current[cache] = _bytes(match.group(1))
        elif match := _RS.search(line):
            current["RS"] = _bytes(match.group(1))
        elif match := _COMPUTE_EXIT.search(line):
            exits.append(_bytes(match.group(1)))
        elif (match := _COMPUTE.search(line)) and "compute" not in current:
            current["compute"] = _bytes(match.group(1))
    for context, precise in zip(reversed(contexts), exits, strict=False):  # a killed server logs none
        if abs(context.get("compute", precise) - precise) <= 0.005 * MiB:
            context["compute"] = precise
    return contexts


def _bytes(mib: str) -> int:
    return round(float(mib) * MiB)


def compare(case: Case, plan: ResolvedPlan, logged: list[dict[str, int]]) -> list[Row]:
    """One row per component either reports (a component only one of them has is a row against 0)."""
    (device,) = plan.memory.devices
    ours = {c.name: c for c in device.components}
    rows = []
    for component, (context, buffer) in LOGGED.items():
        theirs = logged[context].get(buffer) if context < len(logged) else None
        mine = ours.get(component)
        if mine is not None or theirs is not None:
            rows.append(Row(case.name, component, mine.bytes if mine else 0, theirs or 0,
                            mine.basis if mine else "missing"))
    return rows
