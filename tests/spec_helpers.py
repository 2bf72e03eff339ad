"""Shared by the speculation tests: real trunks from the factory's fixtures and the bundled Gemma, and an oracle.

The oracle speculator proposes the target's own autoregressive continuation with
errors injected where a test asks, so every path of the transaction (full, partial
and zero acceptance, a rejection beyond the resident window) is driven on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import torch

from power.artifacts import factory
from power.documents.kv_types import F32
from power.runtime.decoder import Decoder
from power.runtime.gguf_weights import GGUFFile
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators.base import Decline, DraftContext, NGramWindow, Proposal, Speculator, SpeculatorRequest
from power.runtime.speculators.registry import build as build_speculator
from power.runtime.trunks import load_trunk

# Tiny fixture forwards are dominated by thread hand-offs; one thread is several times faster on a shared CPU.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
GEMMA = REPO / "models" / "gemma-3-270m-q4_k_m.gguf"
CAPACITY = 11  # verification shape: anchor + up to K = 10 proposals
DRAFTERS = {"dflash": "dflash-drafter.gguf", "dflash2": "dflash2-drafter.gguf", "dspark": "dspark-drafter.gguf"}
FIXTURE_PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32, 84, 104, 101, 32]


@lru_cache(maxsize=None)
def fixture_dir() -> Path:
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="power-spec-fixtures-"))
    for build in (
        factory.build_dense_target,
        factory.build_hybrid_target,
        factory.build_gemma3_target,
        factory.build_dflash_drafter,
        factory.build_dflash2_drafter,
        factory.build_dspark_drafter,
    ):
        build(directory)
    return directory


def target_path(name: str) -> Path:
    """"gemma": the bundled Gemma 3 270M; "dense", "hybrid", "gemma3": the factory's fixtures."""
    return GEMMA if name == "gemma" else fixture_dir() / f"{name}-target.gguf"


@lru_cache(maxsize=None)
def copying_mtp_sidecar() -> Path:
    """An MTP-only sidecar for the gemma3 fixture whose head drafts the token it reads: eh_proj passes the token's
    embedding through and the block's sublayers are damped (post norms 0.1). On the fixture's repetitive greedy
    text its chains are accepted where the text repeats and rejected where it changes."""
    from power.drafters.export import write_mtp_sidecar
    from power.drafters.mtp_head import MTPHeadNet
    from power.runtime.trunks.gemma3 import Gemma3Params

    target = gguf("gemma3")
    p = Gemma3Params.from_gguf(target)
    embedding = target.tensor("token_embd.weight")
    tensors = MTPHeadNet(p, embedding, embedding, max_positions=2, seed=0).tensors()
    block = f"blk.{p.n_layers}."
    tensors[block + "nextn.eh_proj.weight"] = torch.cat([torch.eye(p.d_model), torch.zeros(p.d_model, p.d_model)], 1)
    for norm in ("post_attention_norm", "post_ffw_norm"):
        tensors[f"{block}{norm}.weight"] = torch.full((p.d_model,), 0.1)
    return write_mtp_sidecar(fixture_dir() / "gemma3-copying-mtp.gguf", tensors, target_path("gemma3"), "copying")


@lru_cache(maxsize=None)
def gguf(name: str) -> GGUFFile:
    return GGUFFile(target_path(name))


def trunk(name: str, snapshot_rows: int = CAPACITY - 1, kv_type: str = F32):
    """One trunk per model (per S for the hybrid, whose recurrent snapshots S sizes; per KV cache type), reused across
    tests."""
    return _trunk(name, snapshot_rows if name == "hybrid" else 0, kv_type)


@lru_cache(maxsize=None)
def _trunk(name: str, snapshot_rows: int, kv_type: str):
    n_ctx = 1024 if name == "gemma" else 2048
    return load_trunk(gguf(name), n_ctx=n_ctx, verify_capacity=CAPACITY, snapshot_rows=snapshot_rows, kv_type=kv_type)


def plain_stream(name: str, n_tokens: int, seed: int = 0, temperature: float = 0.0,
                 kv_type: str = F32) -> tuple[int, ...]:
    """The autoregressive continuation of the model's test prompt (prompt excluded), computed once per arguments
    however they are passed (a second run would move the shared trunk under a test that holds it)."""
    return _plain_stream(name, n_tokens, seed, temperature, kv_type)


@lru_cache(maxsize=None)
def _plain_stream(name: str, n_tokens: int, seed: int, temperature: float, kv_type: str) -> tuple[int, ...]:
    params = SamplingParams(temperature=temperature, seed=seed)
    generation = Decoder(trunk(name, kv_type=kv_type), Sampler(params)).generate(prompt_for(name), n_tokens)
    return tuple(generation.tokens)


def prompt_for(name: str) -> list[int]:
    if name == "gemma":
        from power.runtime.tokenizer import Tokenizer

        text = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"
        return Tokenizer.from_gguf(gguf("gemma")).encode(text)
    return list(FIXTURE_PROMPT)


@dataclass
class Oracle(Speculator):
    """Proposes the true continuation; round r's proposal is correct for `plan[r]` tokens, then wrong.

    plan[r] = None: the whole proposal is correct. Rounds past the plan follow `then`.
    """

    truth: Sequence[int]  # prompt + the plain continuation
    plan: Sequence[int | None] = ()
    then: int | None = None
    vocab: int = 2
    rounds: int = 0
    name: str = "oracle"
    asked: list[int] = field(default_factory=list)  # the width each round asked for

    def propose(self, ctx: DraftContext) -> Proposal:
        self.asked.append(ctx.max_tokens)
        start = len(ctx.tokens)
        proposal = list(self.truth[start : start + ctx.max_tokens])
        correct = self.plan[self.rounds] if self.rounds < len(self.plan) else self.then
        self.rounds += 1
        if correct is not None and correct < len(proposal):
            proposal[correct] = (proposal[correct] + 1) % self.vocab
        return Proposal(tokens=proposal)

    def checkpoint(self) -> tuple[int, int]:
        return self.rounds, len(self.asked)

    def restore(self, checkpoint: tuple[int, int]) -> None:
        self.rounds, asked = checkpoint
        del self.asked[asked:]


class Calls(Speculator):
    """A speculator as the transaction sees it, writing down the calls it gets (in `log`, shared when given)."""

    def __init__(self, inner: Speculator, log: list | None = None) -> None:
        self.inner, self.calls = inner, [] if log is None else log
        self.taps, self.window_rows, self.member_count = inner.taps, inner.window_rows, inner.member_count
        self.max_proposals = inner.max_proposals

    def begin(self, tokens: Sequence[int]) -> None:
        self.inner.begin(tokens)

    def propose(self, ctx: DraftContext) -> Proposal:
        self.calls.append("propose")
        return self.inner.propose(ctx)

    def commit(self, tokens: Sequence[int], hidden: dict[int, torch.Tensor], start: int) -> None:
        self.calls.append(("commit", start, len(tokens)))
        self.inner.commit(tokens, hidden, start)

    def checkpoint(self) -> Any:
        self.calls.append("checkpoint")
        return self.inner.checkpoint()

    def restore(self, checkpoint: Any) -> None:
        self.calls.append("restore")
        self.inner.restore(checkpoint)


def oracle_for(name: str, n_tokens: int, plan: Sequence[int | None] = (), then: int | None = None,
               kv_type: str = F32) -> Oracle:
    truth = prompt_for(name) + list(plain_stream(name, n_tokens, kv_type=kv_type))
    return Oracle(truth, plan, then, vocab=trunk(name).config.vocab_size)


def built(kind: str, model: str, target, kv_type: str = F32) -> Speculator:
    """A real speculator of `kind` for `target` (a trunk of `model`); DSpark's confidence gate at 0 so that its
    blocks are verified (with random weights its header threshold gates nearly every block)."""
    drafter = fixture_dir() / DRAFTERS[kind] if kind in DRAFTERS else None
    request = SpeculatorRequest(target, drafter=drafter and GGUFFile(drafter), target=gguf(model), p_min=0.0,
                                ngram=NGramWindow(2, 1, 64), kv_type=kv_type)
    speculator = build_speculator(kind, request)
    assert not isinstance(speculator, Decline), str(speculator)
    return speculator


def speculative(name: str, speculator: Speculator | None, k: int, s: int, adaptive: bool = False, kv_type: str = F32,
                **params) -> Decoder:
    return Decoder(
        trunk(name, s, kv_type),
        Sampler(SamplingParams(**params)),
        speculator,
        SchedulerConfig(k=k, s=s, adaptive=adaptive),
    )
