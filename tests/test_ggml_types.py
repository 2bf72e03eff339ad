"""Power's own GGUF value type and GGML tensor/file type tables equal the `gguf` package's, entry for entry."""

from __future__ import annotations

import gguf

from power.artifacts.ggml_types import FILE_TYPES, QUANT_BY_NAME, QUANT_TYPES, ValueType


def test_value_types_match_gguf():
    assert {t.name: t.value for t in ValueType} == {t.name: t.value for t in gguf.GGUFValueType}


def test_quant_types_match_gguf_names_and_layouts():
    theirs = {t.value: (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType}
    assert {type_id: tuple(quant) for type_id, quant in QUANT_TYPES.items()} == theirs
    assert set(QUANT_BY_NAME) == {t.name for t in gguf.GGMLQuantizationType}


def test_file_types_match_llama_cpp_names():
    assert FILE_TYPES == {t.value: t.name.removeprefix("MOSTLY_") for t in gguf.LlamaFileType}
