"""Tokenizer facts from a GGUF header: model, pre-tokenizer, sizes, special ids, and two fingerprints.

`fingerprint` is sha256 over this exact byte serialisation (u64/i64 little-endian;
`lp(s)` is a u64 byte length then the UTF-8 bytes):

    b"power-tokenizer-v1\\n"
    lp(model) lp(pre)                              absent -> lp("")
    u64 n_tokens, then each token as lp(token)     (= the GGUF encoding of tokenizer.ggml.tokens)
    u64 n_types,  then each type as i32            (tokenizer.ggml.token_type; absent -> 0)
    u64 n_merges, then each merge as lp(merge)     (tokenizer.ggml.merges; absent -> 0)
    u64 n_special, then per special id sorted by name: lp(name) i64(id)
    u8 add_bos, u8 add_eos                         (0 false, 1 true, 2 absent)

Token strings are hashed as the file's bytes, so invalid UTF-8 is hashed as stored.
`short_fingerprint` is the llama.cpp-style check over the first 2000 tokens: the first
16 hex digits of sha256("\\n".join(tokens[:2000]) as UTF-8).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any, Iterator

from power.artifacts.gguf_reader import GGUFHeader

TOKENS, TYPES, MERGES, SCORES = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                                 "tokenizer.ggml.scores")
# The vocabulary arrays: summarised by these facts, kept out of ArtifactFacts.metadata.
VOCABULARY_KEYS = (TOKENS, TYPES, MERGES, SCORES)
SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
SHORT_FINGERPRINT_TOKENS = 2000
_U64 = struct.Struct("<Q")
_NUMBERS = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32", "float64", "bool"}
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    merges: tuple[str, ...]


@dataclass(frozen=True)
class TokenizerFacts:
    model: str | None
    pre: str | None
    vocab_size: int
    merges_count: int
    special_ids: dict[str, int]
    add_bos: bool | None
    add_eos: bool | None
    fingerprint: str
    short_fingerprint: str
    # The complete vocabulary, for naming the first difference; never serialised.
    vocabulary: Vocabulary = field(repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "pre": self.pre, "vocab_size": self.vocab_size, "merges_count": self.merges_count,
            "special_ids": dict(self.special_ids), "add_bos": self.add_bos, "add_eos": self.add_eos,
            "fingerprint": self.fingerprint, "short_fingerprint": self.short_fingerprint,
        }


def _lp(text: str | None) -> bytes:
    data = (text or "").encode("utf-8", "surrogateescape")
    return _U64.pack(len(data)) + data


def _string_array_bytes(header: GGUFHeader, key: str) -> bytes:
    """The GGUF encoding of a string array (u64 count, then lp per element), straight from the file's bytes."""
    span = header.array_spans.get(key)
    if span is None or span.element_type != "string":
        return _U64.pack(0)
    return _U64.pack(span.count) + header.raw[span.start:span.end]


def _types_parts(header: GGUFHeader) -> Iterator[bytes | bytearray]:
    """The token types as the fingerprint serialises them (count, then i32s), in bounded pieces."""
    span = header.array_spans.get(TYPES)
    if span is None or span.element_type not in _NUMBERS:
        yield _U64.pack(0)
        return
    yield _U64.pack(span.count)
    if span.element_type == "int32":
        yield header.raw[span.start:span.end]
        return
    # Converters write token types as int32; any other element type is hashed as numpy casts it (a float's or a
    # wide integer's cast included), so only a header that odd imports numpy.
    import numpy as np

    types = np.asarray(header.metadata[TYPES])
    for start in range(0, types.size, _CHUNK):
        yield types[start:start + _CHUNK].astype("<i4").tobytes()


def _leading_types(types: Any, vocab_size: int) -> tuple[int, ...]:
    """The types of the vocabulary's tokens and one past them (enough to name where two differ); the
    fingerprint covers the rest."""
    if isinstance(types, memoryview):  # a long numeric array (power.artifacts.gguf_reader)
        return tuple(types[:vocab_size + 1].tolist())
    return tuple(types[:vocab_size + 1]) if isinstance(types, list) else ()


def _flag(value: Any) -> bytes:
    return bytes([2 if value is None else int(bool(value))])


def _string_list(header: GGUFHeader, key: str) -> tuple[str, ...]:
    """The key's strings, when its value is an array of strings (the reader decodes every element of one)."""
    return tuple(header.metadata[key]) if header.value_types.get(key) == "array[string]" else ()


def tokenizer_facts(header: GGUFHeader) -> TokenizerFacts | None:
    """The header's tokenizer facts, or None when it carries no `tokenizer.ggml.tokens` string array."""
    meta = header.metadata
    tokens = _string_list(header, TOKENS)
    if not tokens:
        return None
    merges = _string_list(header, MERGES)
    types = meta.get(TYPES)
    special = {name: meta[key] for name, key in SPECIAL_ID_KEYS.items() if isinstance(meta.get(key), int)}
    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    add_bos, add_eos = meta.get("tokenizer.ggml.add_bos_token"), meta.get("tokenizer.ggml.add_eos_token")
    digest = hashlib.sha256(b"power-tokenizer-v1\n")
    for part in (_lp(model), _lp(pre), _string_array_bytes(header, TOKENS), *_types_parts(header),
                 _string_array_bytes(header, MERGES), _U64.pack(len(special))):
        digest.update(part)
    for name in sorted(special):
        digest.update(_lp(name) + struct.pack("<q", special[name]))
    digest.update(_flag(add_bos) + _flag(add_eos))
    short = hashlib.sha256("\n".join(tokens[:SHORT_FINGERPRINT_TOKENS]).encode("utf-8", "surrogateescape")).hexdigest()[
        :16
    ]
    return TokenizerFacts(
        model=model if isinstance(model, str) else None,
        pre=pre if isinstance(pre, str) else None,
        vocab_size=len(tokens),
        merges_count=len(merges),
        special_ids=special,
        add_bos=add_bos if isinstance(add_bos, bool) else None,
        add_eos=add_eos if isinstance(add_eos, bool) else None,
        fingerprint=digest.hexdigest(),
        short_fingerprint=short,
        vocabulary=Vocabulary(tokens, _leading_types(types, len(tokens)), merges),
    )


def _first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> int | None:
    for index, (left, right) in enumerate(zip(a, b, strict=False)):
        if left != right:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _item(items: tuple[Any, ...], index: int) -> str:
    return repr(items[index]) if index < len(items) else "(none)"


def compare_tokenizers(a: TokenizerFacts, b: TokenizerFacts) -> list[str]:
    """Every way `b` differs from `a` (empty when identical), naming the first differing token id, type and merge."""
    if a.fingerprint == b.fingerprint:
        return []
    differences = [f"{label}: {left!r} vs {right!r}" for label, left, right in (
        ("model", a.model, b.model), ("pre-tokenizer", a.pre, b.pre), ("vocab size", a.vocab_size, b.vocab_size),
        ("merges count", a.merges_count, b.merges_count), ("add_bos", a.add_bos, b.add_bos),
        ("add_eos", a.add_eos, b.add_eos)) if left != right]
    for name in sorted(set(a.special_ids) | set(b.special_ids)):
        if a.special_ids.get(name) != b.special_ids.get(name):
            differences.append(f"special id {name}: {a.special_ids.get(name)} vs {b.special_ids.get(name)}")
    va, vb = a.vocabulary, b.vocabulary
    for label, left, right in (("token at id", va.tokens, vb.tokens), ("token type at id", va.types, vb.types),
                               ("merge at index", va.merges, vb.merges)):
        index = _first_difference(left, right)
        if index is not None:
            differences.append(f"first differing {label} {index}: {_item(left, index)} vs {_item(right, index)}")
    return differences
