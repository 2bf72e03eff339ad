"""`power drafter distill`, end to end: generate the target's rows, train a drafter on them, write it out.

DIR/resume/ keeps what a later run resumes from: the generated rows (data.pt) and the
training checkpoint (checkpoint.pt), each keyed by the inputs that made it and stored as
plain tensors (`power.drafters.resume`: a file from elsewhere can neither run code nor
stand in for this run's state). The budget
covers the whole run and holds by construction (`power.drafters.budget`): the
data takes at most `generate_share` of it (an operator's corpus `corpus_share`
of that, the target's own text the rest); the phases after training are
measured before its first step and reserved; training takes a step only when it
fits beside them, and the best checkpoint so far is what gets exported.

A recipe is what differs between kinds: the taps the rows keep, the module and
objective trained, the training settings, and the file written. Block drafters
(DFlash, DSpark) read several tapped layers and propose a block; the MTP head
reads the target's final residual and chains (`power.drafters.mtp_head`).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from power import modes
from power.artifacts.contracts import DrafterHparams
from power.artifacts.digests import sha256_file
from power.artifacts.gguf_reader import ArtifactError
from power.modes import DFLASH, DFLASH2, DSPARK, MTP
from power.runtime.gguf_weights import GGUFFile
from power.runtime.speculators import mtp
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk
from power.runtime.trunks.gemma3 import ARCH as GEMMA3
from power.runtime.trunks.gemma3 import Gemma3Params

from . import export, generate, prompt_sets, resume, served, worth
from .budget import Budget, BudgetError
from .generate import Example
from .model import BlockDrafterNet, BlockObjective, GGUFTensors
from .mtp_head import ChainObjective, MTPHeadNet
from .train import Objective, Trainer, TrainSettings, training_precision
from .vocabulary import coverage, greedy_labels, ranked_tokens

KINDS = (MTP, DFLASH, DFLASH2, DSPARK)
MASK_TOKEN_NAMES = ("<mask>", "<|mask|>")
HELD_BACK_EVERY = 10  # every tenth generated sequence measures acceptance instead of training
HELD_BACK_MAX = 48  # sequences: the measurement's cost stays a small part of training's
COST_CONTEXT = 64  # tokens of held-back text the round costs are timed after (power.drafters.worth)
SERVED_WIDTHS = (3, 5, 7)  # the widths the served figure is replayed at (power.drafters.served), with the recommended K


@dataclass(frozen=True)
class DistillRequest:
    target: Path
    kind: str
    out: Path
    target_sha256: str | None = None  # the target as verified against its manifest (`power drafter distill`)
    fr: int | None = None
    budget_s: float = 20 * 60
    seed: int = 0
    prompts: Path | None = None
    corpus: Path | None = None
    max_prompts: int | None = None
    max_new_tokens: int = 128
    slots: int = 8
    corpus_window: int = 256
    corpus_share: float = 0.5  # of the data time, with a corpus: the rest generates the target's own text
    generate_share: float = 0.5
    max_steps: int = 100_000
    block_size: int = 11  # anchor + 10 drafts: K7 and K10 from one drafter
    layers: int = 2
    chain_levels: int = 3  # MTP: chain steps trained at once (the training-time test)
    precision: str = "auto"  # of training's products: `power.drafters.train.training_precision`
    progress: bool = True
    began: float | None = None  # the `time.monotonic()` instant the budget began (the command's start), else now


@dataclass(frozen=True)
class Distilled:
    drafter: Path
    manifest: Path
    profile: Path
    report: dict[str, Any]


def drafter_shape(request: DistillRequest, target: GGUFFile) -> DrafterHparams:
    """The drafter's hyper-parameters for this target: its width and vocabulary, taps low, middle and last."""
    arch = target.architecture
    width = int(target.require(f"{arch}.embedding_length"))
    trunk_layers = int(target.require(f"{arch}.block_count")) - int(target.get(f"{arch}.nextn_predict_layers", 0))
    taps = tuple(sorted({1, trunk_layers // 2, trunk_layers - 1}))
    head_dim = 64 if width % 64 == 0 else width // 4
    # One KV head: the drafter's ring stays small and its context rows cost one projection.
    return DrafterHparams(
        embedding_length=width, block_count=request.layers, feed_forward_length=2 * width,
        head_count=max(1, width // (2 * head_dim)), head_count_kv=1, head_dim=head_dim,
        vocab_size=target.info("token_embd.weight").shape[0],
        block_size=request.block_size, target_layers=taps, mask_token_id=_mask_token(target),
        rms_epsilon=1e-6, rope_freq_base=10_000.0,
        sliding_window=1024 if request.kind in (DFLASH, DFLASH2) else None,
        markov_rank=32 if request.kind == DSPARK else None,
        confidence_threshold=0.5 if request.kind == DSPARK else None,
        **(dflash2_shape(target, width) if request.kind == DFLASH2 else {}),
    )


def dflash2_shape(target: GGUFFile, width: int) -> dict[str, Any]:
    """DFlash2's convolution and selector, as the published Qwen3.6-27B DFlash2 drafter shapes them at a smaller width
    (kernel 4 over groups of 16 channels, the selector's rank 32 and top 8 candidates), with the target's own
    logit scale and softcap on the unary term."""
    arch = target.architecture
    return {"conv_kernel_size": 4, "conv_group_size": math.gcd(width, 16), "selector_rank": 32, "selector_top_k": 8,
            "logit_scale": float(target.get(f"{arch}.logit_scale", 1.0)),
            "final_logit_softcapping": float(target.get(f"{arch}.final_logit_softcapping", 0.0))}


def _mask_token(target: GGUFFile) -> int:
    tokens = target.get("tokenizer.ggml.tokens", [])
    found = next((i for i, t in enumerate(tokens) if t in MASK_TOKEN_NAMES), None)
    if found is None:
        raise ValueError(f"{target.path} has no mask token ({', '.join(MASK_TOKEN_NAMES)}) for the block's MASK rows")
    return found


@dataclass(frozen=True)
class BlockRecipe:
    """DFlash and DSpark: a block drafter of `hp` over the tapped layers."""

    matrices = export.BLOCK_MATRICES  # how the file stores them (a class constant, not a field)
    kind: str
    hp: DrafterHparams

    @property
    def taps(self) -> tuple[int, ...]:
        return self.hp.target_layers

    @property
    def hparams(self) -> dict[str, Any]:
        return asdict(self.hp)

    def settings(self) -> TrainSettings:
        return TrainSettings()

    def objective(self, target: GGUFFile, vocabulary: torch.Tensor | None, longest: int, seed: int) -> BlockObjective:
        net = BlockDrafterNet(self.kind, self.hp, *borrowed(target, vocabulary),
                              max_positions=longest + self.hp.block_size, seed=seed, draft_tokens=vocabulary)
        return BlockObjective(net)

    def write(self, path: Path, net: GGUFTensors, target: Path, name: str, draft_tokens: list[int] | None) -> Path:
        return export.write_drafter(path, self.kind, self.hp, net.tensors(), target, name, draft_tokens)


@dataclass(frozen=True)
class MTPRecipe:
    """A Gemma 3 MTP head (one nextn block) over the target's final residual, written as its MTP-only sidecar."""

    matrices = export.MTP_MATRICES  # how the file stores them (a class constant, not a field)
    params: Gemma3Params
    levels: int
    positions: int = 10  # chain length the acceptance is measured to (K7 and K10 from one head)

    @property
    def taps(self) -> tuple[int, ...]:
        return (self.params.n_layers,)

    @property
    def hparams(self) -> dict[str, Any]:
        return {**asdict(self.params), "chain_levels": self.levels}

    def settings(self) -> TrainSettings:
        # One step is 4 whole sequences, every position `levels` deep. Measured (bench/bench_distill.py, 80 steps):
        # 2e-3 reaches 0.72 accepted at K=7 on held-out prose, 1e-3 0.59.
        return TrainSettings(learning_rate=2e-3, warmup_steps=20)

    def objective(self, target: GGUFFile, vocabulary: torch.Tensor | None, longest: int, seed: int) -> ChainObjective:
        net = MTPHeadNet(self.params, *borrowed(target, vocabulary), max_positions=longest + 1, seed=seed,
                         draft_tokens=vocabulary)
        return ChainObjective(net, levels=self.levels, positions=self.positions)

    def write(self, path: Path, net: GGUFTensors, target: Path, name: str, draft_tokens: list[int] | None) -> Path:
        return export.write_mtp_sidecar(path, net.tensors(), target, name, draft_tokens)


Recipe = BlockRecipe | MTPRecipe


def recipe(request: DistillRequest, target: GGUFFile) -> Recipe:
    if request.kind not in KINDS:
        raise ValueError(f"power drafter distill trains {', '.join(KINDS)} drafters, not {request.kind!r}")
    if request.kind not in modes.NATIVE_HEADS:
        return BlockRecipe(request.kind, drafter_shape(request, target))
    if target.architecture != GEMMA3:
        arch = target.architecture
        why = (f"the runtime runs the MTP heads of {', '.join(sorted(mtp.BLOCKS))} targets, and "
               + (f"a {arch} model ships its own" if arch in mtp.BLOCKS
                  else f"no nextn layout is published for {arch} (docs/drafters.md)"))
        raise ArtifactError(f"--kind mtp trains a {GEMMA3} nextn head; {target.path} is a {arch} target: {why}",
                            code="PWR219", file=str(target.path),
                            hint=f"distil a block drafter for it: --kind {' or '.join(k for k in KINDS if k != MTP)}")
    return MTPRecipe(Gemma3Params.from_gguf(target), request.chain_levels)


def distill(request: DistillRequest) -> Distilled:
    """Generate, measure, train, write out and replay, each phase started only where its measured cost fits the
    budget (`power.drafters.budget`): the data by its share of the budget, then training until the next step would
    leave too little for the phases after it, whose costs are measured before the first step."""
    budget = Budget(request.budget_s, started=request.began)
    if request.began is not None:
        budget.charge("start", request.began)  # the command's imports and the inputs checked against the manifest
    torch.manual_seed(request.seed)
    target = GGUFFile(request.target)
    how = recipe(request, target)
    work = request.out / "resume"
    data_key = _data_key(request, how.taps)
    with budget.phase("data"):
        data = training_data(request, target, how.taps, work, budget.share(request.generate_share), data_key)
    train, held = data.split()
    examples = data.sequences
    if not train or not held:
        raise ValueError(f"{len(examples)} sequences are too few to train and measure on; give more prompts or budget")
    with budget.phase("measure"):
        vocabulary = ranked_tokens(train, request.fr or vocab_size(target), vocab_size(target))
        objective = how.objective(target, vocabulary, max(len(e.tokens) for e in examples), request.seed)
        settings = replace(how.settings(), seed=request.seed, max_steps=request.max_steps,
                           precision=training_precision(request.precision))
        trainer = Trainer(objective, settings, train, held, k=min(7, objective.positions))
        checkpoint, key = work / "checkpoint.pt", _checkpoint_key(data_key, how, settings, vocabulary)
        resumed = resume.load(checkpoint, key)
        if resumed is not None:
            _restore(trainer, resumed, checkpoint)
        costs, after = _measured_costs(request, how, trainer, vocabulary, data, work)
        trainer.measure_costs(lambda state: resume.save(checkpoint, key, state), budget.clock)
    _require_room(budget, trainer.closing_s + after.seconds(trainer.eval_s), work)
    with budget.phase("train"):
        best = trainer.run(budget, lambda state: resume.save(checkpoint, key, state), request.progress,
                           reserve=after.seconds)
    with budget.phase("written curve"):
        best = written_acceptance(trainer, how, best)
    return _export(request, how, objective, best, data, vocabulary, trainer, costs, budget, after)


@dataclass(frozen=True)
class AfterTraining:
    """What the phases after training cost, measured before its first step: writing the drafter out (and hashing it
    into its manifest), and the served replay's first sequence (its trunk and drafter loaded, then the sequence at
    every width, at an untrained drafter's rate: its rounds accept nothing, so it lays the most of them)."""

    export_s: float
    replay_s: float
    timed: served.Served | None  # the untrained drafter's replay (none without the target's own text to replay)

    def document(self, evaluation_s: float) -> dict[str, float]:
        """What was reserved for each phase after training, beside the seconds each took (the budget's phases)."""
        return {"written curve": round(evaluation_s, 3), "export": round(self.export_s, 3),
                "replay": round(self.replay_s, 3), "served estimate": round(evaluation_s, 3)}

    def seconds(self, evaluation_s: float) -> float:
        """Beside the written weights' curve and the estimate over the replayed sequences, each at most one held-back
        evaluation (`evaluation_s`)."""
        return self.export_s + self.replay_s + 2 * evaluation_s


def _measured_costs(request: DistillRequest, how: Recipe, trainer: Trainer, vocabulary: torch.Tensor | None,
                    data: TrainingData, work: Path) -> tuple[worth.Costs, AfterTraining]:
    """This machine's round costs (for the worth-it verdict) and the phases after training's, from the untrained
    drafter written as the trained one will be."""
    started = time.monotonic()
    untrained = how.write(work / "timing.gguf", trainer.net, request.target, "timing",
                          None if vocabulary is None else vocabulary.tolist())
    sha256_file(untrained)  # the manifest pins the drafter it writes
    export_s = time.monotonic() - started
    first = trainer.held[0]
    context = max(trainer.held, key=lambda e: len(e.tokens)).tokens[:COST_CONTEXT].tolist()
    costs = worth.measure(request.target, untrained, request.kind, range(1, DEEPEST_K + 1), context)
    if not data.generated:
        return costs, AfterTraining(export_s, 0.0, None)
    # loaded for every held-back sequence as the replay after training is, and stopped after the first by a budget
    # of nothing
    timed = served.replay(request.target, untrained, request.kind, trainer.held, SERVED_WIDTHS, Budget(0.0))
    replay_s = timed.setup_s + timed.sequence_s(first, len(SERVED_WIDTHS) + 1)  # the recommended K may be a 4th
    return costs, AfterTraining(export_s, replay_s, timed)


def _require_room(budget: Budget, needed: float, work: Path) -> None:
    """Refused (PWR027) when the phases after training would not fit: nothing is trained or written out."""
    if budget.fits(needed):
        return
    spent = budget.seconds - budget.left()
    raise BudgetError(f"--budget {budget.seconds:g} s: {spent:.0f} s went to verifying the inputs, generating the "
                      f"rows and measuring, and writing the drafter out needs {needed:.0f} s more (its last evaluation "
                      f"and checkpoint, the file and its manifest, one served sequence): no time is left to train",
                      hint=f"give --budget {math.ceil((spent + needed) / 60) + 1}m or more; the rows are kept in "
                           f"{work} and a rerun reuses them")


def written_acceptance(trainer: Trainer, how: Recipe, best: dict[str, Any]) -> dict[str, Any]:
    """The best state with its weights as the file stores them, and the held-back curve measured on those (what the
    runtime will run); `trained_curve` is the curve before the rounding."""
    net = trainer.net
    net.load_state_dict(best["state"])
    for name, value in export.stored(net.tensors(), how.matrices).items():
        net.tensor(name).data.copy_(value)
    return {**best, "curve": trainer.curve().to_json(), "trained_curve": best["curve"]}


def vocab_size(target: GGUFFile) -> int:
    return target.info("token_embd.weight").shape[0]


def borrowed(target: GGUFFile, vocabulary: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What a drafter borrows from the target: its token embedding [vocab, d] and its LM head (the embedding when
    tied) at the draft vocabulary's rows [N, d] (the whole head without one); each dequantised once."""
    embedding = target.tensor("token_embd.weight")
    head = target.tensor("output.weight") if target.has("output.weight") else embedding
    return embedding, head if vocabulary is None else head[vocabulary].clone()


@dataclass(frozen=True)
class TrainingData:
    """The rows a drafter trains on: the target's own greedy text and the operator's corpus, and what each cost."""

    generated: list[Example]
    corpus: list[Example]
    generated_s: float
    corpus_s: float

    @property
    def sequences(self) -> list[Example]:
        return self.corpus + self.generated

    def split(self) -> tuple[list[Example], list[Example]]:
        """(train, held back): the first HELD_BACK_MAX of every HELD_BACK_EVERY-th sequence of the target's own text
        (of the corpus when there is none) are held back to choose the best checkpoint on the text the drafter will
        serve; the rest trains."""
        measured, other = (self.generated, self.corpus) if self.generated else (self.corpus, [])
        chosen = set(range(0, len(measured), HELD_BACK_EVERY)[:HELD_BACK_MAX])
        held = [e for i, e in enumerate(measured) if i in chosen]
        return other + [e for i, e in enumerate(measured) if i not in chosen], held

    def plain(self) -> dict[str, Any]:
        """The rows and timings as plain tensors, numbers and lists (what DIR/resume/data.pt stores)."""
        return {"generated": [e.plain() for e in self.generated], "corpus": [e.plain() for e in self.corpus],
                "generated_s": self.generated_s, "corpus_s": self.corpus_s}

    @classmethod
    def from_plain(cls, state: dict[str, Any], vocab: int, width: int, path: Path) -> TrainingData:
        """`plain()`'s table read back from `path`, every row checked against the target (`Example.from_plain`)."""
        try:
            rows = {part: [Example.from_plain(row, vocab, width) for row in state[part]]
                    for part in ("generated", "corpus")}
            return cls(rows["generated"], rows["corpus"], float(state["generated_s"]), float(state["corpus_s"]))
        except (KeyError, TypeError, ValueError) as err:
            raise resume.invalid(path, f"is not rows of this target ({err})") from None

    def report(self) -> dict[str, Any]:
        return {"generated_sequences": len(self.generated), "generated_tokens": generate.token_count(self.generated),
                "generated_s": round(self.generated_s, 1), "corpus_windows": len(self.corpus),
                "corpus_tokens": generate.token_count(self.corpus), "corpus_s": round(self.corpus_s, 1)}


def _restore(trainer: Trainer, state: dict[str, Any], path: Path) -> None:
    try:
        trainer.restore(state)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as err:
        raise resume.invalid(path, f"is not a checkpoint of this drafter ({type(err).__name__}: "
                                   f"{str(err).splitlines()[0] if str(err) else ''})") from None


def training_data(request: DistillRequest, target: GGUFFile, taps: tuple[int, ...], work: Path,
                  deadline: float, key: str | None = None) -> TrainingData:
    """The rows to train on: from DIR/resume/data.pt when this request's inputs made them (`key`), else made now,
    by `deadline` (a `time.monotonic()` instant): the corpus first, for `corpus_share` of the time left, then the
    target's own text for the rest. A checkpoint trained on other rows is dropped."""
    key = key or _data_key(request, taps)
    cached = work / "data.pt"
    saved = resume.load(cached, key)
    if saved is not None:
        return TrainingData.from_plain(saved, vocab_size(target), len(taps) * _width(target), cached)
    resume.discard(work / "checkpoint.pt")  # trained on other rows: it cannot resume on these
    began = time.monotonic()
    tokenizer = Tokenizer.from_gguf(target)
    corpus: list[Example] = []
    if request.corpus is not None and request.corpus_share > 0:
        trunk = _trunk(target, request.corpus_window, slots=1)
        corpus = generate.corpus_examples(trunk, tokenizer, generate.read_corpus(request.corpus), taps,
                                          request.corpus_window, began + (deadline - began) * request.corpus_share,
                                          request.progress)
    read = time.monotonic()
    generated: list[Example] = []
    prompts = prompt_sets.load_prompts(request.prompts)[: request.max_prompts]
    if prompts and time.monotonic() < deadline:
        # a prompt longer than the target's context is cut to what the context holds beside the new tokens
        longest = min(max(len(tokenizer.encode(p.text)) for p in prompts), _prompt_room(request, target))
        trunk = _trunk(target, longest + request.max_new_tokens, slots=request.slots)
        generated = generate.self_generated(trunk, tokenizer, prompts, taps, request.max_new_tokens, deadline,
                                            request.progress)
    data = TrainingData(generated, corpus, time.monotonic() - read, read - began)
    resume.save(cached, key, data.plain())
    return data


def _prompt_room(request: DistillRequest, target: GGUFFile) -> int:
    context = _context(target)
    if context - request.max_new_tokens < 2:
        raise ValueError(f"--max-new-tokens {request.max_new_tokens} leaves no room for a prompt in the target's "
                         f"context of {context} tokens")
    return context - request.max_new_tokens


def _context(target: GGUFFile) -> int:
    return int(target.get(f"{target.architecture}.context_length", export.DEFAULT_CTX))


def _width(target: GGUFFile) -> int:
    return int(target.require(f"{target.architecture}.embedding_length"))


def _trunk(target: GGUFFile, n_ctx: int, slots: int):
    return load_trunk(target, n_ctx=n_ctx, verify_capacity=slots, slots=slots)


def _data_key(request: DistillRequest, taps: tuple[int, ...]) -> str:
    """What made the rows: the target, the taps, the prompts' and the corpus's own text, the lengths. The target is
    named by the sha256 its manifest pinned, not by its path: a drafter folder copied to another machine, or a
    target moved to another checkout, trains on from its rows and checkpoint."""
    prompts = [(p.shape, p.text) for p in prompt_sets.load_prompts(request.prompts)[: request.max_prompts]]
    corpus = (hashlib.sha256(prompt_sets.read_input(request.corpus, prompt_sets.MAX_CORPUS_BYTES).encode()).hexdigest()
              if request.corpus is not None else None)
    inputs = {"target": request.target_sha256 or str(request.target), "taps": taps, "prompts": prompts,
              "corpus": corpus,
              "corpus_share": request.corpus_share if corpus else None, "rows": "generated+corpus",
              "max_new": request.max_new_tokens, "window": request.corpus_window,
              "size": request.target.stat().st_size}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _checkpoint_key(data_key: str, how: Recipe, settings: TrainSettings, vocabulary: torch.Tensor | None) -> str:
    """What a checkpoint trained: these rows, this module's shape, these settings, this draft vocabulary. Not the
    step count: a step is the same step whatever the last one will be, so a rerun with more steps or more budget
    trains on from where the last run stopped."""
    trained = {name: value for name, value in asdict(settings).items() if name != "max_steps"}
    inputs = {"data": data_key, "recipe": type(how).__name__, "hparams": how.hparams, "settings": trained,
              "vocabulary": None if vocabulary is None else vocabulary.tolist()}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


# The deepest K a distilled profile recommends, and the confidence gate it gives a gated kind: on the held-out
# benches of docs/drafters.md (2 CPU cores, AVX-512 and AVX2 machines) K10 lost to K7 on every shape but one tie
# (its extra verification rows and draft steps cost more than its acceptance buys), and the gate 0.3 ran n-gram -> MTP
# as fast or faster than ungated on every shape of two runs (prose 2.01x against 1.39x, chat 3.00x against 2.79x).
DEEPEST_K = 7
GATE = 0.3


def recommend(curve: dict[str, Any], ctx: int, kind: str) -> export.Recommendation:
    """K: the deepest draft position still accepted at least a quarter of the time it is reached, at most
    DEEPEST_K (S = K: an attention-only target rewinds any length, and a recurrent one then never replays); the
    gate GATE for a kind whose drafts it cuts (`power.modes` confidence_gate) and that keeps no gate of its own."""
    per_position = curve["per_position"][:DEEPEST_K]
    k = max([1] + [e + 1 for e, p in enumerate(per_position) if p >= 0.25 and all(q >= 0.25 for q in per_position[:e])])
    gate = GATE if modes.mode(kind).confidence_gate and kind != DSPARK else None
    return export.Recommendation(k=k, s=k, ctx=ctx, p_min=gate)


def _export(request: DistillRequest, how: Recipe, objective: Objective, best: dict[str, Any],
            data: TrainingData, vocabulary: torch.Tensor | None, trainer: Trainer, costs: worth.Costs,
            budget: Budget, after: AfterTraining) -> Distilled:
    out = request.out
    name = f"{request.target.stem}-{request.kind}"
    net = objective.net
    target = GGUFFile(request.target)
    advice = recommend(best["curve"], min(_context(target), export.DEFAULT_CTX), request.kind)
    with budget.phase("export"):
        drafter = how.write(out / f"{name}.gguf", net, request.target, name,
                            None if vocabulary is None else vocabulary.tolist())
        manifest = export.write_manifest(out / "manifest.toml", name, request.target, target.architecture,
                                         request.kind, drafter, request.target_sha256)
        profile = export.write_profile(out / "profile.toml", f"{name}-k{advice.k}s{advice.s}", request.kind, advice)
    replayed = _served(request, drafter, trainer, data, sorted({*SERVED_WIDTHS, advice.k}), budget, after)
    examples = data.sequences
    labels = greedy_labels(examples)
    report = {
        "kind": request.kind, "target": request.target.name, "seed": request.seed, "hparams": how.hparams,
        "settings": asdict(trainer.settings),
        "parameters": sum(p.numel() for p in net.parameters()),
        "sequences": len(examples), "tokens": generate.token_count(examples), "labelled_rows": int(len(labels)),
        "draft_vocab": len(net.head), "draft_vocab_coverage_held_back": round(coverage(trainer.held, vocabulary), 4),
        "data": data.report(), "data_s": round(data.generated_s + data.corpus_s, 1),
        "train_s": round(trainer.trained_s, 1), "total_s": round(budget.clock() - budget.started, 1),
        "steps": trainer.step, "resumed_from_step": trainer.resumed_from, "best_step": best["step"],
        "acceptance": best["curve"],
        "acceptance_before_rounding": best["trained_curve"],
        "served": replayed,
        "recommended": asdict(advice),
        "round_costs": costs.document(),  # this machine's, for the worth-it verdict (power.drafters.worth)
        "budget": budget.document() | {"reserved_s": after.document(trainer.eval_s)},
    }
    export.report(out / "distill.json", report)
    return Distilled(drafter, manifest, profile, report)


def _served(request: DistillRequest, drafter: Path, trainer: Trainer, data: TrainingData, widths: list[int],
            budget: Budget, after: AfterTraining) -> dict[str, Any] | None:
    """The served replay, on the target's own text (a corpus is not what the target says), until its budget, and
    training's estimate over the sequences it reached."""
    if not data.generated:
        return None
    with budget.phase("replay"):
        replayed = served.replay(request.target, drafter, request.kind, trainer.held, widths, budget,
                                 measured=after.timed, reserve_s=trainer.eval_s)
    with budget.phase("served estimate"):
        return replayed.document(trainer.curve(trainer.held[:replayed.sequences]).to_json()["estimate"])
