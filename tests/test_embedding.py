"""The token embedding (`power.runtime.embedding`): one copy of the weights, rows with the dequantiser's bits.

Gemma 3 270M's embedding is tied to its LM head: the embedding reads the head's rows where the head holds
them, so the 178 MB Q8_0 matrix is held once (it was held twice, as GGUF rows and as the head's tiles). An
untied embedding keeps its own GGUF rows.
"""

from __future__ import annotations

import pytest
import torch
from gguf_helpers import fixtures, gemma

from power.documents.arithmetic import ARITHMETICS, QUANTISED
from power.kernels.dequant import dequantize_reference
from power.runtime.gguf_weights import GGUFFile
from power.runtime.trunks import load_trunk
from power.runtime.trunks.base import GREEDY_HEAD

TOKENS = torch.tensor([2, 818, 262_143, 5, 818])  # first, last and repeated rows


def file_rows(model: GGUFFile, name: str, tokens: torch.Tensor) -> torch.Tensor:
    info = model.info(name)
    rows = model.raw(name).view(info.shape[0], -1)[tokens].reshape(-1)
    return dequantize_reference(info.qtype, rows, (len(tokens), info.shape[1]))


def test_a_tied_embedding_is_the_lm_heads_rows_held_once():
    model = GGUFFile(gemma())
    trunk = load_trunk(model, n_ctx=64, verify_capacity=4, arithmetic=QUANTISED)
    assert torch.equal(trunk.embedding(TOKENS), file_rows(model, "token_embd.weight", TOKENS))
    # every tensor of the file once, in its own bytes (Gemma's widths need no tile padding): no second copy of the
    # embedding; the one other thing held is the greedy head's norm bytes (the head held once in its pass's form)
    held = dict(trunk.held)
    compact = held.pop(GREEDY_HEAD)
    assert sum(held.values()) == sum(info.nbytes for info in model.tensors.values())
    assert "token_embd.weight" not in held and held["token_embd.weight (LM head)"] == 262_144 * 680
    assert compact == 262_144 // 16 * 14 * 16
    assert trunk.weight_bytes == sum(held.values()) + compact


@pytest.mark.parametrize("arithmetic", ARITHMETICS)
def test_an_untied_embedding_keeps_its_own_gguf_rows(arithmetic):
    model = GGUFFile(fixtures()["dense-target"])
    trunk = load_trunk(model, n_ctx=64, verify_capacity=4, arithmetic=arithmetic)
    info = model.info("token_embd.weight")
    tokens = torch.tensor([0, info.shape[0] - 1, 7, 7])
    assert torch.equal(trunk.embedding(tokens), file_rows(model, "token_embd.weight", tokens))
    assert trunk.held["token_embd.weight"] == info.nbytes
