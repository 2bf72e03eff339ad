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


def _subcommands() -> list[tuple[str, ...]]:
    """Every command and every command of a group, as `power ... --help` names them."""
    import click

    from power.app.cli import COMMANDS, main

    context = click.Context(main)
    found = []
    for name in COMMANDS:
        command = main.get_command(context, name)
        found.append((name,))
        if isinstance(command, click.Group):
            found += [(name, sub) for sub in command.list_commands(context)]
    return found


@pytest.mark.parametrize("command", _subcommands(), ids=" ".join)
def test_a_commands_help_imports_nothing_heavy(command):
    """Issue 40 (low): `power <command> --help` took 1-2.8 s, importing the sizing's numpy, the renders' jinja2 and
    YAML, the pull's progress bar, the fixtures' gguf writer or torch for the kernels. Help needs none of them."""
    loaded = loaded_by(*command, "--help")
    heavy = loaded & HEAVY
    assert not heavy, f"power {' '.join(command)} --help imported {sorted(heavy)}"


def test_inspect_reads_a_header_without_the_schema_models():
    assert "pydantic" not in loaded_by("inspect", "--json", str(gemma()))


def refused(*args: str) -> tuple[int, str, bool]:
    """`power ARGS` in a new process: its exit code, its stderr, and whether it imported torch."""
    probe = (
        "import sys\n"
        "from power.app.cli import main\n"
        f"sys.argv = ['power', *{list(args)!r}]\n"
        "try:\n    main()\n"
        "except SystemExit as end:\n    code = end.code\n"
        "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=600)
    return result.returncode, result.stderr, "torch imported: True" in result.stderr


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> Path:
    """Gemma's n-gram plan, the same plan edited by hand, a chat template that does not compile, and a plan whose
    context (512) is shorter than the bench's echo passage."""
    from click.testing import CliRunner

    from power.app.cli import main

    folder = tmp_path_factory.mktemp("plans")
    small = folder / "small-ctx.toml"
    small.write_text((REPO / "profiles" / "ngram.toml").read_text().replace("ctx = 4096", "ctx = 512"))
    for profile, name in ((REPO / "profiles" / "ngram.toml", "plan.json"), (small, "small.json")):
        made = CliRunner().invoke(main, ["plan", str(REPO / "manifests" / "gemma3-270m.toml"), str(profile),
                                         "--device", "24 GiB", "-o", str(folder / name)])
        assert made.exit_code == 0, made.output
    plan = json.loads((folder / "plan.json").read_text())
    plan["runtime"]["ctx"] += 1
    (folder / "edited.json").write_text(json.dumps(plan))
    (folder / "bad.jinja").write_text("{{ unclosed")
    return folder


@pytest.mark.parametrize("args, code", [
    (("serve", "PLANS/plan.json", "--api-key-file", "PLANS/missing-key"), "PWR606"),
    (("serve", "PLANS/plan.json", "--chat-template-file", "PLANS/bad.jinja"), "PWR605"),
    (("serve", "PLANS/edited.json"), "PWR082"),
    (("run", "PLANS/edited.json", "--prompt", "The"), "PWR082"),
    (("bench", "PLANS/edited.json"), "PWR082"),
    (("bench", "PLANS/plan.json", "--vs", "PLANS/edited.json"), "PWR082"),
    (("bench", "PLANS/plan.json", "--engine", "llama-server", "--engine-binary", "PLANS/no-such-binary"), "PWR470"),
    (("run", "PLANS/plan.json", "--prompt", "The", "--device", "tpu"), "PWR601"),
    (("serve", "PLANS/plan.json", "--device", "gpu0"), "PWR601"),
], ids=["serve-key-file", "serve-template", "serve-edited", "run-edited", "bench-edited", "bench-vs-edited",
        "bench-no-binary", "run-unknown-device", "serve-unknown-device"])
def test_a_refusal_that_needs_no_model_comes_before_the_runtime_is_imported(plans, args, code):
    """Issue 40.5: these refused after 8-10 s of loading (58 s for a bench prompt on the 27B), where `power verify`
    says the same in about a second. Each is refused before torch is imported, let alone a model read."""
    exit_code, stderr, torch_imported = refused(*(arg.replace("PLANS", str(plans)) for arg in args))
    assert exit_code == 2 and f"{code} [error]" in stderr, stderr[-2000:]
    assert not torch_imported


@pytest.mark.parametrize("args, code", [
    (("--device", "gpu0"), "PWR601"),
    (("--api-key-file", "PLANS/missing-key"), "PWR606"),
    (("--chat-template-file", "PLANS/bad.jinja"), "PWR605"),
], ids=["unknown-device", "missing-key-file", "bad-template"])
def test_a_serve_refusal_that_needs_no_model_leaves_its_port_free(plans, args, code):
    """Issue 40 (noticed): `serve` bound its port, then checked --device; the refusal came with the port held. Every
    refusal that needs no model is made before the socket is bound, so the port is free for the corrected command."""
    import socket

    from click.testing import CliRunner

    from power.app.cli import main
    from power.app.live import free_port

    port = free_port()
    result = CliRunner().invoke(main, ["serve", str(plans / "plan.json"), "--port", str(port),
                                       *(arg.replace("PLANS", str(plans)) for arg in args)])
    assert result.exit_code == 2 and f"{code} [error]" in result.output, result.output
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_a_bench_prompt_longer_than_the_context_is_refused_before_any_model_loads(plans):
    """The echo passage (~1.5k tokens) against a 512-position plan: counted with the target's tokenizer from its
    header, refused (PWR602) before `loading candidate`."""
    exit_code, stderr, _ = refused("bench", str(plans / "small.json"), "--shapes", "echo")
    assert exit_code == 2, stderr[-2000:]
    assert "PWR602 [error] candidate plan, traffic shape echo: the prompt is" in stderr
    assert "the context is 512 positions (with 64 tokens to generate)" in stderr
    assert "loading candidate" not in stderr


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda_here(), reason="this host has a CUDA device: --device cuda runs here")
@pytest.mark.parametrize("command", [
    ("run", "PLANS/plan.json", "--prompt", "The", "--device", "cuda"),
    ("serve", "PLANS/plan.json", "--device", "cuda:0"),
    ("bench", "PLANS/plan.json", "--device", "cuda"),
], ids=["run", "serve", "bench"])
def test_cuda_on_a_host_without_it_is_refused_before_torch_is_imported(plans, command):
    """Issue 40.5: `run --device cuda` on a host with no CUDA was refused before the model loaded but after torch's
    import (seconds). The installed torch's build and the NVIDIA driver say no without importing torch."""
    exit_code, stderr, torch_imported = refused(*(arg.replace("PLANS", str(plans)) for arg in command))
    assert exit_code == 2 and "PWR601 [error]" in stderr, stderr[-2000:]
    assert "built without CUDA" in stderr or "no NVIDIA driver" in stderr
    assert not torch_imported


def test_a_cuda_build_of_torch_without_a_driver_is_refused_before_torch_is_imported(plans, tmp_path):
    """A CUDA build of torch (the default wheel on Linux) on a host with no NVIDIA driver: the driver's library
    does not load, so the run is refused before torch's import. A stand-in torch package whose import fails shows
    that only its version file was read."""
    import ctypes

    from power.runtime.devices import DRIVER_LIBRARY

    try:
        ctypes.CDLL(DRIVER_LIBRARY)
        pytest.skip("this host has an NVIDIA driver")
    except OSError:
        pass
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('the stand-in torch was imported')\n")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.13.0+cu128'\ncuda = '12.8'\nhip = None\n")
    probe = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from power.app.cli import main\n"
        f"sys.argv = ['power', 'run', {str(plans / 'plan.json')!r}, '--prompt', 'The', '--device', 'cuda']\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"PWR601 [error] device 'cuda': no NVIDIA driver is installed here ({DRIVER_LIBRARY} does not load)" \
        in result.stderr
