"""The tokenizer, built from a GGUF header's vocabulary with the `tokenizers` library.

Two header models, as llama.cpp reads them:

- `tokenizer.ggml.model = llama` (SentencePiece BPE, e.g. Gemma): spaces become
  "▁", pieces merge by score (the highest-scoring merged piece first), unknown
  characters fall back to `<0xXX>` byte tokens. The header carries scores, not
  merges, so the merge list is derived from the vocabulary the way HF's
  SentencePiece converter does it: every split of a piece into two vocabulary
  pieces is a merge, ranked by the merged piece's score.
- `tokenizer.ggml.model = gpt2` (byte-level BPE, e.g. llama 3 / qwen): the
  header's merges, byte-level pre-tokenisation with the regex llama.cpp uses for
  `tokenizer.ggml.pre`.

Control tokens (type 3) and user-defined tokens (type 4) are matched verbatim in
the text before the model runs, as llama.cpp does with special-token parsing on.
Decoding goes through a per-token byte table so a stream can be decoded
incrementally without splitting a UTF-8 character.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Sequence

import numpy as np
from tokenizers import AddedToken, Regex, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from power.artifacts.gguf_reader import ArtifactError
from power.runtime.gguf_weights import GGUFFile

SPM_SPACE = "▁"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # tokenizer.ggml.token_type values

# llama.cpp's pre-tokeniser regexes by `tokenizer.ggml.pre` (llama-vocab.cpp)
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZER_SPLITS = {
    "default": _GPT2_SPLIT,
    "gpt2": _GPT2_SPLIT,
    "gpt-2": _GPT2_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
}

# Control tokens that end a turn even when the header names only `eos` (llama.cpp's end-of-generation heuristic).
END_OF_TURN_TEXTS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>")


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    types: list[int]
    scores: list[float]
    merges: list[str]
    model: str
    pre: str
    bos_id: int | None
    eos_id: int | None
    add_bos: bool

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Vocabulary:
        tokens = gguf.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ArtifactError("the header carries no tokenizer (tokenizer.ggml.tokens is missing)", code="PWR121",
                                file=str(gguf.path), hint="the runtime needs the target's own vocabulary: use a target "
                                "converted with its tokenizer")
        model = gguf.get("tokenizer.ggml.model", "<none>")
        return cls(
            tokens=tokens,
            types=_per_token(gguf.get("tokenizer.ggml.token_type"), NORMAL, len(tokens)),
            scores=_per_token(gguf.get("tokenizer.ggml.scores"), 0.0, len(tokens)),
            merges=gguf.get("tokenizer.ggml.merges") or [],
            model=model,
            pre=gguf.get("tokenizer.ggml.pre", "default"),
            bos_id=gguf.get("tokenizer.ggml.bos_token_id"),
            eos_id=gguf.get("tokenizer.ggml.eos_token_id"),
            add_bos=bool(gguf.get("tokenizer.ggml.add_bos_token", model == "llama")),
        )


def _per_token(value: Any, default: int | float, count: int) -> list:
    """A per-token header array (a list, or a memoryview of the header when long) as a list of at most `count` values;
    `default` for every token when the header has none."""
    if value is None or len(value) == 0:
        return [default] * count
    return np.asarray(value)[:count].tolist()


class Tokenizer:
    """encode(text) -> ids (with BOS when the header asks), per-token bytes, stop ids."""

    def __init__(self, vocab: Vocabulary, source: str) -> None:
        self.vocab = vocab
        if vocab.model == "llama":
            self._hf = _sentencepiece_bpe(vocab)
            self._bytes = [_spm_token_bytes(t, k) for t, k in zip(vocab.tokens, vocab.types, strict=True)]
        elif vocab.model == "gpt2":
            if vocab.pre not in PRE_TOKENIZER_SPLITS:
                raise ArtifactError(f"tokenizer.ggml.pre = {vocab.pre!r} has no pre-tokeniser here "
                                    f"(known: {', '.join(PRE_TOKENIZER_SPLITS)})", code="PWR120", file=source,
                                    hint="render the plan for llama-server instead")
            self._hf = _byte_level_bpe(vocab)
            self._bytes = [_byte_level_token_bytes(t, k) for t, k in zip(vocab.tokens, vocab.types, strict=True)]
        else:
            raise ArtifactError(f"tokenizer.ggml.model = {vocab.model!r} is not supported "
                                "(llama = SentencePiece BPE, gpt2 = byte-level BPE)", code="PWR120", file=source,
                                hint="render the plan for llama-server instead")
        _add_verbatim_tokens(self._hf, vocab)

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> Tokenizer:
        return cls(Vocabulary.from_gguf(gguf), str(gguf.path))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @cached_property
    def stop_ids(self) -> frozenset[int]:
        ids = {i for i, text in enumerate(self.vocab.tokens)
               if text in END_OF_TURN_TEXTS and self.vocab.types[i] == CONTROL}
        if self.vocab.eos_id is not None:
            ids.add(self.vocab.eos_id)
        return frozenset(ids)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self._hf.encode(text, add_special_tokens=False).ids
        if (self.vocab.add_bos if add_bos is None else add_bos) and self.vocab.bos_id is not None:
            ids = [self.vocab.bos_id, *ids]
        return ids

    @cached_property
    def max_token_bytes(self) -> int:
        """The most text bytes one token covers: a text of n bytes has at least n / max_token_bytes tokens."""
        return max(1, max(len(b) for b in self._bytes), max(len(t.encode()) for t in self.vocab.tokens))

    def token_text(self, token_id: int | None) -> str:
        """A token's text as it is written in a prompt (control tokens by name, e.g. "<bos>"); "" for None."""
        return "" if token_id is None else self.vocab.tokens[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to the text (control tokens contribute none)."""
        return self._bytes[token_id]

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self._bytes[i] for i in ids).decode("utf-8", errors="replace")

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """Turns token ids into text as they arrive, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def _spm_merges(vocab: Vocabulary) -> list[tuple[str, str]]:
    """Every (left, right) split of a normal piece into two pieces, highest merged score first."""
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    ranked = []
    for merged_id, (piece, kind) in enumerate(zip(vocab.tokens, vocab.types, strict=True)):
        if kind != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-vocab.scores[merged_id], ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_bpe(vocab: Vocabulary) -> HFTokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    unk = next((t for t, k in zip(vocab.tokens, vocab.types, strict=True) if k == UNKNOWN), None)
    model = BPE(vocab=ids, merges=_spm_merges(vocab), unk_token=unk, byte_fallback=True, fuse_unk=True)
    tokenizer = HFTokenizer(model)
    tokenizer.normalizer = normalizers.Replace(" ", SPM_SPACE)
    return tokenizer


def _byte_level_bpe(vocab: Vocabulary) -> HFTokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    merges = [(left, right) for left, right in (m.split(" ", 1) for m in vocab.merges)]
    tokenizer = HFTokenizer(BPE(vocab=ids, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[vocab.pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return tokenizer


def _add_verbatim_tokens(tokenizer: HFTokenizer, vocab: Vocabulary) -> None:
    """Control and user-defined tokens match verbatim in the raw text, before normalisation."""
    tokenizer.add_tokens([
        AddedToken(text, special=(kind == CONTROL), normalized=False)
        for text, kind in zip(vocab.tokens, vocab.types, strict=True) if kind in (CONTROL, USER_DEFINED)
    ])


def _spm_token_bytes(piece: str, kind: int) -> bytes:
    if kind == CONTROL:
        return b""
    if kind == BYTE and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace(SPM_SPACE, " ").encode("utf-8")


def _byte_level_token_bytes(piece: str, kind: int) -> bytes:
    if kind == CONTROL:
        return b""
    if kind == USER_DEFINED:
        return piece.encode("utf-8")
    table = _unicode_to_byte()
    return bytes(table[ch] for ch in piece if ch in table)


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-unicode map, inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codepoints = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codepoints.append(256 + extra)
            extra += 1
    return {chr(cp): byte for byte, cp in zip(printable, codepoints, strict=True)}
