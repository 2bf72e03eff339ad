"""The tokenizer built from GGUF headers: the real Gemma vocabulary and the fixtures' byte-level BPE.

Gemma's expected IDs come from a plain re-implementation of llama.cpp's
SentencePiece algorithm written here over the header's vocabulary and scores:
verbatim control/user-defined tokens first (longest first), spaces as "▁", then
repeatedly merge the adjacent pair whose concatenation is the best-scoring
vocabulary piece (leftmost on ties), then unknown characters as <0xXX> bytes.
"""

from __future__ import annotations

import functools
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from gguf_helpers import fixtures, gemma

from power.artifacts.factory import TOKENIZER as FIXTURE_TOKENIZER
from power.artifacts.factory import Tensor, _apply_merge, byte_to_unicode, write_gguf
from power.runtime.gguf_weights import GGUFFile
from power.runtime.tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4


@functools.cache
def gemma_tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf(GGUFFile(gemma()))


def spm_reference(text: str, tok: Tokenizer) -> list[int]:
    vocab = tok.vocab
    ids = {piece: i for i, piece in enumerate(vocab.tokens)}
    verbatim = sorted((p for p, k in zip(vocab.tokens, vocab.types, strict=True) if k in (CONTROL, USER_DEFINED)),
                      key=len, reverse=True)
    out: list[int] = []
    for fragment, is_token in _partition(text, verbatim):
        out += [ids[fragment]] if is_token else _spm_fragment(fragment.replace(" ", "▁"), ids, vocab.scores)
    return out


def _partition(text: str, verbatim: list[str]) -> list[tuple[str, bool]]:
    pieces = [(text, False)]
    for token in verbatim:
        split = []
        for piece, is_token in pieces:
            if is_token or token not in piece:
                split.append((piece, is_token))
                continue
            parts = piece.split(token)
            for i, part in enumerate(parts):
                if part:
                    split.append((part, False))
                if i < len(parts) - 1:
                    split.append((token, True))
        pieces = split
    return pieces


def _spm_fragment(text: str, ids: dict[str, int], scores: list[float]) -> list[int]:
    symbols = list(text)
    while True:
        best = None
        for i in range(len(symbols) - 1):
            merged = symbols[i] + symbols[i + 1]
            if merged in ids and (best is None or scores[ids[merged]] > best[0]):
                best = (scores[ids[merged]], i)
        if best is None:
            break
        i = best[1]
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    out = []
    for symbol in symbols:
        out += [ids[symbol]] if symbol in ids else [ids[f"<0x{b:02X}>"] for b in symbol.encode()]
    return out


GEMMA_TEXTS = [
    "The capital of France is",
    "Hello  world   spaced\t\ttabs\n\nnew paragraph   ",
    "你好，世界。日本語のテキストと한국어",
    "emoji 🤖🎉👍🏽 and a flag 🇫🇷",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    return x ** 2  # squares",
    "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m",
]


@pytest.mark.parametrize("text", GEMMA_TEXTS)
def test_gemma_ids_match_the_sentencepiece_reference(text):
    tok = gemma_tokenizer()
    assert tok.encode(text, add_bos=False) == spm_reference(text, tok)


@pytest.mark.parametrize("text", GEMMA_TEXTS)
def test_gemma_decodes_back_to_the_text(text):
    tok = gemma_tokenizer()
    visible = text.replace("<start_of_turn>", "").replace("<end_of_turn>", "")  # control tokens render as nothing
    assert tok.decode(tok.encode(text)) == visible


def test_gemma_bos_comes_from_the_header():
    tok = gemma_tokenizer()
    assert tok.vocab.tokens[2] == "<bos>" and tok.bos_id == 2
    ids = tok.encode("The capital")
    assert ids[0] == 2 and tok.vocab.tokens[ids[1]] == "The" and tok.vocab.tokens[ids[2]] == "▁capital"
    assert tok.encode("The capital", add_bos=False) == ids[1:]


def test_gemma_whitespace_runs_are_single_tokens():
    tok = gemma_tokenizer()
    pieces = [tok.vocab.tokens[i] for i in tok.encode("a    b\n\n\nc", add_bos=False)]
    assert pieces == ["a", "    ", "b", "\n\n\n", "c"]


def test_a_character_outside_the_vocabulary_falls_back_to_bytes():
    tok = gemma_tokenizer()
    rare = next(ch for ch in map(chr, range(0x20000, 0x2A6DF)) if ch not in set(tok.vocab.tokens))
    pieces = [tok.vocab.tokens[i] for i in tok.encode(rare, add_bos=False)]
    assert pieces == [f"<0x{b:02X}>" for b in rare.encode()]
    assert tok.decode(tok.encode(rare)) == rare


def test_streaming_holds_back_a_partial_character():
    tok = gemma_tokenizer()
    rare = next(ch for ch in map(chr, range(0x20000, 0x2A6DF)) if ch not in set(tok.vocab.tokens))
    stream = tok.stream()
    pieces = [stream.feed(i) for i in tok.encode("x" + rare, add_bos=False)]
    assert pieces == ["x", "", "", "", rare] and stream.flush() == ""


def test_gemma_stops_on_eos_and_end_of_turn():
    tok = gemma_tokenizer()
    assert {tok.vocab.tokens[i] for i in tok.stop_ids} == {"<eos>", "<end_of_turn>"}


def _fixture_reference(text: str) -> list[int]:
    """Byte-level BPE by the factory's own merge routine over GPT-2-style words (letters with their leading space)."""
    spell = byte_to_unicode()
    ids = {t: i for i, t in enumerate(FIXTURE_TOKENIZER.tokens)}
    merges = [tuple(m.split(" ")) for m in FIXTURE_TOKENIZER.merges]
    out = []
    for word in _gpt2_words(text):
        symbols = [spell[b] for b in word.encode()]
        for pair in merges:
            symbols = _apply_merge(symbols, pair)
        out += [ids[s] for s in symbols]
    return out


def _gpt2_words(text: str) -> list[str]:
    words, current = [], ""
    for ch in text:
        if ch == " " or (current and current[-1] != " " and ch.isalpha() != current[-1].isalpha()):
            if current:
                words.append(current)
            current = ch
        else:
            current += ch
    return words + [current] if current else words


@pytest.mark.parametrize("text", ["The quick brown fox", "Hello world and the target", "Power compiles a plan"])
def test_byte_level_bpe_matches_the_fixture_merges(text):
    tok = Tokenizer.from_gguf(GGUFFile(fixtures()["dense-target"]))
    assert tok.encode(text) == _fixture_reference(text)
    assert tok.decode(tok.encode(text)) == text


def test_byte_level_bpe_reads_control_tokens_verbatim():
    tok = Tokenizer.from_gguf(GGUFFile(fixtures()["dense-target"]))
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert ids[0] == FIXTURE_TOKENIZER.id_of("<|im_start|>") and ids[-1] == FIXTURE_TOKENIZER.id_of("<|im_end|>")
    assert tok.decode(ids) == "hi"



def _spm_gguf(path, hostile: int):
    """A SentencePiece vocabulary (letters, "▁", a few merges, byte pieces) and `hostile` user-defined pieces that all
    share the prefix "ab" and never occur in the text: the vocabulary that made the old verbatim matcher O(n*K^2)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    merges = ["▁a", "ab", "▁ab", "ca", "▁c"]
    normal = ["▁", *letters, *merges]
    pieces = ["<unk>", "<bos>", "<eos>", *[f"<0x{b:02X}>" for b in range(256)], *normal,
              *[f"ab{'c' * i}d" for i in range(hostile)]]
    types = [2, 3, 3, *[6] * 256, *[1] * len(normal), *[4] * hostile]
    scores = [0.0] * (259 + len(letters) + 1) + [float(-i) for i in range(len(merges))] + [0.0] * hostile
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces, "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.scores": scores, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    write_gguf(path, "llama", metadata, {"token_embd.weight": Tensor(np.zeros((len(pieces), 4), np.float32))})
    return Tokenizer.from_gguf(GGUFFile(path))


def _cpu_seconds(tok: Tokenizer, text: str) -> float:
    best = math.inf
    for _ in range(3):
        started = time.process_time()
        tok.encode(text)
        best = min(best, time.process_time() - started)
    return best


def test_tokenizing_costs_the_same_whatever_the_user_defined_pieces_share():
    """Issue 38 item 3: 2,000 user-defined pieces sharing a prefix cost what a plain vocabulary costs on 10 KB (the
    old matcher tried every piece's length at every place: 3.6 s against milliseconds), and the same ids."""
    text = ("ab cab abc " * 1000)[:10_000]
    with tempfile.TemporaryDirectory() as folder:
        plain, hostile = (_spm_gguf(Path(folder) / f"{k}.gguf", k) for k in (0, 2000))
    assert hostile.encode(text) == plain.encode(text)
    assert _cpu_seconds(hostile, text) < 3 * _cpu_seconds(plain, text) + 0.02


def test_tokenizing_ends_with_its_request():
    """Issue 38 item 3: a request's tokenizing stops at its deadline (the server's timeout) instead of running on
    after the 504: a deadline already past ends a long text's tokenizing long before it would finish."""
    tok = gemma_tokenizer()
    text = "The quick brown fox jumps over the lazy dog. " * 8000
    started = time.process_time()
    tok.encode(text)
    whole = time.process_time() - started
    started = time.process_time()
    with pytest.raises(TimeoutError):
        tok.encode(text, deadline=time.perf_counter())
    assert time.process_time() - started < whole / 2
