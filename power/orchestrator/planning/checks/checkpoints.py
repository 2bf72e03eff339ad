"""A drafter given as a Hugging Face checkpoint folder (for vLLM), against what the manifest declares and the
target it serves: each file's presence, size and sha256 (PWR110-PWR112); its config.json's kind (PWR210), target
depth, vocabulary, width and the target layers it reads (PWR211); its binding (PWR213); its tokenizer.json
against the target GGUF's vocabulary, token by token (PWR310; PWR311 when it carries none and so reads the
target's ids as they are)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from power import modes
from power.artifacts.checkpoint import TOKENIZER, CheckpointFacts, listing_sha256, read_checkpoint
from power.artifacts.facts import ArtifactError
from power.artifacts.tokenizer_facts import TokenizerFacts
from power.findings import Finding, Severity
from power.orchestrator.engines.sizing.model import whole
from power.orchestrator.inputs.loading import Loaded
from power.orchestrator.planning.checks.artifacts import ArtifactSource, Checked
from power.orchestrator.planning.checks.drafters import binding_findings

EAGLE3_FUSED_STATES = 3  # vLLM's EAGLE-3 `fc` fuses three target hidden states (llama_eagle3.py)


@dataclass(frozen=True)
class CheckedCheckpoint:
    facts: CheckpointFacts
    files: tuple[tuple[str, int, str], ...]  # (name, size, sha256) in the manifest's order

    @property
    def size(self) -> int:
        return sum(size for _, size, _ in self.files)

    @property
    def sha256(self) -> str:
        return listing_sha256([(name, digest) for name, _, digest in self.files])


def check_checkpoint(manifest: Loaded, index: int, declared, memo: ArtifactSource, target: Checked,
                     target_layers: int, target_vocab: int) -> tuple[CheckedCheckpoint | None, list[Finding]]:
    """The checkpoint `drafters[index]` names, checked file by file and against the target; None on any error."""
    here = f"drafters[{index}]"
    folder = Path(declared.path)
    if not folder.is_dir():
        return None, [manifest.finding("PWR110", f"{here}.path: {folder} is not a folder (a checkpoint drafter is "
                                       "one)", where=f"{here}.path", hint="run `power pull MANIFEST`, or fix the path")]
    files, findings = _files(manifest, here, folder, declared.files, memo)
    if findings:
        return None, findings
    try:
        facts = read_checkpoint(folder, [name for name, _, _ in files])
    except ArtifactError as err:
        return None, [err.finding]
    target_width = whole(target.facts.hparam("embedding_length"))
    findings = _contract(manifest, here, declared.kind, facts, (target_layers, target_vocab, target_width))
    findings += binding_findings(manifest, index, declared, target)
    findings += tokenizer_findings(index, declared.kind, facts, target.facts.tokenizer)
    errors = [f for f in findings if f.is_error]
    return (None if errors else CheckedCheckpoint(facts, tuple(files))), findings


def _files(manifest: Loaded, here: str, folder: Path, declared, memo: ArtifactSource
           ) -> tuple[list[tuple[str, int, str]], list[Finding]]:
    files, findings = [], []
    for number, entry in enumerate(declared):
        where, path = f"{here}.files[{number}]", folder / entry.name
        if not path.is_file():
            findings.append(manifest.finding("PWR110", f"{where}: {path} does not exist", where=f"{where}.name",
                                             hint="run `power pull MANIFEST` to fetch the checkpoint"))
            continue
        size = path.stat().st_size
        if entry.size is not None and size != entry.size:
            findings.append(manifest.finding("PWR111", f"{where}: {path} is {size:,} bytes, the manifest declares "
                                             f"{entry.size:,}", where=f"{where}.size",
                                             hint="restore the published file"))
            continue
        digest = memo.sha256(path)
        if entry.sha256 is not None and digest != entry.sha256:
            findings.append(manifest.finding("PWR112", f"{where}: {path} has sha256 {digest}, the manifest declares "
                                             f"{entry.sha256}", where=f"{where}.sha256",
                                             hint="restore the published file"))
            continue
        files.append((entry.name, size, digest))
    return files, findings


def _contract(manifest: Loaded, here: str, kind: str, facts: CheckpointFacts,
              target: tuple[int, int, int]) -> list[Finding]:
    """config.json's kind, and what it says of the target it was built for against this target's (layers,
    vocabulary, width)."""
    if facts.kind != kind:
        return [manifest.finding("PWR210", f"{here}: the checkpoint's config.json names {facts.architecture}, "
                                 f"{'a ' + facts.kind if facts.kind else 'no'} drafter kind, not {kind}",
                                 where=f"{here}.kind", hint="declare the kind the checkpoint is, or "
                                 f"point `path` at the {kind} checkpoint")]
    layers, vocab, width = target
    fused = facts.target_hidden_size or (facts.hidden_size if kind == modes.EAGLE3 else None)
    findings = [manifest.finding("PWR211", f"{here}: the checkpoint was built for a target of {theirs:,} {what}; this "
                                 f"target has {ours:,}", where=f"{here}.path",
                                 hint="use the drafter checkpoint built for this target")
                for what, theirs, ours in (("target layers (num_target_layers)", facts.target_layers, layers),
                                           ("vocabulary (vocab_size)", facts.vocab_size, vocab),
                                           ("hidden size (target_hidden_size)", fused, width))
                if theirs is not None and theirs != ours]
    return findings + [manifest.finding("PWR211", f"{here}: the checkpoint's config.json {problem}",
                                        where=f"{here}.path", hint="use the drafter checkpoint built for this target")
                       for problem in _inconsistencies(kind, facts, layers)]


def _inconsistencies(kind: str, facts: CheckpointFacts, layers: int) -> list[str]:
    """What config.json says that vLLM could not build against this target: a hidden state read from a layer the
    target lacks, EAGLE-3's fused states not three, a draft head larger than the vocabulary it maps onto."""
    problems = []
    ids = facts.aux_layer_ids or ()
    outside = [i for i in ids if not 0 <= i < layers]
    if outside:
        problems.append(f"reads the hidden states of target layers {list(ids)}; this target has layers 0-{layers - 1}")
    if kind == modes.EAGLE3 and facts.aux_layer_ids is not None and len(ids) != EAGLE3_FUSED_STATES:
        problems.append(f"names {len(ids)} target layers (eagle_aux_hidden_state_layer_ids); vLLM's EAGLE-3 fuses "
                        f"{EAGLE3_FUSED_STATES}")
    if (
        facts.draft_vocab_size is not None
        and facts.vocab_size is not None
        and facts.draft_vocab_size > facts.vocab_size
    ):
        problems.append(f"draft_vocab_size {facts.draft_vocab_size:,} exceeds its vocab_size {facts.vocab_size:,}")
    return problems


def tokenizer_findings(index: int, kind: str, facts: CheckpointFacts, target: TokenizerFacts | None) -> list[Finding]:
    """The checkpoint's tokenizer.json against the target's vocabulary: each of its ids must be the target's token
    (a GGUF may pad its vocabulary past the tokenizer's), and its merges the target's."""
    place = str(facts.folder / TOKENIZER)
    if facts.tokens is None or target is None:
        return [Finding("PWR311", Severity.INFO, f"drafters[{index}] ({kind}): the checkpoint carries no "
                        f"{TOKENIZER}; the drafter uses the target's token ids as they are", file=str(facts.folder))]
    theirs = target.vocabulary
    ours = facts.tokens
    differences = []
    first = next((i for i, token in enumerate(ours) if i >= len(theirs.tokens) or theirs.tokens[i] != token), None)
    if first is not None:
        target_token = repr(theirs.tokens[first]) if first < len(theirs.tokens) else "(none)"
        differences.append(f"token at id {first}: {ours[first]!r} vs the target's {target_token}")
    if facts.merges and theirs.merges and facts.merges != theirs.merges:
        at = next((i for i, (a, b) in enumerate(zip(facts.merges, theirs.merges, strict=False)) if a != b),
                  min(len(facts.merges), len(theirs.merges)))
        differences.append(f"merges differ from index {at}")
    if not differences:
        return []
    return [Finding("PWR310", Severity.ERROR, f"drafters[{index}] ({kind}): the checkpoint's tokenizer differs from "
                    "the target's: " + "; ".join(differences), file=place,
                    hint="use a drafter checkpoint built for the target's tokenizer")]
