"""The artifact factory: small, complete, deterministic GGUF files for tests, and header-only files at real sizes.

`build_fixtures(directory)` writes every fixture and returns {name: path}; each
fixture also has its own `build_<name>(directory)` function. Everything is seeded,
so the same gguf version writes byte-identical files (stable digests).

Runnable fixtures (a few hundred KB each) carry finite weights drawn from
normal(0, 0.02), norms at 1, and quantised tensors that are real quantisations
(`gguf.quants.quantize`) of those weights. They share one tokenizer: byte-level
BPE (`tokenizer.ggml.model = gpt2`, `pre = gpt-2`): 256 byte tokens in GPT-2's
byte-to-unicode spelling, merges learned from a fixed text, and four control tokens.

Header-only fixtures (`qwen36-27b-*`) declare the real Qwen3.6-27B target and
drafter dimensions over sparse files: the tensor data region is a hole, so a
22.9 GB artifact occupies a few KB on disk. They carry no tokenizer.

Shapes of drafter tensors come from `power.artifacts.contracts`; see
`docs/contracts.md` for every fixture's layout.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from power import modes
from power.artifacts import contracts
from power.artifacts.atomic import atomic_path
from power.artifacts.contracts import DrafterHparams
from power.artifacts.gguf_reader import read_header
from power.artifacts.gguf_writer import F16, F32, FileType, Q, Tensor, block_values, write_gguf, write_sparse_gguf

Q4_0, Q5_0, Q8_0, Q4_K, Q6_K = Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K

WEIGHT_STD = 0.02
FIXTURE_SEED = 20261130
FIXTURE_D_MODEL = 64

# The real Qwen3.6-27B Q6_K target's file size (docs/reference.md); the sparse header fixture pads to it.
QWEN36_27B_Q6K_SIZE = 22_884_408_288

BPE_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and the target verifies them. "
    "A drafter proposes a block; the target accepts the longest matching prefix and emits one "
    "correction or bonus token. def forward(self, tokens, positions):\n    return "
    "self.output(self.norm(self.layers(tokens, positions)))\nfor i in range(10):\n    print(i, i * i)\n"
    "Power compiles a manifest, a profile and a host into one resolved engine plan, and only a resolved plan runs. "
    "The quantised weights are dequantised into torch tensors; the cache keeps keys and values for every position. "
    "Hello world! Hello there, how are you today? I am fine, thank you, and you? 0123456789 + - * / = < > ( ) [ ] { }"
)
BPE_MERGES = 236
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL = 1, 3


# --- tokenizer -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FixtureTokenizer:
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE spells bytes this way)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"),
                                                                 ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def _learn_merges(text: str, count: int) -> list[tuple[str, str]]:
    """Greedy BPE over whitespace-split words; ties broken by the pair's text, so the result is deterministic."""
    spell = byte_to_unicode()
    words = Counter(" " + word if i else word for i, word in enumerate(text.split(" ")))
    pieces = {word: [spell[b] for b in word.encode()] for word in words}
    merges: list[tuple[str, str]] = []
    while len(merges) < count:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in words.items():
            symbols = pieces[word]
            for pair in itertools.pairwise(symbols):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        for word in words:
            pieces[word] = _apply_merge(pieces[word], best)
    return merges


def _apply_merge(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


def fixture_tokenizer(*, altered: bool = False) -> FixtureTokenizer:
    """The fixtures' tokenizer. `altered` swaps the last merge for another pair: one token and one merge differ."""
    spell = byte_to_unicode()
    merges = _learn_merges(BPE_CORPUS, BPE_MERGES)
    if altered:
        merges[-1] = (spell[ord("Q")], spell[ord("Z")])
    tokens = [spell[b] for b in range(256)] + [a + b for a, b in merges]
    types = [TOKEN_TYPE_NORMAL] * len(tokens) + [TOKEN_TYPE_CONTROL] * len(SPECIAL_TOKENS)
    return FixtureTokenizer(tuple(tokens) + SPECIAL_TOKENS, tuple(types), tuple(f"{a} {b}" for a, b in merges))


def tokenizer_metadata(tok: FixtureTokenizer) -> dict[str, Any]:
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": list(tok.tokens),
        "tokenizer.ggml.token_type": list(tok.token_types),
        "tokenizer.ggml.merges": list(tok.merges),
        "tokenizer.ggml.bos_token_id": tok.id_of("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tok.id_of("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": tok.id_of("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": False,
    }


# --- weights and shapes --------------------------------------------------------------------


class _Weights:
    """Seeded weights: matrices from normal(0, 0.02), norms at 1."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def normal(self, shape: tuple[int, ...], ggml_type: Q, std: float = WEIGHT_STD) -> Tensor:
        return Tensor(self.rng.normal(0.0, std, shape).astype(np.float32), ggml_type)

    @staticmethod
    def ones(shape: tuple[int, ...]) -> Tensor:
        return Tensor(np.ones(shape, dtype=np.float32), F32)

    def fill(self, shapes: dict[str, tuple[int, ...]],
             type_of: Callable[[str, tuple[int, ...]], Q]) -> dict[str, Tensor]:
        """Norm-named vectors at 1, other vectors and matrices normal, typed by `type_of`."""
        return {name: self.ones(shape) if _is_norm(name) else self.normal(shape, type_of(name, shape))
                for name, shape in shapes.items()}


def _is_norm(name: str) -> bool:
    return name.rsplit(".", 1)[0].endswith(("norm", "enorm", "hnorm"))


@dataclass(frozen=True)
class DenseConfig:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    ctx: int


@dataclass(frozen=True)
class HybridConfig:
    """A qwen35 trunk: gated-delta-net layers, a full-attention layer every `interval`, then `nextn` MTP blocks."""

    d_model: int
    n_layers: int  # main trunk layers, without the nextn blocks
    nextn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    ctx: int
    interval: int
    ssm_state: int  # head dim of the delta-net keys and values
    ssm_groups: int  # key heads
    ssm_v_heads: int  # value heads (time_step_rank)
    conv_kernel: int
    rope_dims: int
    rope_sections: tuple[int, int, int, int]
    rope_freq_base: float = 10_000_000.0

    @property
    def block_count(self) -> int:
        return self.n_layers + self.nextn

    def is_recurrent(self, layer: int) -> bool:
        return layer < self.n_layers and (layer + 1) % self.interval != 0


def dense_tensor_shapes(cfg: DenseConfig, arch: str = "qwen3") -> dict[str, tuple[int, ...]]:
    """qwen3 tensors (per-head q/k norms); llama's drop the norms, qwen2's trade them for q/k/v biases."""
    d = cfg.d_model
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,),
                                          "output.weight": (cfg.vocab, d)}
    widths = {"q": cfg.n_heads * cfg.head_dim, "k": cfg.n_kv_heads * cfg.head_dim, "v": cfg.n_kv_heads * cfg.head_dim}
    for i in range(cfg.n_layers):
        block = contracts.qk_norm_block_tensors(i, d, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn)
        if arch != "qwen3":
            block = {
                name: shape for name, shape in block.items() if not name.endswith(("q_norm.weight", "k_norm.weight"))
            }
        if arch == "qwen2":
            block |= {f"blk.{i}.attn_{x}.bias": (width,) for x, width in widths.items()}
        shapes |= block
    return shapes


def hybrid_tensor_shapes(cfg: HybridConfig) -> dict[str, tuple[int, ...]]:
    """qwen35 tensors as llama.cpp names them; attention layers have a gated query (q and gate interleaved per head)."""
    d = cfg.d_model
    key_dim, value_dim = cfg.ssm_state * cfg.ssm_groups, cfg.ssm_state * cfg.ssm_v_heads
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,),
                                          "output.weight": (cfg.vocab, d)}
    for i in range(cfg.block_count):
        shapes[f"blk.{i}.attn_norm.weight"] = (d,)
        if cfg.is_recurrent(i):
            shapes |= {
                f"blk.{i}.attn_qkv.weight": (2 * key_dim + value_dim, d),
                f"blk.{i}.attn_gate.weight": (value_dim, d),
                f"blk.{i}.ssm_conv1d.weight": (2 * key_dim + value_dim, cfg.conv_kernel),
                f"blk.{i}.ssm_dt.bias": (cfg.ssm_v_heads,),
                f"blk.{i}.ssm_a": (cfg.ssm_v_heads,),
                f"blk.{i}.ssm_beta.weight": (cfg.ssm_v_heads, d),
                f"blk.{i}.ssm_alpha.weight": (cfg.ssm_v_heads, d),
                f"blk.{i}.ssm_norm.weight": (cfg.ssm_state,),
                f"blk.{i}.ssm_out.weight": (d, value_dim),
            }
        else:
            shapes |= {
                f"blk.{i}.attn_q.weight": (2 * q, d),
                f"blk.{i}.attn_k.weight": (kv, d),
                f"blk.{i}.attn_v.weight": (kv, d),
                f"blk.{i}.attn_q_norm.weight": (cfg.head_dim,),
                f"blk.{i}.attn_k_norm.weight": (cfg.head_dim,),
                f"blk.{i}.attn_output.weight": (d, q),
            }
        shapes |= {
            f"blk.{i}.post_attention_norm.weight": (d,),
            f"blk.{i}.ffn_gate.weight": (cfg.ffn, d),
            f"blk.{i}.ffn_up.weight": (cfg.ffn, d),
            f"blk.{i}.ffn_down.weight": (d, cfg.ffn),
        }
        if i >= cfg.n_layers:
            shapes |= contracts.nextn_tensors(i, d)
    return shapes


def gemma_tensor_shapes(cfg: DenseConfig) -> dict[str, tuple[int, ...]]:
    """gemma3 tensors: Gemma 3 blocks, the output tied to the token embedding."""
    d = cfg.d_model
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab, d), "output_norm.weight": (d,)}
    for i in range(cfg.n_layers):
        shapes |= contracts.gemma3_block_tensors(i, d, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.head_dim, cfg.ffn)
    return shapes


def dense_metadata(cfg: DenseConfig, arch: str, name: str, file_type: int) -> dict[str, Any]:
    return _trunk_metadata(cfg, arch, name, file_type, block_count=cfg.n_layers, rope_freq_base=1_000_000.0)


def hybrid_metadata(cfg: HybridConfig, name: str, file_type: int) -> dict[str, Any]:
    return {
        **_trunk_metadata(cfg, "qwen35", name, file_type, block_count=cfg.block_count,
                          rope_freq_base=cfg.rope_freq_base),
        "qwen35.rope.dimension_count": cfg.rope_dims,
        "qwen35.rope.dimension_sections": list(cfg.rope_sections),
        "qwen35.ssm.conv_kernel": cfg.conv_kernel,
        "qwen35.ssm.state_size": cfg.ssm_state,
        "qwen35.ssm.group_count": cfg.ssm_groups,
        "qwen35.ssm.time_step_rank": cfg.ssm_v_heads,
        "qwen35.ssm.inner_size": cfg.ssm_state * cfg.ssm_v_heads,
        "qwen35.full_attention_interval": cfg.interval,
        "qwen35.nextn_predict_layers": cfg.nextn,
        "qwen35.vocab_size": cfg.vocab,
    }


def _trunk_metadata(cfg: DenseConfig | HybridConfig, arch: str, name: str, file_type: int, *,
                    block_count: int, rope_freq_base: float) -> dict[str, Any]:
    """The general keys and the attention header every fixture trunk carries."""
    return {
        "general.name": name,
        "general.file_type": file_type,
        "general.quantization_version": 2,
        f"{arch}.context_length": cfg.ctx,
        f"{arch}.embedding_length": cfg.d_model,
        f"{arch}.block_count": block_count,
        f"{arch}.feed_forward_length": cfg.ffn,
        f"{arch}.attention.head_count": cfg.n_heads,
        f"{arch}.attention.head_count_kv": cfg.n_kv_heads,
        f"{arch}.attention.key_length": cfg.head_dim,
        f"{arch}.attention.value_length": cfg.head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": rope_freq_base,
    }


def _drafter_metadata(kind: str, hp: DrafterHparams, name: str, file_type: int) -> dict[str, Any]:
    return {"general.name": name, "general.file_type": file_type, "general.quantization_version": 2,
            **contracts.drafter_metadata(kind, hp)}


# --- the runnable fixtures -----------------------------------------------------------------

TOKENIZER = fixture_tokenizer()

DENSE = DenseConfig(d_model=FIXTURE_D_MODEL, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, ffn=192,
                    vocab=TOKENIZER.vocab_size, ctx=2048)
# Layer i stores its matrices as DENSE_LAYER_TYPES[i]: every small-block quant appears in the dense target.
DENSE_LAYER_TYPES = (Q4_0, Q5_0, Q8_0, F16)

# Gemma 270M's shape in small: one KV head, query heads wider than the model together; layer 5 is global.
GEMMA = DenseConfig(d_model=FIXTURE_D_MODEL, n_layers=6, n_heads=4, n_kv_heads=1, head_dim=32, ffn=128,
                    vocab=TOKENIZER.vocab_size, ctx=2048)
GEMMA_WINDOW = 16

HYBRID = HybridConfig(d_model=FIXTURE_D_MODEL, n_layers=8, nextn=1, n_heads=4, n_kv_heads=2, head_dim=16, ffn=192,
                      vocab=TOKENIZER.vocab_size, ctx=2048, interval=4, ssm_state=16, ssm_groups=2, ssm_v_heads=4,
                      conv_kernel=4, rope_dims=4, rope_sections=(1, 1, 0, 0))


def fixture_drafter_hparams(kind: str) -> DrafterHparams:
    """Drafters for the fixture targets: same width (they borrow the target's embedding and LM head)."""
    common = DrafterHparams(embedding_length=FIXTURE_D_MODEL, block_count=2, feed_forward_length=128, head_count=4,
                            head_count_kv=2, head_dim=16, vocab_size=TOKENIZER.vocab_size, block_size=4,
                            target_layers=(1, 3), mask_token_id=TOKENIZER.id_of("<|mask|>"))
    if kind == modes.DFLASH:
        return replace(common, sliding_window=32)
    if kind == modes.DFLASH2:
        return replace(common, sliding_window=32, conv_kernel_size=3, conv_group_size=16, selector_rank=8,
                       selector_top_k=4, logit_scale=1.0, final_logit_softcapping=30.0)
    return replace(common, markov_rank=8, confidence_threshold=0.5)


def _small_matrix_type(name: str, shape: tuple[int, ...]) -> Q:
    """Q8_0 where rows split into 32-blocks, F16 otherwise; vectors F32."""
    if (
        len(shape) == 1
        or name.endswith(".bias")
        or "ssm_conv1d" in name
        or "_conv_base" in name
        or name == "confidence.weight"
    ):
        return F32
    return Q8_0 if shape[-1] % 32 == 0 else F16


def _dense_layer_type(name: str, shape: tuple[int, ...]) -> Q:
    if len(shape) == 1:
        return F32
    if name == "token_embd.weight":
        return F16
    if name.startswith("blk."):
        return DENSE_LAYER_TYPES[int(name.split(".")[1]) % len(DENSE_LAYER_TYPES)]
    return Q8_0


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_dense_target(directory: Path, chat_template: str | None = None) -> Path:
    """`qwen3` dense target: 4 layers, GQA 4/2, d 64; layer i's matrices in Q4_0, Q5_0, Q8_0, F16. With
    `chat_template` (e.g. CHATML_TEMPLATE, which the fixture vocabulary's special tokens fit) its header carries one."""
    tensors = _Weights(FIXTURE_SEED).fill(dense_tensor_shapes(DENSE), _dense_layer_type)
    metadata = dense_metadata(DENSE, "qwen3", "fixture-dense-target",
                              FileType.MOSTLY_Q8_0) | tokenizer_metadata(TOKENIZER)
    if chat_template is not None:
        metadata["tokenizer.chat_template"] = chat_template
    return write_gguf(Path(directory) / "dense-target.gguf", "qwen3", metadata, tensors)


def build_dense_arch_target(directory: Path, arch: str) -> Path:
    """A `llama` or `qwen2` dense target of the qwen3 fixture's shape and quant types (its own weights): the other
    dense trunks the runtime runs (`power.runtime.trunks.llama`)."""
    seed = FIXTURE_SEED + {"llama": 8, "qwen2": 9}[arch]
    tensors = _Weights(seed).fill(dense_tensor_shapes(DENSE, arch), _dense_layer_type)
    metadata = dense_metadata(DENSE, arch, f"fixture-{arch}-target",
                              FileType.MOSTLY_Q8_0) | tokenizer_metadata(TOKENIZER)
    return write_gguf(Path(directory) / f"{arch}-target.gguf", arch, metadata, tensors)


def _gemma3_metadata(name: str) -> dict[str, Any]:
    return (_trunk_metadata(GEMMA, "gemma3", name, FileType.MOSTLY_Q8_0, block_count=GEMMA.n_layers,
                            rope_freq_base=1_000_000.0)
            | {"gemma3.attention.sliding_window": GEMMA_WINDOW} | tokenizer_metadata(TOKENIZER))


def build_gemma3_target(directory: Path) -> Path:
    """`gemma3` target: 6 layers (5 sliding, window 16; layer 5 global), 4 heads / 1 kv x 32, ffn 128, tied output."""
    tensors = _Weights(FIXTURE_SEED + 6).fill(gemma_tensor_shapes(GEMMA), _small_matrix_type)
    return write_gguf(Path(directory) / "gemma3-target.gguf", "gemma3", _gemma3_metadata("fixture-gemma3-target"),
                      tensors)


def build_gemma3_mtp_sidecar(directory: Path) -> Path:
    """The gemma3 target's MTP-only GGUF (what `power drafter distill --kind mtp` writes): its header with one nextn
    block more, a Gemma 3 block and the nextn tensors at blk.6, no embedding."""
    n = GEMMA.n_layers
    shapes = (contracts.gemma3_block_tensors(n, GEMMA.d_model, GEMMA.n_heads, GEMMA.n_kv_heads, GEMMA.head_dim,
                                             GEMMA.head_dim, GEMMA.ffn) | contracts.nextn_tensors(n, GEMMA.d_model))
    target = _gemma3_metadata("fixture-gemma3-mtp-only")
    metadata = {**target, **contracts.mtp_sidecar_metadata("gemma3", target, GEMMA.vocab)}
    tensors = _Weights(FIXTURE_SEED + 7).fill(shapes, _small_matrix_type)
    return write_gguf(Path(directory) / "gemma3-mtp-sidecar.gguf", "gemma3", metadata, tensors)


def _hybrid_tensors() -> dict[str, Tensor]:
    weights = _Weights(FIXTURE_SEED + 1)
    tensors = weights.fill(hybrid_tensor_shapes(HYBRID), _small_matrix_type)
    for name in tensors:
        if name.endswith(".ssm_a"):  # A = -exp(A_log): negative decay rates
            tensors[name] = Tensor(-np.exp(weights.rng.uniform(-1.0, 1.0, HYBRID.ssm_v_heads)).astype(np.float32), F32)
    return tensors


def build_hybrid_target(directory: Path) -> Path:
    """`qwen35` hybrid target: 8 layers (gated delta net, attention at 3 and 7) + one nextn/MTP block."""
    metadata = hybrid_metadata(HYBRID, "fixture-hybrid-target", FileType.MOSTLY_Q8_0) | tokenizer_metadata(TOKENIZER)
    return write_gguf(Path(directory) / "hybrid-target.gguf", "qwen35", metadata, _hybrid_tensors())


def _is_head(name: str) -> bool:
    return name.startswith(f"blk.{HYBRID.n_layers}.")


def build_headless_hybrid_target(directory: Path) -> Path:
    """The hybrid target shipped without its MTP head (docs/reference.md): the same trunk, no nextn block."""
    headless = replace(HYBRID, nextn=0)
    tensors = {name: t for name, t in _hybrid_tensors().items() if not _is_head(name)}
    metadata = hybrid_metadata(headless, "fixture-headless-target",
                               FileType.MOSTLY_Q8_0) | tokenizer_metadata(TOKENIZER)
    return write_gguf(Path(directory) / "headless-hybrid-target.gguf", "qwen35", metadata, tensors)


def build_mtp_sidecar(directory: Path) -> Path:
    """An MTP-only GGUF for the headless target (`convert_hf_to_gguf.py --mtp`): the base model's header, its
    embedding, output head and nextn block, no trunk tensors."""
    shared = {"token_embd.weight", "output_norm.weight", "output.weight"}
    tensors = {name: t for name, t in _hybrid_tensors().items() if _is_head(name) or name in shared}
    metadata = hybrid_metadata(HYBRID, "fixture-mtp-only", FileType.MOSTLY_Q8_0) | tokenizer_metadata(TOKENIZER)
    return write_gguf(Path(directory) / "mtp-sidecar.gguf", "qwen35", metadata, tensors)


def _build_drafter(path: Path, kind: str, seed: int, name: str, tokenizer: FixtureTokenizer = TOKENIZER) -> Path:
    hp = fixture_drafter_hparams(kind)
    weights = _Weights(seed)
    tensors = weights.fill(contracts.drafter_tensors(kind, hp), _small_matrix_type)
    if "confidence.bias" in tensors:
        tensors["confidence.bias"] = Tensor(np.zeros(1, dtype=np.float32), F32)
    metadata = _drafter_metadata(kind, hp, name, FileType.MOSTLY_Q8_0) | tokenizer_metadata(tokenizer)
    return write_gguf(path, modes.ARCHITECTURE_OF[kind], metadata, tensors)


def build_dflash_drafter(directory: Path) -> Path:
    """DFlash v1: 2 layers, block size 4, reads target layers 1 and 3, sliding window 32."""
    return _build_drafter(Path(directory) / "dflash-drafter.gguf", modes.DFLASH, FIXTURE_SEED + 2, "fixture-dflash")


def build_dflash2_drafter(directory: Path) -> Path:
    """DFlash2: DFlash v1 + grouped dynamic convolutions (kernel 3, groups of 16) + selector (rank 8, top-k 4)."""
    return _build_drafter(Path(directory) / "dflash2-drafter.gguf", modes.DFLASH2, FIXTURE_SEED + 3, "fixture-dflash2")


def build_dspark_drafter(directory: Path) -> Path:
    """DSpark: the DFlash backbone + Markov head (rank 8) + confidence head; no sliding window."""
    return _build_drafter(Path(directory) / "dspark-drafter.gguf", modes.DSPARK, FIXTURE_SEED + 4, "fixture-dspark")


def build_dspark_named_dflash(directory: Path) -> Path:
    """A DSpark drafter whose file name and general.name say DFlash: the header must win."""
    return _build_drafter(Path(directory) / "dflash-named-dspark.gguf", modes.DSPARK, FIXTURE_SEED + 5,
                          "fixture-dflash")


def build_tokenizer_mismatch_drafter(directory: Path) -> Path:
    """A DFlash v1 drafter whose vocabulary differs from the targets' in one token (and one merge)."""
    return _build_drafter(Path(directory) / "dflash-drafter-other-tokenizer.gguf", modes.DFLASH, FIXTURE_SEED + 2,
                          "fixture-dflash-other-tokenizer", fixture_tokenizer(altered=True))


def _truncated_copy(source: Path, target: Path, keep: int) -> Path:
    with atomic_path(target) as temp:
        temp.write_bytes(source.read_bytes()[:keep])
    return target


def build_truncated(directory: Path) -> dict[str, Path]:
    """The dense target cut inside its header, and cut inside its tensor data."""
    directory = Path(directory)
    source = build_dense_target(directory / ".truncated-source")
    data_offset = read_header(source).data_offset
    size = source.stat().st_size
    built = {
        "truncated-header": _truncated_copy(source, directory / "truncated-header.gguf", data_offset // 2),
        "truncated-data": _truncated_copy(source, directory / "truncated-data.gguf", (data_offset + size) // 2),
    }
    source.unlink()
    source.parent.rmdir()
    return built


# --- header-only fixtures at the real Qwen3.6-27B dimensions ----------------------------

QWEN36_27B = HybridConfig(d_model=5120, n_layers=64, nextn=1, n_heads=24, n_kv_heads=4, head_dim=256, ffn=17408,
                          vocab=248320, ctx=262144, interval=4, ssm_state=128, ssm_groups=16, ssm_v_heads=48,
                          conv_kernel=4, rope_dims=64, rope_sections=(11, 11, 10, 0))


def real_drafter_hparams(kind: str) -> DrafterHparams:
    """Qwen3.6-27B drafters: 5 layers x 8 kv heads x head dim 128 at the target's width 5120."""
    common = DrafterHparams(embedding_length=5120, block_count=5, feed_forward_length=17408, head_count=32,
                            head_count_kv=8, head_dim=128, vocab_size=QWEN36_27B.vocab, block_size=16,
                            target_layers=(1, 16, 31, 46, 61), mask_token_id=248077)
    if kind == modes.DFLASH:
        return replace(common, sliding_window=2048)
    if kind == modes.DFLASH2:
        return replace(common, sliding_window=2048, conv_kernel_size=4, conv_group_size=128, selector_rank=64,
                       selector_top_k=8, logit_scale=1.0, final_logit_softcapping=0.0)
    return replace(common, markov_rank=256, confidence_threshold=0.5)


def _real_type(main: Q) -> Callable[[str, tuple[int, ...]], Q]:
    """The main quant where rows split into its blocks; F16 for other matrices; F32 for vectors and convolutions."""
    block = block_values(main)

    def type_of(name: str, shape: tuple[int, ...]) -> Q:
        if len(shape) == 1 or "ssm_conv1d" in name or "_conv_base" in name or name == "confidence.weight":
            return F32
        return main if shape[-1] % block == 0 else F16

    return type_of


def _typed(shapes: dict[str, tuple[int, ...]],
           type_of: Callable[[str, tuple[int, ...]], Q]) -> dict[str, tuple[tuple[int, ...], Q]]:
    return {name: (shape, type_of(name, shape)) for name, shape in shapes.items()}


def build_qwen36_27b_q6k(directory: Path) -> Path:
    """The Qwen3.6-27B Q6_K target's header (64 layers: 48 GDN + 16 attention, + 1 MTP block),
    padded to 22,884,408,288 B."""
    tensors = _typed(hybrid_tensor_shapes(QWEN36_27B), _real_type(Q6_K))
    metadata = hybrid_metadata(QWEN36_27B, "Qwen3.6-27B (header only)", FileType.MOSTLY_Q6_K)
    return write_sparse_gguf(Path(directory) / "qwen36-27b-q6k.gguf", "qwen35", metadata, tensors, QWEN36_27B_Q6K_SIZE)


def _build_real_drafter(path: Path, kind: str, main: Q, file_type: int, name: str) -> Path:
    hp = real_drafter_hparams(kind)
    tensors = _typed(contracts.drafter_tensors(kind, hp), _real_type(main))
    return write_sparse_gguf(path, modes.ARCHITECTURE_OF[kind], _drafter_metadata(kind, hp, name, file_type), tensors)


def build_qwen36_27b_dflash(directory: Path) -> Path:
    """The Qwen3.6-27B DFlash v1 drafter's header, Q8_0 (58 tensors)."""
    return _build_real_drafter(Path(directory) / "qwen36-27b-dflash-q8_0.gguf", modes.DFLASH, Q8_0,
                               FileType.MOSTLY_Q8_0, "Qwen3.6-27B-DFlash (header only)")


def build_qwen36_27b_dflash2(directory: Path) -> Path:
    """The Qwen3.6-27B DFlash2 drafter's header, Q4_K (81 tensors)."""
    return _build_real_drafter(Path(directory) / "qwen36-27b-dflash2-q4_k.gguf", modes.DFLASH2, Q4_K,
                               FileType.MOSTLY_Q4_K_M, "Qwen3.6-27B-DFlash2 (header only)")


def build_qwen36_27b_dspark(directory: Path) -> Path:
    """The Qwen3.6-27B DSpark drafter's header, Q4_K, no sliding window (20 KiB of KV per position)."""
    return _build_real_drafter(Path(directory) / "qwen36-27b-dspark-q4_k.gguf", modes.DSPARK, Q4_K,
                               FileType.MOSTLY_Q4_K_M, "Qwen3.6-27B-DSpark (header only)")


SINGLE_FIXTURES: dict[str, Callable[[Path], Path]] = {
    "dense-target": build_dense_target,
    "llama-target": functools.partial(build_dense_arch_target, arch="llama"),
    "qwen2-target": functools.partial(build_dense_arch_target, arch="qwen2"),
    "hybrid-target": build_hybrid_target,
    "gemma3-target": build_gemma3_target,
    "gemma3-mtp-sidecar": build_gemma3_mtp_sidecar,
    "headless-hybrid-target": build_headless_hybrid_target,
    "mtp-sidecar": build_mtp_sidecar,
    "dflash-drafter": build_dflash_drafter,
    "dflash2-drafter": build_dflash2_drafter,
    "dspark-drafter": build_dspark_drafter,
    "dflash-named-dspark": build_dspark_named_dflash,
    "dflash-drafter-other-tokenizer": build_tokenizer_mismatch_drafter,
    "qwen36-27b-q6k": build_qwen36_27b_q6k,
    "qwen36-27b-dflash": build_qwen36_27b_dflash,
    "qwen36-27b-dflash2": build_qwen36_27b_dflash2,
    "qwen36-27b-dspark": build_qwen36_27b_dspark,
}


def build_fixtures(directory: Path) -> dict[str, Path]:
    """Write every fixture into `directory`; returns {fixture name: path}."""
    built = {name: build(Path(directory)) for name, build in SINGLE_FIXTURES.items()}
    return built | build_truncated(Path(directory))
