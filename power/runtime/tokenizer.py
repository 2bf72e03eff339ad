"""The tokenizer, built from a GGUF header's vocabulary.

Two header models, as llama.cpp reads them:

- `tokenizer.ggml.model = llama` (SentencePiece BPE, e.g. Gemma): pieces merge
  by score, unknown characters fall back to `<0xXX>` byte pieces
  (`power.runtime.spm`, over the compact vocabulary of `power.runtime.pieces`).
- `tokenizer.ggml.model = gpt2` (byte-level BPE, e.g. llama 3 / qwen): the
  header's merges, byte-level pre-tokenisation with the regex llama.cpp uses for
  `tokenizer.ggml.pre`, run by the `tokenizers` library.

Control tokens (type 3) and user-defined tokens (type 4) are matched verbatim in
the text before the model runs, as llama.cpp does with special-token parsing on,
in time linear in the text (`power.runtime.verbatim`); a client's text goes
through `Tokenizer.as_text` first, so that its control-token texts stay text.
Decoding goes through each token's bytes, so a stream can be decoded
incrementally without splitting a UTF-8 character.

The vocabulary is kept compactly: the pieces as one UTF-8 blob with offsets and
an index, the types one byte each, the scores one float each; nothing per token
is a Python object once the tokenizer is built.
"""

from __future__ import annotations

import codecs
from array import array
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Callable, Sequence

import numpy as np
from tokenizers import Regex, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from power.artifacts.gguf_reader import ArtifactError, GGUFHeader
from power.runtime.gguf_weights import GGUFFile
from power.runtime.pieces import Pieces
from power.runtime.spm import SPM_SPACE, SentencePiece, within
from power.runtime.verbatim import DEFUSED, Verbatim

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
    tokens: Pieces  # tokens[i]: piece i's text
    types: bytes  # types[i]: piece i's tokenizer.ggml.token_type (clipped to 0..255)
    scores: array  # float32, scores[i]: piece i's score
    model: str
    pre: str
    bos_id: int | None
    eos_id: int | None
    add_bos: bool

    @classmethod
    def from_gguf(cls, gguf: GGUFFile | GGUFHeader) -> Vocabulary:
        tokens = gguf.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ArtifactError("the header carries no tokenizer (tokenizer.ggml.tokens is missing)", code="PWR121",
                                file=str(gguf.path), hint="the runtime needs the target's own vocabulary: use a target "
                                "converted with its tokenizer")
        model = gguf.get("tokenizer.ggml.model", "<none>")
        types = _per_token(gguf.get("tokenizer.ggml.token_type"), NORMAL, len(tokens))
        return cls(
            tokens=Pieces(tokens),
            types=np.clip(types, 0, 255).astype(np.uint8).tobytes(),
            scores=array("f", _per_token(gguf.get("tokenizer.ggml.scores"), 0.0,
                                         len(tokens)).astype(np.float32).tobytes()),
            model=model,
            pre=gguf.get("tokenizer.ggml.pre", "default"),
            bos_id=gguf.get("tokenizer.ggml.bos_token_id"),
            eos_id=gguf.get("tokenizer.ggml.eos_token_id"),
            add_bos=bool(gguf.get("tokenizer.ggml.add_bos_token", model == "llama")),
        )

    def verbatim(self) -> Verbatim:
        """The control and user-defined pieces, matched verbatim in raw text."""
        return Verbatim((self.tokens[i], i, kind == CONTROL) for i, kind in enumerate(self.types)
                        if kind in (CONTROL, USER_DEFINED))


def _per_token(value: Any, default: int | float, count: int) -> np.ndarray:
    """A per-token header array (a list, or a memoryview of the header when long) as an array of `count` values;
    `default` for every token when the header has none."""
    if value is None or len(value) == 0:
        return np.full(count, default)
    return np.asarray(value)[:count]


class Tokenizer:
    """encode(text) -> ids (with BOS when the header asks), per-token bytes, stop ids."""

    def __init__(self, vocab: Vocabulary, source: str, merges: Sequence[str] = ()) -> None:
        """`merges`: the header's (a byte-level BPE's); read while building, not kept."""
        self.vocab = vocab
        if vocab.model == "llama":
            self._plain: Callable[[str, float | None], list[int]] = SentencePiece(vocab.tokens, vocab.scores).encode
            self._piece_bytes = _spm_token_bytes
        elif vocab.model == "gpt2":
            if vocab.pre not in PRE_TOKENIZER_SPLITS:
                raise ArtifactError(f"tokenizer.ggml.pre = {vocab.pre!r} has no pre-tokeniser here "
                                    f"(known: {', '.join(PRE_TOKENIZER_SPLITS)})", code="PWR120", file=source,
                                    hint="render the plan for llama-server instead")
            hf = _byte_level_bpe(vocab, merges)
            self._plain = lambda fragment, _deadline: hf.encode(fragment, add_special_tokens=False).ids
            self._piece_bytes = _byte_level_token_bytes
        else:
            raise ArtifactError(f"tokenizer.ggml.model = {vocab.model!r} is not supported "
                                "(llama = SentencePiece BPE, gpt2 = byte-level BPE)", code="PWR120", file=source,
                                hint="render the plan for llama-server instead")
        self._verbatim = vocab.verbatim()

    @classmethod
    def from_gguf(cls, gguf: GGUFFile | GGUFHeader) -> Tokenizer:
        """From an opened model, or from its header alone (what `power bench` counts prompt tokens with)."""
        return cls(Vocabulary.from_gguf(gguf), str(gguf.path), gguf.get("tokenizer.ggml.merges") or ())

    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @cached_property
    def stop_ids(self) -> frozenset[int]:
        ids = {i for i, kind in enumerate(self.vocab.types)
               if kind == CONTROL and self.vocab.tokens[i] in END_OF_TURN_TEXTS}
        if self.vocab.eos_id is not None:
            ids.add(self.vocab.eos_id)
        return frozenset(ids)

    def encode(self, text: str, add_bos: bool | None = None, deadline: float | None = None) -> list[int]:
        """`text`'s ids: its verbatim pieces, and the text between them by the vocabulary's model. With `deadline`
        (a `time.perf_counter()` instant), TimeoutError once it has passed: a request's tokenizing ends with the
        request (the byte-level model's fragments are the `tokenizers` library's, checked between them)."""
        ids: list[int] = []
        for fragment, token in self._verbatim.split(text):
            within(deadline)
            ids += [token] if token is not None else self._plain(fragment, deadline)
        if (self.vocab.add_bos if add_bos is None else add_bos) and self.vocab.bos_id is not None:
            ids = [self.vocab.bos_id, *ids]
        return ids

    def as_text(self, text: str) -> str:
        """A client's text, marked so that `encode` reads it as text: none of its characters become a control token
        (ValueError, saying where, for the one character a client may not send: `power.runtime.verbatim`)."""
        return self._verbatim.as_text(text)

    @staticmethod
    def text_bytes(text: str) -> int:
        """The UTF-8 bytes of `text` that `encode` tokenises (not counting `as_text`'s marks)."""
        return len(text.encode("utf-8")) - len(DEFUSED.encode("utf-8")) * text.count(DEFUSED)

    @cached_property
    def max_token_bytes(self) -> int:
        """The most text bytes one token covers: a text of n bytes has at least n / max_token_bytes tokens (a
        token's bytes are never more than its piece's: "▁" is 3 bytes for 1, "<0xXX>" 6 for 1)."""
        return max(1, self.vocab.tokens.longest)

    def token_text(self, token_id: int | None) -> str:
        """A token's text as it is written in a prompt (control tokens by name, e.g. "<bos>"); "" for None."""
        return "" if token_id is None else self.vocab.tokens[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token contributes to the text (control tokens contribute none)."""
        return self._piece_bytes(self.vocab.tokens[token_id], self.vocab.types[token_id])

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

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


def _byte_level_bpe(vocab: Vocabulary, merges: Sequence[str]) -> HFTokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    pairs = [(left, right) for left, right in (m.split(" ", 1) for m in merges)]
    tokenizer = HFTokenizer(BPE(vocab=ids, merges=pairs, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[vocab.pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return tokenizer  # it sees only the text between verbatim pieces (`Tokenizer.encode`)


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
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"),
                                                                 ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codepoints = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codepoints.append(256 + extra)
            extra += 1
    return {chr(cp): byte for byte, cp in zip(printable, codepoints, strict=True)}
