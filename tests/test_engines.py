"""The engine adapters: a plan no engine can run is never sealed, and no module outside the adapters tests an
engine's name (issue 23)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from click.testing import CliRunner
from gguf_helpers import gemma
from plan_helpers import codes, write_manifest, write_profile

from power.app.cli import main
from power.orchestrator.engines import ADAPTERS, ENGINES
from power.orchestrator.fleet.review import review_fleet

REPO = Path(__file__).resolve().parents[1]


def test_plan_for_vllm_refuses_a_dflash2_manifest_at_the_manifests_drafter(tmp_path):
    """Defect 2: `power plan --engine vllm` on a DFlash2 manifest exited 0 with a sealed plan."""
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "dflash2", "fixture": "dflash2-drafter"}])
    profile = write_profile(tmp_path, "dflash2")
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(main, ["plan", str(manifest), str(profile), "--device", "24 GiB", "--engine", "vllm",
                                       "-o", str(out), "--json"])
    assert result.exit_code == 1 and not out.exists()
    assert "PWR460" in result.output and f"{manifest}:" in result.output
    assert CliRunner().invoke(main, ["plan", str(manifest), str(profile), "--device", "24 GiB", "-o",
                                     str(out)]).exit_code == 0


def test_fleet_review_refuses_what_the_deployments_engine_cannot_run(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "dflash2", "fixture": "dflash2-drafter"}])
    profile = write_profile(tmp_path, "dflash2")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('schema = "power.fleet/v1"\n[[hosts]]\nname = "a"\ndevices = '
                     f'[{{ model = "L4", vram = "24 GiB" }}]\n[[deployments]]\nhost = "a"\nmanifest = '
                     f'"{manifest.name}"\nprofile = "{profile.name}"\nengine = "vllm"\n')
    review = review_fleet(fleet)
    assert review.has_errors and "PWR460" in codes(review.all_findings)
    assert not review.deployments[0].plan


def test_each_engine_has_an_adapter_and_the_plan_vocabulary_names_them():
    from typing import get_args

    from power.documents.plan import EngineName

    assert set(ENGINES) == set(get_args(EngineName)) == set(ADAPTERS)


def _outside_the_engines() -> list[Path]:
    """Every module of the package but those in an engine's folder (power/orchestrator/engines/<engine>/, its
    adapter's): the registry, the adapter contract and the sizing vocabulary beside them are read too."""
    folders = {Path(inspect.getfile(type(adapter))).parent for adapter in ADAPTERS.values()}
    return [path for path in (REPO / "power").rglob("*.py") if not folders & set(path.parents)]


def _engine_names_used(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each engine name compared (`== "vllm"`, `in ("power", ...)`) or used as a key (a dict's,
    or a subscript's; a `Literal[...]` type names the engines, as the plan's vocabulary `EngineName` does)."""
    def named(node: ast.expr | None) -> list[ast.Constant]:
        elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return [e for e in elements if isinstance(e, ast.Constant) and e.value in ENGINES]

    used: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            used += [c for operand in (node.left, *node.comparators) for c in named(operand)]
        elif isinstance(node, ast.Dict):
            used += [c for key in node.keys for c in named(key)]
        elif isinstance(node, ast.Subscript) and not (isinstance(node.value, ast.Name) and node.value.id == "Literal"):
            used += named(node.slice)
    return [(c.lineno, str(c.value)) for c in used]


def test_no_module_outside_the_engines_folders_tests_an_engines_name():
    """An engine's knowledge lives in its folder: elsewhere no `engine ==` test, and no engine name compared or used
    as a key (read with `ast`, as tests/test_layers.py reads imports)."""
    pattern = re.compile(r"engine\s*==")
    tested = [f"{path.relative_to(REPO)}:{number}" for path in _outside_the_engines()
              for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    named = [f"{path.relative_to(REPO)}:{line}: {name!r}" for path in _outside_the_engines()
             for line, name in _engine_names_used(ast.parse(path.read_text()))]
    assert tested == [] and named == []


def test_the_guard_sees_an_engine_name_compared_or_used_as_a_key():
    code = ('a = x == "vllm"\nb = y in ("power", "z")\nc = {"llama-server": 1}\nd = e["vllm"]\nf = g == "other"\n'
            'E = Literal["power", "vllm"]\n')
    assert _engine_names_used(ast.parse(code)) == [(1, "vllm"), (2, "power"), (3, "llama-server"), (4, "vllm")]


def test_a_switch_style_flash_attn_before_another_option_names_the_real_mistake():
    """Defect 9: `-fa -ctk q8_0` was reported as llama-server not knowing `q8_0`."""
    result = CliRunner().invoke(main, ["import", "llama-server", "--", "-m", "model.gguf", "-fa", "-ctk", "q8_0"])
    assert result.exit_code == 1
    assert "PWR441" in result.output and "-fa takes a value" in result.output and "-fa on" in result.output
    assert "does not know 'q8_0'" not in result.output


def test_a_device_size_without_its_unit_is_refused_with_the_fix(tmp_path):
    """Defect 7: `vram = 24` and `--device 24` passed, and the plan blamed the profile's ctx."""
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    profile = write_profile(tmp_path, "ngram")
    result = CliRunner().invoke(main, ["plan", str(manifest), str(profile), "--device", "24"])
    assert result.exit_code == 2 and '"24 GiB"' in result.output and "ctx" not in result.output
    host = tmp_path / "host.toml"
    host.write_text('schema = "power.host/v1"\nname = "h"\ndevices = [{ model = "L4", vram = 24 }]\n')
    validated = CliRunner().invoke(main, ["validate", str(host)])
    assert validated.exit_code == 1 and '"24 GiB"' in validated.output and f"{host}:3" in validated.output


def test_an_imported_line_keeps_its_engine_and_a_default_engine_is_said(tmp_path):
    """Defect 10: `power import llama-server` then `power size` sized the line for Power's runtime, silently."""
    out = tmp_path / "imported"
    imported = CliRunner().invoke(main, ["import", "llama-server", "-o", str(out), "--", "-m", str(gemma()),
                                         "-c", "2048", "-np", "2"])
    assert imported.exit_code == 0, imported.output
    assert 'engine = "llama-server"' in (out / "profile.toml").read_text()
    sized = CliRunner().invoke(main, ["size", str(out / "manifest.toml"), str(out / "profile.toml"), "--device",
                                      "8 GiB", "--json"])
    assert sized.exit_code == 0 and '"engine": "llama-server"' in sized.stdout and "note:" not in sized.stderr
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    planned = CliRunner().invoke(main, ["plan", str(manifest), str(write_profile(tmp_path, "ngram")), "--device",
                                        "8 GiB"])
    assert planned.exit_code == 0 and "note: sized for Power's runtime, the default engine" in planned.stderr


def test_a_fleet_deployment_without_an_engine_says_it_runs_the_default(tmp_path):
    manifest = write_manifest(tmp_path, "dense-target", [{"kind": "ngram"}])
    profile = write_profile(tmp_path, "ngram")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('schema = "power.fleet/v1"\n[[hosts]]\nname = "a"\ndevices = '
                     f'[{{ model = "L4", vram = "24 GiB" }}]\n[[deployments]]\nhost = "a"\nmanifest = '
                     f'"{manifest.name}"\nprofile = "{profile.name}"\n')
    review = review_fleet(fleet)
    assert codes(review.all_findings).count("PWR050") == 1 and review.deployments[0].plan.memory.engine == "power"
    profile.write_text(profile.read_text().replace("[runtime]", 'engine = "llama-server"\n[runtime]'))
    review = review_fleet(fleet)
    assert "PWR050" not in codes(review.all_findings)
    assert review.deployments[0].plan.memory.engine == "llama-server"


def test_a_busy_port_is_reported_before_the_runtime_loads(tmp_path):
    """Defect 12: `power serve` on a busy port reported it after loading the runtime's stack (8.7 s)."""
    import socket
    import subprocess
    import sys

    from runtime_plans import write_plan

    plan = write_plan(tmp_path, "ngram")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code = ("import sys; sys.argv = ['power', 'serve', sys.argv[1], '--port', sys.argv[2]]\n"
                "try:\n    from power.app.cli import main; main()\nfinally:\n"
                "    print('torch loaded' if 'torch' in sys.modules else 'torch not loaded', file=sys.stderr)")
        result = subprocess.run([sys.executable, "-c", code, str(plan), str(taken.getsockname()[1])],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "PWR604" in result.stderr and "torch not loaded" in result.stderr


def test_a_refusal_without_a_file_of_its_own_is_located_at_the_plan(tmp_path):
    """Defect 12: a prompt longer than the context was reported at `<input>:`, not at the plan the command ran."""
    from runtime_plans import write_plan

    plan = write_plan(tmp_path, "ngram")
    result = CliRunner().invoke(main, ["run", str(plan), "--prompt", "word " * 4000, "--max-tokens", "2"])
    assert result.exit_code == 2 and "PWR602" in result.stderr
    assert result.stderr.startswith(f"{plan}: PWR602") and "<input>" not in result.stderr


def test_the_llama_server_settings_table_reads_both_ways():
    """Setting <-> flag <-> env name, as llama.cpp's common/arg.cpp keeps them in one entry."""
    from power.orchestrator.engines.llama_server import flags as llama_flags
    from power.orchestrator.engines.llama_server.settings import field_of_option, settings_table

    table = llama_flags.table()
    for setting in settings_table().entries:
        option = table.option(str(setting.flag))
        assert option.env == setting.env and field_of_option(option) == setting.field
        if setting.env is not None:
            assert field_of_option(table.by_env[setting.env]) == setting.field
    settings = settings_table()
    assert settings.env("ctx") == "LLAMA_ARG_CTX_SIZE" and settings.field_of_env("LLAMA_ARG_CTX_SIZE") == "ctx"
    assert settings.flag("fit") == "--fit" and settings.field_of_flag("-c") == "ctx"


def test_every_engine_setting_says_what_it_means():
    """One entry per setting holds its flag, its variable and its help, as llama.cpp's `common_arg` does."""
    unexplained = [f"{name}: {setting.field}" for name, engine in ADAPTERS.items()
                   for setting in engine.settings.entries if not setting.help]
    assert unexplained == []


def test_a_switch_is_rendered_on_or_off_through_the_settings_table():
    settings = ADAPTERS["llama-server"].settings
    assert (settings.switch("kv_unified", True), settings.switch("kv_unified", False)) == ("--kv-unified",
                                                                                           "--no-kv-unified")
