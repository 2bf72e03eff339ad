"""The drafter contracts: what a GGUF header must carry to be a DFlash v1, DFlash2, DSpark or MTP drafter.

This module is the one place the contracts are defined; `docs/contracts.md` explains
them and the artifact factory builds its fixtures from the shapes given here.

Shapes are row-major (numpy / torch) order, `[out_features, in_features]` for a
matrix: the GGUF header stores the same dimensions reversed (`ne0` first), as
llama.cpp's `create_tensor({n_embd, n_ff})` spells them.

The header decides the kind, never the file name:

- `general.architecture = dflash` without the DFlash2 keys or tensors -> `dflash`
- `general.architecture = dflash` with any convolution/selector key or tensor -> `dflash2`
- `general.architecture = dspark` -> `dspark`
- any other architecture with `{arch}.nextn_predict_layers > 0` or `nextn` tensors -> `mtp`
- otherwise no drafter contract (`None`).

Drafters borrow the target's token embedding and LM head and carry none of their
own. DFlash/DFlash2/DSpark read the target's residuals entering `target_layers`;
`fc` maps their concatenation to the drafter width, which equals the target's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Protocol, TypeGuard, TypeVar

from power.findings import Finding, Severity
from power.modes import ARCHITECTURE_OF, DFLASH, DFLASH2, DSPARK, HEADER_CONTRACT, MTP

INT = "int"
FLOAT = "float"
INT_ARRAY = "int[]"

# Keys every block drafter carries, without the `{arch}.` prefix.
BACKBONE_KEYS: dict[str, str] = {
    "embedding_length": INT,
    "block_count": INT,
    "feed_forward_length": INT,
    "attention.head_count": INT,
    "attention.head_count_kv": INT,
    "attention.key_length": INT,
    "attention.layer_norm_rms_epsilon": FLOAT,
    "rope.freq_base": FLOAT,
    "vocab_size": INT,
    "block_size": INT,  # tokens proposed per block: anchor + (block_size - 1) drafts
    "target_layers": INT_ARRAY,  # target layers whose entering residuals feed `fc`
    "mask_token_id": INT,  # the MASK id filling a block's undrafted positions
}
DFLASH_KEYS = {**BACKBONE_KEYS, "attention.sliding_window": INT}
DFLASH2_EXTRA_KEYS: dict[str, str] = {
    "conv_kernel_size": INT,
    "conv_group_size": INT,
    "selector_rank": INT,
    "selector_top_k": INT,
    "logit_scale": FLOAT,
    "final_logit_softcapping": FLOAT,
}
DSPARK_EXTRA_KEYS: dict[str, str] = {
    "markov_rank": INT,
    "confidence_threshold": FLOAT,  # verify stops at the first drafted position below it
}
REQUIRED_KEYS: dict[str, dict[str, str]] = {
    DFLASH: DFLASH_KEYS,
    DFLASH2: {**DFLASH_KEYS, **DFLASH2_EXTRA_KEYS},
    DSPARK: {**BACKBONE_KEYS, **DSPARK_EXTRA_KEYS},
}

# Block drafters are a few layers deep; the contract enumerates tensors per layer, so it is bounded.
MAX_DRAFTER_BLOCKS = 256
DFLASH2_MARKER_TENSORS = ("selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight")
CONV_SUBLAYERS = ("attn", "ffn")

_T = TypeVar("_T")


class HeaderView(Protocol):
    """What the contracts read from an artifact (ArtifactFacts provides it); read-only."""

    @property
    def path(self) -> str: ...

    @property
    def architecture(self) -> str: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    @property
    def tensor_shapes(self) -> Mapping[str, tuple[int, ...]]: ...


@dataclass(frozen=True)
class DrafterHparams:
    """The hyper-parameters a block drafter's tensor shapes are functions of."""

    embedding_length: int
    block_count: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    head_dim: int
    vocab_size: int
    block_size: int
    target_layers: tuple[int, ...]
    mask_token_id: int
    rms_epsilon: float = 1e-6
    rope_freq_base: float = 1_000_000.0
    sliding_window: int | None = None
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None
    logit_scale: float | None = None
    final_logit_softcapping: float | None = None
    markov_rank: int | None = None
    confidence_threshold: float | None = None


# Each DrafterHparams field's header key (after `{arch}.`), in the order the artifact factory writes them.
HPARAM_KEYS: dict[str, str] = {
    "embedding_length": "embedding_length",
    "block_count": "block_count",
    "feed_forward_length": "feed_forward_length",
    "head_count": "attention.head_count",
    "head_count_kv": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rms_epsilon": "attention.layer_norm_rms_epsilon",
    "rope_freq_base": "rope.freq_base",
    "vocab_size": "vocab_size",
    "block_size": "block_size",
    "target_layers": "target_layers",
    "mask_token_id": "mask_token_id",
    "sliding_window": "attention.sliding_window",
    "conv_kernel_size": "conv_kernel_size",
    "conv_group_size": "conv_group_size",
    "selector_rank": "selector_rank",
    "selector_top_k": "selector_top_k",
    "logit_scale": "logit_scale",
    "final_logit_softcapping": "final_logit_softcapping",
    "markov_rank": "markov_rank",
    "confidence_threshold": "confidence_threshold",
}


def backbone_tensors(hp: DrafterHparams) -> dict[str, tuple[int, ...]]:
    """The DFlash backbone (shared by DFlash v1, DFlash2 and DSpark): 11 per layer + fc + two norms."""
    d = hp.embedding_length
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (d, len(hp.target_layers) * d),
        "enc.output_norm.weight": (d,),
        "output_norm.weight": (d,),
    }
    for i in range(hp.block_count):
        shapes |= qk_norm_block_tensors(i, d, hp.head_count, hp.head_count_kv, hp.head_dim, hp.feed_forward_length)
    return shapes


def qk_norm_block_tensors(layer: int, d: int, head_count: int, head_count_kv: int, head_dim: int,
                          feed_forward_length: int) -> dict[str, tuple[int, ...]]:
    """One qwen3-style block (11 tensors): attention with per-head q/k norms, then a SwiGLU FFN."""
    b, q_width, kv_width = f"blk.{layer}.", head_count * head_dim, head_count_kv * head_dim
    return {
        b + "attn_norm.weight": (d,),
        b + "attn_q.weight": (q_width, d),
        b + "attn_k.weight": (kv_width, d),
        b + "attn_v.weight": (kv_width, d),
        b + "attn_q_norm.weight": (head_dim,),
        b + "attn_k_norm.weight": (head_dim,),
        b + "attn_output.weight": (d, q_width),
        b + "ffn_norm.weight": (d,),
        b + "ffn_gate.weight": (feed_forward_length, d),
        b + "ffn_up.weight": (feed_forward_length, d),
        b + "ffn_down.weight": (d, feed_forward_length),
    }


def gemma3_block_tensors(layer: int, d: int, head_count: int, head_count_kv: int, key_length: int, value_length: int,
                         feed_forward_length: int) -> dict[str, tuple[int, ...]]:
    """One Gemma 3 block (13 tensors): attention with per-head q/k norms and a post-attention norm, then a GeGLU FFN
    with a post-FFN norm (llama.cpp's names)."""
    b = f"blk.{layer}."
    return {
        b + "attn_norm.weight": (d,),
        b + "attn_q.weight": (head_count * key_length, d),
        b + "attn_k.weight": (head_count_kv * key_length, d),
        b + "attn_v.weight": (head_count_kv * value_length, d),
        b + "attn_q_norm.weight": (key_length,),
        b + "attn_k_norm.weight": (key_length,),
        b + "attn_output.weight": (d, head_count * value_length),
        b + "post_attention_norm.weight": (d,),
        b + "ffn_norm.weight": (d,),
        b + "ffn_gate.weight": (feed_forward_length, d),
        b + "ffn_up.weight": (feed_forward_length, d),
        b + "ffn_down.weight": (d, feed_forward_length),
        b + "post_ffw_norm.weight": (d,),
    }


def dflash2_extra_tensors(hp: DrafterHparams) -> dict[str, tuple[int, ...]]:
    """DFlash2's grouped dynamic convolution (2 tensors per sublayer) and the candidate selector (3 tensors).

    `{s}_conv_base` holds the static taps: rows [0, K) filter the sublayer's input, rows
    [K, 2K) its output. `{s}_conv_proj` maps the sublayer's input to the dynamic per-group
    deltas, laid out [2 (input, output), K taps, d / conv_group_size groups].
    """
    d = hp.embedding_length
    k, r = required(hp.conv_kernel_size, "conv_kernel_size"), required(hp.selector_rank, "selector_rank")
    groups = d // required(hp.conv_group_size, "conv_group_size")
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(hp.block_count):
        for sublayer in CONV_SUBLAYERS:
            shapes[f"blk.{i}.{sublayer}_conv_base.weight"] = (2 * k, d)
            shapes[f"blk.{i}.{sublayer}_conv_proj.weight"] = (2 * k * groups, d)
    shapes |= {
        "selector_predecessor.weight": (hp.vocab_size, r),
        "selector_successor.weight": (hp.vocab_size, r),
        "selector_hidden.weight": (r, d),
    }
    return shapes


def dspark_extra_tensors(hp: DrafterHparams) -> dict[str, tuple[int, ...]]:
    """DSpark's sequential Markov head and its confidence head.

    Markov head, per block position e: h'_e = h_e + output(hidden(h_e) * token_embd[pred_e])
    with pred_0 the anchor and pred_e the token drafted at e-1, normed by `markov.norm`
    before the target's LM head. Confidence head: sigmoid(confidence.weight @ h'_e + bias).
    """
    d, r = hp.embedding_length, required(hp.markov_rank, "markov_rank")
    return {
        "markov.token_embd.weight": (hp.vocab_size, r),
        "markov.hidden.weight": (r, d),
        "markov.output.weight": (d, r),
        "markov.norm.weight": (d,),
        "confidence.weight": (1, d),
        "confidence.bias": (1,),
    }


# How Power's runtime holds a block drafter's tensors (power.runtime.speculators.dflash; its sizing counts the same):
# the matrices that multiply activations in their GGUF blocks, as the target's; the table a DSpark Markov head reads
# one row of per token as its GGUF rows; everything else (norms, convolution taps, the confidence head, DFlash2's
# selector codebooks) in float32.
PRODUCT, ROWS, FLOAT32 = "product", "rows", "float32"
_DRAFTER_PRODUCTS = ("fc.weight", "selector_hidden.weight", "markov.hidden.weight", "markov.output.weight")
_LAYER_PRODUCTS = tuple(f"{name}.weight" for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                      "ffn_down", *(f"{s}_conv_proj" for s in CONV_SUBLAYERS)))
_ROW_TABLES = ("markov.token_embd.weight",)


def drafter_tensor_role(name: str) -> str:
    """PRODUCT, ROWS or FLOAT32: how the runtime holds a block drafter's tensor `name`."""
    if name in _DRAFTER_PRODUCTS or (name.startswith("blk.") and name.split(".", 2)[2] in _LAYER_PRODUCTS):
        return PRODUCT
    return ROWS if name in _ROW_TABLES else FLOAT32


def required(value: _T | None, key: str) -> _T:
    """A hyper-parameter `key` that the drafter's kind requires (the key checks refuse a header without it)."""
    if value is None:
        raise ValueError(f"the drafter's header has no {key}, which its kind requires")
    return value


def drafter_tensors(kind: str, hp: DrafterHparams) -> dict[str, tuple[int, ...]]:
    """Every tensor a `kind` drafter with hyper-parameters `hp` must carry, with its shape."""
    shapes = backbone_tensors(hp)
    if kind == DFLASH2:
        shapes |= dflash2_extra_tensors(hp)
    elif kind == DSPARK:
        shapes |= dspark_extra_tensors(hp)
    return shapes


def nextn_tensors(layer: int, embedding_length: int) -> dict[str, tuple[int, ...]]:
    """The MTP/nextn tensors a target carries in each of its last `nextn_predict_layers` blocks.

    The block is otherwise a full-attention block of the target (its own attn_* and ffn_*
    tensors). `eh_proj` maps concat(enorm(embedding), hnorm(hidden)) to the model width.
    `embed_tokens` and `shared_head_head` are optional: without them the target's own
    token embedding and LM head are used.
    """
    d = embedding_length
    return {
        f"blk.{layer}.nextn.eh_proj.weight": (d, 2 * d),
        f"blk.{layer}.nextn.enorm.weight": (d,),
        f"blk.{layer}.nextn.hnorm.weight": (d,),
        f"blk.{layer}.nextn.shared_head_norm.weight": (d,),
    }


def mtp_sidecar_metadata(arch: str, target: Mapping[str, Any], vocab_size: int) -> dict[str, Any]:
    """The `{arch}.*` keys of a target's MTP-only file with one nextn block (what `convert_hf_to_gguf.py --mtp`
    writes): the target's own, the block counted in `block_count`, `nextn_predict_layers = 1`, and `vocab_size`
    (the file carries no embedding to count it from)."""
    own = {key: value for key, value in target.items() if key.startswith(f"{arch}.")}
    return {**own, f"{arch}.block_count": int(target[f"{arch}.block_count"]) + 1, f"{arch}.nextn_predict_layers": 1,
            f"{arch}.vocab_size": vocab_size}


def drafter_metadata(kind: str, hp: DrafterHparams) -> dict[str, Any]:
    """The metadata keys (fully qualified) a `kind` drafter with `hp` carries; used by the factory."""
    values: dict[str, Any] = {key: getattr(hp, name) for name, key in HPARAM_KEYS.items()}
    values[HPARAM_KEYS["target_layers"]] = list(hp.target_layers)
    return {f"{ARCHITECTURE_OF[kind]}.{key}": value for key, value in values.items() if value is not None}


def drafter_hparams(view: HeaderView) -> DrafterHparams:
    """Read a block drafter's hyper-parameters from its header; a missing or mistyped value reads as 0, None or the
    field's default (the key checks report it)."""
    defaults: dict[str, Any] = {hparam.name: hparam.default for hparam in fields(DrafterHparams)}

    def value_of(name: str) -> Any:
        return view.metadata.get(f"{view.architecture}.{HPARAM_KEYS[name]}")

    def whole(name: str) -> int:
        value = value_of(name)
        return value if _is_int(value) else 0

    def optional_whole(name: str) -> int | None:
        value = value_of(name)
        return value if _is_int(value) else None

    def real(name: str) -> float:
        value = optional_real(name)
        return defaults[name] if value is None else value

    def optional_real(name: str) -> float | None:
        value = value_of(name)
        return float(value) if _is_number(value) else None

    layers = value_of("target_layers")
    return DrafterHparams(
        embedding_length=whole("embedding_length"),
        block_count=whole("block_count"),
        feed_forward_length=whole("feed_forward_length"),
        head_count=whole("head_count"),
        head_count_kv=whole("head_count_kv"),
        head_dim=whole("head_dim"),
        vocab_size=whole("vocab_size"),
        block_size=whole("block_size"),
        target_layers=tuple(layers) if _has_type(layers, INT_ARRAY) else (),
        mask_token_id=whole("mask_token_id"),
        rms_epsilon=real("rms_epsilon"),
        rope_freq_base=real("rope_freq_base"),
        sliding_window=optional_whole("sliding_window"),
        conv_kernel_size=optional_whole("conv_kernel_size"),
        conv_group_size=optional_whole("conv_group_size"),
        selector_rank=optional_whole("selector_rank"),
        selector_top_k=optional_whole("selector_top_k"),
        logit_scale=optional_real("logit_scale"),
        final_logit_softcapping=optional_real("final_logit_softcapping"),
        markov_rank=optional_whole("markov_rank"),
        confidence_threshold=optional_real("confidence_threshold"),
    )


def draft_tokens_key(architecture: str) -> str:
    """The header key of a drafter's own draft vocabulary: the target token IDs its head drafts, most frequent
    first (EAGLE-3's draft-to-target map, arXiv:2503.01840). Optional; without it the head drafts every ID."""
    return f"{architecture}.draft_tokens"


def declared_draft_tokens(view: HeaderView) -> list[int] | None:
    """The draft vocabulary the header declares (None when it declares none)."""
    value = view.metadata.get(draft_tokens_key(view.architecture))
    return list(value) if isinstance(value, (list, tuple, memoryview)) else None


def _draft_tokens_violations(view: HeaderView, vocab: int) -> list[Finding]:
    """The draft vocabulary, when declared: distinct target token IDs below the target's vocabulary."""
    key = draft_tokens_key(view.architecture)
    if key not in view.metadata:
        return []
    tokens = declared_draft_tokens(view) or []
    hint = "re-export the drafter (power drafter distill writes its draft vocabulary from its training text)"
    if not tokens or not all(_is_int(t) for t in tokens):
        return [_finding("PWR211", f"{key} must be a non-empty array of token IDs", view, hint)]
    outside = [t for t in tokens if not 0 <= t < vocab]
    if outside:
        return [
            _finding("PWR211", f"{key} names token IDs outside the vocabulary of {vocab}: {outside[:5]}", view, hint)
        ]
    if len(set(tokens)) != len(tokens):
        return [_finding("PWR211", f"{key} lists {len(tokens) - len(set(tokens))} token ID(s) twice", view, hint)]
    return []


def nextn_layer_count(view: HeaderView) -> int:
    value = view.metadata.get(f"{view.architecture}.nextn_predict_layers", 0)
    return value if _is_int(value) else 0


def _has_dflash2_markers(view: HeaderView) -> bool:
    keys = any(f"dflash.{key}" in view.metadata for key in DFLASH2_EXTRA_KEYS)
    shapes = view.tensor_shapes
    tensors = any(name in shapes for name in DFLASH2_MARKER_TENSORS) or any("_conv_" in name for name in shapes)
    return keys or tensors


def classify_drafter(view: HeaderView) -> str | None:
    """The drafter contract the header declares: `dflash`, `dflash2`, `dspark`, `mtp` or None."""
    if view.architecture == ARCHITECTURE_OF[DFLASH]:
        return DFLASH2 if _has_dflash2_markers(view) else DFLASH
    if view.architecture == ARCHITECTURE_OF[DSPARK]:
        return DSPARK
    if nextn_layer_count(view) > 0 or any(".nextn." in name for name in view.tensor_shapes):
        return MTP
    return None


def drafter_kv_bytes_per_position(view: HeaderView, kv_type_size: int = 2) -> int:
    """Drafter KV per cached position: layers x 2 (K and V) x kv heads x head dim x type size (f16: 2 B).

    For an MTP head the layers are the nextn blocks, with the target's kv heads for them.
    0 for a file that is not a drafter.
    """
    kind = classify_drafter(view)
    if kind is None:
        return 0
    meta, arch = view.metadata, view.architecture
    if kind == MTP:
        block_count = _meta_int(view, "block_count")
        layers = range(max(0, block_count - nextn_layer_count(view)), block_count)
        head_dim = _meta_int(view, "attention.key_length") or _default_head_dim(view)
        return sum(2 * _per_layer(meta.get(f"{arch}.attention.head_count_kv", 0),
                                  layer) * head_dim for layer in layers) * kv_type_size
    hp = drafter_hparams(view)
    return hp.block_count * 2 * hp.head_count_kv * hp.head_dim * kv_type_size


def drafter_sliding_window(view: HeaderView) -> int | None:
    """The drafter's KV window from the header, or None: the drafter then caches the whole context. An MTP head's
    blocks are full-attention blocks: a sliding window its header declares is its trunk's, not theirs."""
    if classify_drafter(view) == MTP:
        return None
    value = view.metadata.get(f"{view.architecture}.attention.sliding_window")
    return value if _is_int(value) and value > 0 else None


def contract_violations(view: HeaderView, declared_kind: str) -> list[Finding]:
    """Everything that keeps the artifact from being the `declared_kind` drafter (empty when it is one).

    For the non-file kinds (`ngram`, `draft-model`, `none`, `auto`) there is no header contract: [].
    """
    if declared_kind not in HEADER_CONTRACT:
        return []
    found = classify_drafter(view)
    if declared_kind == MTP and found is None:
        return [_finding("PWR212", f"native MTP declared but {view.architecture!r} carries no nextn/MTP tensors", view,
                         "use a target converted with its MTP head, or drop the mtp drafter")]
    if found != declared_kind:
        return [_kind_mismatch(view, declared_kind, found)]
    if declared_kind == MTP:
        return _mtp_violations(view)
    return (_drafter_key_violations(view, declared_kind) or _drafter_tensor_violations(view, declared_kind)
            or _draft_tokens_violations(view, drafter_hparams(view).vocab_size))


def target_vocab_size(view: HeaderView) -> int:
    """The target's vocabulary: `{arch}.vocab_size`, else the rows of its token embedding."""
    declared = _meta_int(view, "vocab_size")
    embedding = view.tensor_shapes.get("token_embd.weight")
    return declared or (embedding[0] if embedding else 0)


def pairing_violations(drafter: HeaderView, target: HeaderView) -> list[Finding]:
    """Whether a block drafter (DFlash v1, DFlash2, DSpark) can run on `target` at all.

    It borrows the target's embedding and LM head (same width, same vocabulary) and taps
    residuals entering `target_layers` (each a trunk layer of the target). [] for other kinds.
    """
    if classify_drafter(drafter) not in ARCHITECTURE_OF:
        return []
    hp = drafter_hparams(drafter)
    target_width = _meta_int(target, "embedding_length")
    trunk_layers = _meta_int(target, "block_count") - nextn_layer_count(target)
    vocab = target_vocab_size(target)
    problems = []
    if hp.embedding_length != target_width:
        problems.append(f"its width {hp.embedding_length} differs from the target's embedding_length {target_width}")
    if hp.vocab_size != vocab:
        problems.append(f"its vocab_size {hp.vocab_size} differs from the target's vocabulary of {vocab}")
    outside = [layer for layer in hp.target_layers if layer >= trunk_layers]
    if outside:
        problems.append(f"target_layers {outside} are not among the target's {trunk_layers} trunk layers")
    hint = "pair the drafter with the target it was trained for"
    return [
        _finding("PWR211", f"the drafter cannot run on {target.path}: {problem}", drafter, hint) for problem in problems
    ]


def sidecar_violations(sidecar: HeaderView, target: HeaderView) -> list[Finding]:
    """Whether an MTP-only GGUF carries the head of `target`'s model: the same architecture, width, trunk depth and
    vocabulary (llama.cpp loads it as a draft model of the target's architecture whose trunk tensors are absent)."""
    checks = [
        ("general.architecture", sidecar.architecture, target.architecture),
        ("embedding_length", _meta_int(sidecar, "embedding_length"), _meta_int(target, "embedding_length")),
        ("trunk layers (block_count - nextn_predict_layers)",
         _meta_int(sidecar, "block_count") - nextn_layer_count(sidecar),
         _meta_int(target, "block_count") - nextn_layer_count(target)),
        ("vocabulary", target_vocab_size(sidecar), target_vocab_size(target)),
    ]
    hint = "use the MTP-only GGUF converted from this target's base model"
    return [_finding("PWR211", f"the MTP sidecar cannot serve {target.path}: its {what} is {mine}, "
                               f"the target's {theirs}",
                     sidecar, hint) for what, mine, theirs in checks if mine != theirs]


def _kind_mismatch(view: HeaderView, declared: str, found: str | None) -> Finding:
    header = f"general.architecture = {view.architecture!r}" + (
        f", a {found} drafter" if found else ", no drafter contract"
    )
    if declared == MTP:
        hint = "use a target that carries nextn/MTP tensors, or declare the drafter file's own kind"
    elif found is None:
        hint = f"point this drafter at a {declared} GGUF (general.architecture = {ARCHITECTURE_OF[declared]})"
    else:
        hint = f'declare kind = "{found}" if this file is what you meant to deploy'
    return _finding("PWR210", f"declared kind {declared!r} but the header says {header}", view, hint)


def _drafter_key_violations(view: HeaderView, kind: str) -> list[Finding]:
    findings = []
    for key, expected in REQUIRED_KEYS[kind].items():
        full = f"{view.architecture}.{key}"
        value = view.metadata.get(full)
        if value is None:
            findings.append(_finding("PWR211", f"{kind} drafter lacks metadata key {full} ({expected})", view,
                                     f"re-export the drafter with {full} set"))
        elif not _has_type(value, expected):
            findings.append(_finding("PWR211", f"{full} is {value!r}, expected {expected}", view,
                                     f"re-export the drafter with {full} as {expected}"))
    if findings:
        return findings
    return _drafter_value_violations(view, kind)


def _drafter_value_violations(view: HeaderView, kind: str) -> list[Finding]:
    hp, arch, findings = drafter_hparams(view), view.architecture, []
    positive: dict[str, int | None] = {"embedding_length": hp.embedding_length, "block_count": hp.block_count,
                                       "attention.head_count": hp.head_count,
                "attention.head_count_kv": hp.head_count_kv, "attention.key_length": hp.head_dim,
                "block_size": hp.block_size,
                "vocab_size": hp.vocab_size}
    if kind != DSPARK:
        positive["attention.sliding_window"] = hp.sliding_window
    if kind == DFLASH2:
        positive |= {"conv_kernel_size": hp.conv_kernel_size, "conv_group_size": hp.conv_group_size,
                     "selector_rank": hp.selector_rank, "selector_top_k": hp.selector_top_k}
    if kind == DSPARK:
        positive["markov_rank"] = hp.markov_rank
    if hp.block_count > MAX_DRAFTER_BLOCKS:
        findings.append(_finding("PWR211", f"{arch}.block_count = {hp.block_count}, more than "
                                           f"{MAX_DRAFTER_BLOCKS} layers",
                                 view, "re-export the drafter with its real layer count"))
    for key, value in positive.items():
        if value is None or value <= 0:
            findings.append(_finding("PWR211", f"{arch}.{key} = {value}, expected a positive integer", view,
                                     "re-export the drafter with a valid value"))
    if not hp.target_layers or any(layer < 0 for layer in hp.target_layers):
        findings.append(_finding("PWR211", f"{arch}.target_layers = {list(hp.target_layers)}, expected "
                                           "non-negative layer indices",
                                 view, "list the target layers whose residuals the drafter reads"))
    if kind == DFLASH2 and hp.conv_group_size and hp.embedding_length % hp.conv_group_size:
        findings.append(
            _finding(
                "PWR211",
                f"dflash.conv_group_size = {hp.conv_group_size} does not divide "
                f"embedding_length = {hp.embedding_length}",
                view,
                "re-export with a dividing group size",
            )
        )
    if hp.head_count_kv and hp.head_count % hp.head_count_kv:
        findings.append(_finding("PWR211", f"{arch}.attention.head_count = {hp.head_count} is not a multiple of "
                                 f"head_count_kv = {hp.head_count_kv}", view,
                                 "re-export with grouped-query head counts"))
    return findings


def _drafter_tensor_violations(view: HeaderView, kind: str) -> list[Finding]:
    expected, actual = drafter_tensors(kind, drafter_hparams(view)), view.tensor_shapes
    findings = []
    missing = [name for name in expected if name not in actual]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        findings.append(_finding("PWR211", f"{kind} drafter lacks {len(missing)} required tensor(s): {shown}", view,
                                 f"a {kind} drafter carries {len(expected)} tensors; re-export it completely"))
    for name, shape in expected.items():
        if name in actual and tuple(actual[name]) != shape:
            findings.append(_finding("PWR211", f"tensor {name} has shape {list(actual[name])}, the {kind} contract "
                                     f"wants {list(shape)} from the header's hyper-parameters", view,
                                     "the header's hyper-parameters and tensors disagree: re-export the drafter"))
    return findings


def _mtp_violations(view: HeaderView) -> list[Finding]:
    arch, shapes = view.architecture, view.tensor_shapes
    n_nextn, block_count = nextn_layer_count(view), _meta_int(view, "block_count")
    d = _meta_int(view, "embedding_length")
    if n_nextn <= 0:
        return [_finding("PWR212", f"the file carries nextn tensors but {arch}.nextn_predict_layers is not set", view,
                         "re-convert the target with its MTP head (nextn_predict_layers > 0)")]
    findings = []
    for layer in range(max(0, block_count - n_nextn), block_count):
        for name, shape in nextn_tensors(layer, d).items():
            if name not in shapes:
                findings.append(_finding("PWR211", f"MTP head tensor {name} is missing", view,
                                         "re-convert the target with its complete MTP head"))
            elif tuple(shapes[name]) != shape:
                findings.append(
                    _finding(
                        "PWR211",
                        f"tensor {name} has shape {list(shapes[name])}, the mtp contract wants {list(shape)}",
                        view,
                        "re-convert the target's MTP head",
                    )
                )
    return findings + _draft_tokens_violations(view, target_vocab_size(view))


def _finding(code: str, message: str, view: HeaderView, hint: str) -> Finding:
    return Finding(code=code, severity=Severity.ERROR, message=message, file=view.path, hint=hint)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, float) or _is_int(value)


def _meta_int(view: HeaderView, key: str) -> int:
    value = view.metadata.get(f"{view.architecture}.{key}", 0)
    return value if _is_int(value) else 0


def _has_type(value: Any, expected: str) -> bool:
    if expected == INT:
        return _is_int(value)
    if expected == FLOAT:
        return _is_number(value)
    return isinstance(value, (list, tuple)) and all(_is_int(item) for item in value)


def _per_layer(value: Any, layer: int) -> int:
    """A per-layer hparam: a scalar applies to every layer, an array is indexed (llama.cpp's convention)."""
    if isinstance(value, (list, tuple)):
        return value[layer] if layer < len(value) else 0
    return value if _is_int(value) else 0


def _default_head_dim(view: HeaderView) -> int:
    heads = _per_layer(view.metadata.get(f"{view.architecture}.attention.head_count", 0), 0)
    return _meta_int(view, "embedding_length") // heads if heads else 0
