"""PWR21x: each drafter against its header's contract and its binding to the target's digest.

The contract itself (kind from the header, required keys and tensors) is
`power.artifacts.contracts`; this module applies it to a manifest's drafters.
"""

from __future__ import annotations

from power import modes
from power.artifacts import contracts
from power.findings import Finding
from power.orchestrator.inputs.loading import Loaded
from power.orchestrator.planning.checks.artifacts import Checked


def check_drafter(manifest: Loaded, index: int, declared, checked: Checked | None, target: Checked) -> list[Finding]:
    """Contract and binding findings for `drafters[index]` (`checked` is its own file: a file-backed drafter or an MTP
    sidecar; None for a head in the target or weight-free n-gram)."""
    kind = declared.kind
    if kind in modes.NATIVE_HEADS and checked is None:
        return _at_declaration(manifest, index, contracts.contract_violations(target.facts, kind))
    if checked is None:
        return []
    findings = _at_declaration(manifest, index, contracts.contract_violations(checked.facts, kind))
    if kind in modes.NATIVE_HEADS and not findings:  # an MTP-only sidecar: the head of this target's model
        findings += contracts.sidecar_violations(checked.facts, target.facts)
    return findings + binding_findings(manifest, index, declared, target)


def binding_findings(manifest: Loaded, index: int, declared, target: Checked) -> list[Finding]:
    """PWR213: the drafter's `target_sha256` is not the target's digest."""
    bound_to = declared.target_sha256
    if bound_to is None or target.sha256 is None or bound_to == target.sha256:
        return []
    return [manifest.finding(
        "PWR213", f"drafters[{index}] ({declared.kind}) is bound to target {bound_to[:16]}..., but the target is "
        f"{target.sha256[:16]}...", where=f"drafters[{index}].target_sha256",
        hint="use the drafter built for this target; a drafter reads its own target's hidden states")]


# A declared kind the header contradicts is fixed in the manifest: point at the `kind` line.
DECLARATION_CODES = ("PWR210", "PWR212")


def _at_declaration(manifest: Loaded, index: int, findings: list[Finding]) -> list[Finding]:
    return [manifest.finding(f.code, f"{f.file}: {f.message}", where=f"drafters[{index}].kind", hint=f.hint)
            if f.code in DECLARATION_CODES else f for f in findings]


def contract_facts(kind: str, checked: Checked | None,
                   target: Checked) -> dict[str, int | float | str | bool | tuple[int, ...]]:
    """The header facts a plan records for a drafter (what the runtime and renderers need, nothing else)."""
    if kind in modes.NATIVE_HEADS:
        return {"nextn_predict_layers": contracts.nextn_layer_count((checked or target).facts)}
    if checked is None:
        return {}
    hp = contracts.drafter_hparams(checked.facts)
    facts: dict = {
        "block_size": hp.block_size, "n_layers": hp.block_count, "head_count_kv": hp.head_count_kv,
        "head_dim": hp.head_dim, "target_layers": hp.target_layers, "mask_token_id": hp.mask_token_id,
        "kv_bytes_per_position": checked.facts.drafter_kv_bytes_per_position,
    }
    optional = {"sliding_window": hp.sliding_window, "markov_rank": hp.markov_rank,
                "confidence_threshold": hp.confidence_threshold, "conv_kernel_size": hp.conv_kernel_size,
                "selector_top_k": hp.selector_top_k}
    return facts | {key: value for key, value in optional.items() if value is not None}
