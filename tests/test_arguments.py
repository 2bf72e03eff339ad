"""The big commands' argument records (power/app/arguments/): options that cannot go together, or a value that does
not parse, are a usage error (exit 2) before any input is read, each naming the fix."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from power.app.cli import main


@pytest.mark.parametrize(("words", "said"), [
    (["--target", "llama-server", "--address", "0.0.0.0"], "--address and --port go together"),
    (["--target", "env", "--api-key-file", "/k"], "--target env carries no engine command line"),
    (["--target", "kubernetes", "--api-key-file", "/k"], "takes the key from a Secret: --api-key-secret NAME"),
    (["--target", "vllm", "--api-key-secret", "key"], "applies to --target kubernetes"),
    (["--target", "kubernetes", "--api-key-secret", "Not_A_Name"], "names a Kubernetes Secret"),
    (["--target", "kubernetes", "--models-claim", "models"], "--target kubernetes needs --host HOST.toml"),
], ids=["address-alone", "env-key-file", "kubernetes-key-file", "secret-elsewhere", "secret-name", "no-host"])
def test_options_that_do_not_go_together_are_refused_before_the_plan_is_read(tmp_path, words, said):
    result = CliRunner().invoke(main, ["render", str(tmp_path / "absent-plan.json"), *words])
    assert result.exit_code == 2 and said in result.output


def test_kubernetes_needs_exactly_one_model_volume(tmp_path):
    host = tmp_path / "host.toml"
    host.write_text('schema = "power.host/v1"\nname = "h"\ndevices = [{ model = "L4", vram = "24 GiB" }]\n')
    for volume in ([], ["--models-claim", "c", "--models-empty-dir"]):
        result = CliRunner().invoke(main, ["render", str(tmp_path / "absent-plan.json"), "--target", "kubernetes",
                                           "--host", str(host), *volume])
        assert result.exit_code == 2 and "needs one of --models-host-path, --models-claim" in result.output


@pytest.mark.parametrize("budget", ["soon", "0m", "-5s", "20 minutes"])
def test_a_distill_budget_that_is_not_a_duration_is_refused_before_the_manifest_is_read(tmp_path, budget):
    manifest = tmp_path / "manifest.toml"
    manifest.write_text("not toml at all [")
    result = CliRunner().invoke(main, ["drafter", "distill", str(manifest), "--kind", "dflash", "--budget", budget,
                                       "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "is not a duration: write 20m, 90s or 1.5h" in result.output
    assert not (tmp_path / "out").exists()
