"""Commands that only read headers or TOML start like a CLI: they never import the runtime's heavy libraries.

A guard on the import set rather than a timing assert (timings belong in benchmarks): each command runs in a
fresh interpreter, and the top-level packages it loaded are compared with the ones it must not load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf_helpers import gemma

REPO = Path(__file__).resolve().parents[1]
# The runtime's stack and the `gguf` package (it pulls in yaml): none is needed to read a header or a TOML file.
# (The header reader keeps a long numeric array as a read-only memoryview of the header's bytes: no numpy.)
HEAVY = {"torch", "triton", "numpy", "gguf", "yaml", "jinja2", "tqdm", "tokenizers", "starlette", "uvicorn"}


def loaded_by(*args: str) -> set[str]:
    """The top-level packages `power ARGS` imports, run as a new process."""
    probe = (
        "import json, sys\n"
        "from power.app.cli import main\n"
        f"sys.argv = ['power', *{list(args)!r}]\n"
        "try:\n    main()\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})), file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    return set(json.loads(result.stderr.splitlines()[-1]))


@pytest.mark.parametrize("args", [
    ("--help",),
    ("validate", "manifests", "profiles"),
    ("inspect", "--json", "GEMMA"),
], ids=["help", "validate", "inspect"])
def test_header_and_toml_commands_import_nothing_heavy(args):
    loaded = loaded_by(*(str(gemma()) if arg == "GEMMA" else arg for arg in args))
    assert "power" in loaded
    heavy = loaded & HEAVY
    assert not heavy, f"power {' '.join(args)} imported {sorted(heavy)}"


def test_inspect_reads_a_header_without_the_schema_models():
    assert "pydantic" not in loaded_by("inspect", "--json", str(gemma()))
