"""Header values the runtime trusts: each range-checked here, once, for the plan and the runtime alike.

`header_findings(header)` returns a located finding (the artifact, the byte offset of
the key, the key) for every value the Power runtime would divide by, index with, loop
over or feed to a tokenizer that no model could have: zero heads, a NaN epsilon, a
rope base of 0, a block count that disagrees with the blocks in the file, an
embedding with fewer rows than the vocabulary, a BOS id past its end, a token that is
not UTF-8, a tensor whose width contradicts `embedding_length` or `head_count` (PWR121). `ArtifactFacts.findings`
carries them, so `power plan` and `power validate` refuse the file and `power inspect` shows why; the runtime's GGUF
loader calls `require_valid_header`, so `power run --gguf` refuses the same file the same way.

Only values that are present are checked (a missing key the runtime needs is its own
PWR121); the keys are llama.cpp's, under the header's `general.architecture` prefix,
so drafter headers are held to the same ranges.
"""

from __future__ import annotations

import math
import re
from typing import Any

from power.artifacts.gguf_reader import ArtifactError, GGUFHeader
from power.findings import Finding, Severity

__all__ = ["MAX_BLOCK_COUNT", "NO_TENSORS", "NO_TENSORS_HINT", "header_findings", "require_plausible_layers",
           "require_valid_header"]

# Layers are enumerated per block: a hostile block_count must not become a billion-row loop.
MAX_BLOCK_COUNT = 4096
# Architectures whose layers slide by llama.cpp's hard-coded pattern: their window cannot be 0.
SLIDING_ARCHITECTURES = ("gemma2", "gemma3", "gemma3n", "cohere2")

# An integer >= 1.
POSITIVE_INTS = ("embedding_length", "attention.key_length", "attention.value_length", "full_attention_interval",
                 "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "rope.dimension_count")
# An integer >= 1, or one integer >= 0 per layer (a recurrent layer has no attention heads).
PER_LAYER_INTS = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")
# A finite number > 0.
POSITIVE_FLOATS = ("rope.freq_base", "rope.scaling.factor")
# A finite number >= 0 (0: no soft-capping).
SOFTCAPS = ("final_logit_softcapping", "attn_logit_softcapping")
# A finite number in (0, 1).
EPSILONS = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon")

TOKENS, TYPES, SCORES, MERGES = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
                                 "tokenizer.ggml.merges")
# The special ids the runtime's tokenizer uses (BOS prepended, EOS stops).
RUNTIME_SPECIAL_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
# Tensors one side of which is the residual stream (`embedding_length` wide): that side's torch dimension.
_RESIDUAL_SIDE = {**dict.fromkeys(("output_norm.weight", "attn_norm.weight", "ffn_norm.weight", "attn_output.weight",
                                   "ffn_down.weight"), 0),
                  **dict.fromkeys(("token_embd.weight", "output.weight", "attn_q.weight", "attn_k.weight",
                                   "attn_v.weight", "ffn_gate.weight", "ffn_up.weight"), -1)}
_CORRUPT = "the header is corrupt or hand-edited: re-convert the model with a current llama.cpp convert script"


def require_plausible_layers(header: GGUFHeader) -> None:
    """Raise for a block count, or a tensor's block index, beyond MAX_BLOCK_COUNT (PWR123).

    What enumerates layers (the facts, the contracts) calls this first: a hostile count must not become a
    billion-step loop before any finding could be reported.
    """
    _raise_first(_Checks(header).plausible_layers())


ARCHITECTURE_KEY = "general.architecture"
ARCHITECTURE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
NO_TENSORS = "the file lists no tensors: it holds no model"
NO_TENSORS_HINT = "point the manifest at the model's GGUF (a vocabulary-only file has no weights to run)"


def require_valid_header(header: GGUFHeader) -> None:
    """Raise ArtifactError for the first error `header_findings` reports, or PWR124 for a file with no tensors
    (what the runtime calls before loading)."""
    if not header.tensors:
        raise ArtifactError(NO_TENSORS, code="PWR124", file=str(header.path), hint=NO_TENSORS_HINT)
    _raise_first(header_findings(header))


def _raise_first(findings: list[Finding]) -> None:
    for finding in findings:
        if finding.is_error:
            raise ArtifactError.of(finding)


def header_findings(header: GGUFHeader) -> list[Finding]:
    """A finding for every header value the runtime uses that is out of range, of the wrong type or inconsistent.

    A file with no tensors (a vocabulary-only GGUF) is inspectable; a plan or the runtime refuses it as a model
    (NO_TENSORS)."""
    return _Checks(header).run()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Checks:
    def __init__(self, header: GGUFHeader) -> None:
        self.header, self.meta = header, header.metadata
        architecture = self.meta.get(ARCHITECTURE_KEY)
        self.arch = architecture if isinstance(architecture, str) else ""
        self.findings: list[Finding] = []

    def run(self) -> list[Finding]:
        self._architecture()
        self.findings += self.plausible_layers()
        self._ranges()
        self._block_count()
        self._heads()
        self._attention_shapes()
        self._widths()
        self._recurrent()
        self._tokenizer()
        return self.findings

    # --- helpers --------------------------------------------------------------------------

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def get(self, name: str) -> Any:
        return self.meta.get(self.key(name))

    def finding(self, code: str, key: str, message: str, hint: str = _CORRUPT) -> Finding:
        return Finding(code, Severity.ERROR, message, file=self.header.path, hint=hint,
                       offset=self.header.key_offsets.get(key), where=key)

    def fail(self, code: str, key: str, message: str, hint: str = _CORRUPT) -> None:
        self.findings.append(self.finding(code, key, message, hint))

    def positive_int(self, name: str, value: Any) -> bool:
        if _is_int(value) and value >= 1:
            return True
        self.fail("PWR123", self.key(name), f"{self.key(name)} is {value!r}: expected an integer >= 1")
        return False

    # --- scalar ranges ----------------------------------------------------------------------

    def _architecture(self) -> None:
        """A name of letters, digits, '_', '.' and '-' (every llama.cpp architecture is one): it prefixes every key
        and is written into plans and launch lines, where a NUL or a line break would cut or forge one."""
        value = self.meta.get(ARCHITECTURE_KEY)
        if value is not None and not (isinstance(value, str) and ARCHITECTURE_NAME.fullmatch(value)):
            self.fail("PWR123", ARCHITECTURE_KEY, f"{ARCHITECTURE_KEY} is {value!r}: expected a name of letters, "
                      "digits, '_', '.' and '-'")

    def _ranges(self) -> None:
        for name in POSITIVE_INTS:
            if self.get(name) is not None:
                self.positive_int(name, self.get(name))
        for name in PER_LAYER_INTS:
            value = self.get(name)
            if isinstance(value, list):
                if not value or not all(_is_int(item) and item >= 0 for item in value) or not any(value):
                    self.fail("PWR123", self.key(name), f"{self.key(name)} is {_short(value)}: expected one "
                              "integer >= 0 per layer, not all 0")
            elif value is not None:
                self.positive_int(name, value)
        for name in POSITIVE_FLOATS:
            value = self.get(name)
            if value is not None and not (_is_number(value) and math.isfinite(value) and value > 0):
                self.fail("PWR123", self.key(name), f"{self.key(name)} is {value!r}: expected a finite number > 0")
        for name in SOFTCAPS:
            value = self.get(name)
            if value is not None and not (_is_number(value) and math.isfinite(value) and value >= 0):
                self.fail("PWR123", self.key(name), f"{self.key(name)} is {value!r}: expected a finite number >= 0 "
                          "(0: no soft-capping)")
        for name in EPSILONS:
            value = self.get(name)
            if value is not None and not (_is_number(value) and math.isfinite(value) and 0 < value < 1):
                self.fail("PWR123", self.key(name), f"{self.key(name)} is {value!r}: expected a finite number "
                          "between 0 and 1 (a norm epsilon, e.g. 1e-6)")
        window = self.get("attention.sliding_window")
        least = 1 if self.arch in SLIDING_ARCHITECTURES else 0
        if window is not None and not (_is_int(window) and window >= least):
            self.fail("PWR123", self.key("attention.sliding_window"), f"{self.key('attention.sliding_window')} is "
                      f"{window!r}: expected an integer >= {least}"
                      + (f" ({self.arch} layers slide: a window of 0 positions attends to nothing)" if least else ""))

    # --- structure -------------------------------------------------------------------------

    def plausible_layers(self) -> list[Finding]:
        """A finding for a block count, or a tensor's block index, that no model has."""
        count, key, found = self.get("block_count"), self.key("block_count"), []
        if _is_int(count) and count > MAX_BLOCK_COUNT:
            found.append(self.finding("PWR123", key, f"{key} is {count}: expected 1 to {MAX_BLOCK_COUNT} layers"))
        index = max(self._blocks(), default=0)
        if index >= MAX_BLOCK_COUNT:
            found.append(self.finding("PWR123", key, f"a tensor belongs to block {index}: at most {MAX_BLOCK_COUNT} "
                                      "layers are plausible"))
        return found

    def _blocks(self) -> set[int]:
        """Block indices of the `blk.N.` tensors; a number longer than MAX_BLOCK_COUNT's is read as MAX_BLOCK_COUNT
        (int() of thousands of digits raises, and no model has that many layers)."""
        digits = (match.group(1) for t in self.header.tensors if (match := _BLOCK.match(t.name)))
        return {MAX_BLOCK_COUNT if len(d) > len(str(MAX_BLOCK_COUNT)) else int(d) for d in digits}

    def _block_count(self) -> None:
        count, blocks = self.get("block_count"), self._blocks()
        if count is None or (_is_int(count) and count > MAX_BLOCK_COUNT):
            return
        if not (_is_int(count) and count >= 1):
            self.fail("PWR123", self.key("block_count"), f"{self.key('block_count')} is {count!r}: expected 1 to "
                      f"{MAX_BLOCK_COUNT} layers")
            return
        beyond = sorted(index for index in blocks if index >= count)
        nextn = self.get("nextn_predict_layers")
        # An MTP-only file (a model's nextn head converted alone, which llama.cpp loads `mtp_only`) holds the
        # nextn blocks and no trunk block: only those must be there.
        head_only = _is_int(nextn) and 0 < nextn < count and bool(blocks) and min(blocks) >= count - nextn
        expected = set(range(count - nextn, count)) if head_only else set(range(count))
        missing = sorted(expected - blocks) if blocks else []
        if beyond:
            self.fail("PWR124", self.key("block_count"), f"{self.key('block_count')} is {count}, but the file holds "
                      f"tensors of block {beyond[0]}{' and beyond' if len(beyond) > 1 else ''}: a run would silently "
                      f"skip {len(beyond)} layer(s)")
        elif missing:
            self.fail("PWR124", self.key("block_count"), f"{self.key('block_count')} is {count}, but the file holds "
                      "no tensors for block "
                      f"{missing[0]}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
        if nextn is not None and not (_is_int(nextn) and 0 <= nextn < count):
            self.fail("PWR123", self.key("nextn_predict_layers"), f"{self.key('nextn_predict_layers')} is {nextn!r}: "
                      f"expected 0 to {count - 1} of the {count} blocks")

    def _heads(self) -> None:
        heads, kv_heads = self.get("attention.head_count"), self.get("attention.head_count_kv")
        if not (_is_int(heads) and heads >= 1):
            return
        if _is_int(kv_heads) and kv_heads >= 1 and heads % kv_heads:
            self.fail("PWR124", self.key("attention.head_count_kv"), f"{heads} attention heads do not share "
                      f"{kv_heads} KV heads evenly ({self.key('attention.head_count_kv')} must divide "
                      f"{self.key('attention.head_count')})")
        width = self.get("embedding_length")
        if self.get("attention.key_length") is None and _is_int(width) and 1 <= width < heads:
            self.fail("PWR124", self.key("embedding_length"), f"{self.key('embedding_length')} = {width} is narrower "
                      f"than {heads} heads, and no attention.key_length is given: each head would be 0 wide")
        rope_dims, key_length = self.get("rope.dimension_count"), self.get("attention.key_length")
        if (
            _is_int(rope_dims)
            and rope_dims >= 1
            and (rope_dims % 2 or (_is_int(key_length) and rope_dims > key_length))
        ):
            self.fail("PWR124", self.key("rope.dimension_count"), f"{self.key('rope.dimension_count')} is {rope_dims}: "
                      f"rope rotates an even number of dimensions, at most the head width ({key_length})")

    def _attention_shapes(self) -> None:
        """A model has tensors, and the first block's K and V projections are as wide as the header's KV heads
        times its key and value lengths: a hand-edited length (2^32 - 1) would otherwise size a terabyte KV cache."""
        shapes = {t.name: t.shape for t in self.header.tensors}
        for length_key, tensor in (
            ("attention.key_length", "attn_k.weight"),
            ("attention.value_length", "attn_v.weight"),
        ):
            length = self.get(length_key)
            block = next((index for index in sorted(self._blocks()) if f"blk.{index}.{tensor}" in shapes), None)
            kv_heads = self._kv_heads(block) if block is not None else None
            if not (_is_int(length) and length >= 1 and kv_heads):
                continue
            rows = shapes[f"blk.{block}.{tensor}"][0]
            if rows != kv_heads * length:
                self.fail("PWR124", self.key(length_key), f"{self.key(length_key)} = {length} with {kv_heads} KV "
                          f"heads needs blk.{block}.{tensor} to have {kv_heads * length:,} rows; it has {rows:,}")

    def _widths(self) -> None:
        """Every tensor the trunks read beside the residual stream is `embedding_length` wide on that side, and
        each block's attention output reads its heads' values (`attention.head_count` x value length): a file
        that contradicts its header is refused here, as the runtime's loader would refuse it (PWR121)."""
        width = self.get("embedding_length")
        if not (_is_int(width) and width >= 1):
            return
        for tensor in self.header.tensors:
            match = _BLOCK.match(tensor.name)
            role = tensor.name[match.end():] if match else tensor.name
            side = _RESIDUAL_SIDE.get(role)
            if side is not None and tensor.shape and tensor.shape[side] != width:
                self._misshaped(tensor.name, tensor.shape, f"its residual-stream side is {tensor.shape[side]:,} wide, "
                                f"but {self.key('embedding_length')} is {width:,}")
            if match and role == "attn_output.weight" and len(tensor.shape) == 2:
                allowed = self._head_values(int(match.group(1)), width)
                if allowed and tensor.shape[1] not in allowed:
                    self._misshaped(tensor.name, tensor.shape, f"{tensor.shape[1]:,} columns, but "
                                    f"{self.key('attention.head_count')} heads of their value length need "
                                    f"{' or '.join(f'{n:,}' for n in sorted(allowed))}")

    def _head_values(self, block: int, width: int) -> set[int]:
        """The widths a block's attention output may read: its heads times their value length, which is
        `attention.value_length`, else (as llama.cpp's loader or a qwen3-style trunk reads it) the key length or
        `embedding_length` / heads; empty where the heads are unknown."""
        heads = self.get("attention.head_count")
        per_layer = isinstance(heads, list)
        if per_layer:
            heads = heads[block] if block < len(heads) else None
        if not (_is_int(heads) and heads >= 1):
            return set()
        declared = self.get("attention.value_length")
        lengths = [declared] if declared is not None else [self.get("attention.key_length")] + \
            ([] if per_layer else [width // heads])
        return {heads * length for length in lengths if _is_int(length) and length >= 1}

    def _misshaped(self, name: str, shape: tuple[int, ...], why: str) -> None:
        self.findings.append(Finding("PWR121", Severity.ERROR, f"tensor {name!r} has shape {list(shape)}: {why}",
                                     file=self.header.path, where=name, hint=_CORRUPT))

    def _kv_heads(self, block: int) -> int | None:
        value = self.get("attention.head_count_kv")
        if value is None:
            value = self.get("attention.head_count")
        if isinstance(value, list):
            value = value[block] if block < len(value) else None
        return value if _is_int(value) and value >= 1 else None

    def _recurrent(self) -> None:
        groups, value_heads = self.get("ssm.group_count"), self.get("ssm.time_step_rank")
        if _is_int(groups) and _is_int(value_heads) and groups >= 1 and value_heads >= 1 and value_heads % groups:
            self.fail("PWR124", self.key("ssm.time_step_rank"), f"{value_heads} value heads "
                      f"({self.key('ssm.time_step_rank')}) do not share {groups} key heads "
                      f"({self.key('ssm.group_count')}) evenly")

    # --- tokenizer ---------------------------------------------------------------------------

    def _tokenizer(self) -> None:
        tokens = self.meta.get(TOKENS)
        for name in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            if name in self.meta and not isinstance(self.meta[name], str):
                self.fail("PWR123", name, f"{name} is {_short(self.meta[name])}: expected a string")
        if tokens is None or not self._strings(tokens):
            return
        for name in (TYPES, SCORES):
            values = self.meta.get(name)
            # a long numeric array is a read-only memoryview of the header (power.artifacts.gguf_reader)
            sequence = isinstance(values, memoryview) or (isinstance(values, list) and
                                                          not any(isinstance(item, list) for item in values))
            if values is not None and (not sequence or len(values) != len(tokens)):
                count = f"{len(values)} entries" if sequence else _short(values)
                self.fail("PWR124", name, f"{name} has {count} for {len(tokens)} tokens: one per token expected")
        merges = self.meta.get(MERGES)
        if merges is not None and not (
            isinstance(merges, list) and all(isinstance(m, str) and " " in m for m in merges)
        ):
            self.fail("PWR123", MERGES, f"{MERGES} is not an array of \"left right\" pairs")
        for name in RUNTIME_SPECIAL_IDS:
            value = self.meta.get(name)
            if value is not None and not (_is_int(value) and 0 <= value < len(tokens)):
                self.fail("PWR125", name, f"{name} is {value!r}, outside the vocabulary of {len(tokens):,} tokens "
                          f"(ids 0 to {len(tokens) - 1:,})")
        self._vocabulary_rows(len(tokens))

    def _strings(self, tokens: Any) -> bool:
        """Whether the tokens are a non-empty array of strings; a finding too for one that is not UTF-8.

        One join and one encode (a 262k-token vocabulary is 1.5 MB of text): the reader keeps invalid
        UTF-8 in tokens as lone surrogates, so that fingerprints hash the stored bytes, and those cannot encode.
        """
        try:
            joined = "".join(tokens) if isinstance(tokens, list) and tokens else None
        except TypeError:
            joined = None
        if joined is None:
            self.fail("PWR123", TOKENS, f"{TOKENS} is {_short(tokens)}: expected a non-empty array of strings")
            return False
        try:
            joined.encode("utf-8")
        except UnicodeEncodeError:
            index = next(i for i, token in enumerate(tokens) if not _encodes(token))
            raw = tokens[index].encode("utf-8", "surrogateescape")
            self.fail("PWR117", TOKENS, f"token {index} of {TOKENS} is not valid UTF-8 ({raw!r})")
        return True

    def _vocabulary_rows(self, vocab: int) -> None:
        shapes = {t.name: t.shape for t in self.header.tensors}
        for name in ("token_embd.weight", "output.weight"):
            rows = shapes.get(name, (vocab,))[0]
            if rows != vocab:
                self.fail("PWR124", TOKENS, f"{name} has {rows:,} rows for a vocabulary of {vocab:,} tokens: every "
                          "token id needs one")


def _encodes(token: str) -> bool:
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
