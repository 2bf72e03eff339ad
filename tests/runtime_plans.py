"""Shared by the server and bench tests: resolved plans over the factory's small dense target,
made with `power plan`."""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

from click.testing import CliRunner

from power.app.cli import main
from power.artifacts import factory
from power.artifacts.digests import sha256_file

VERIFY_CAPACITY = 8  # one fixed shape for both plans, so their greedy streams are comparable bit for bit

PROFILES = {
    "ngram": f"""
        schema = "power.profile/v1"
        name = "ngram-k3"
        spec_mode = "ngram"
        spec_draft_max = 3
        spec_mtp_recurrent_snapshots = 3
        [runtime]
        ctx = 512
        verify_capacity = {VERIFY_CAPACITY}
        ngram_match = 2
    """,
    "slots": f"""
        schema = "power.profile/v1"
        name = "ngram-k3-slots4"
        spec_mode = "ngram"
        spec_draft_max = 3
        spec_mtp_recurrent_snapshots = 3
        [runtime]
        ctx = 2048
        slots = 4
        verify_capacity = {VERIFY_CAPACITY}
        ngram_match = 2
    """,
    "slots-none": f"""
        schema = "power.profile/v1"
        name = "control-slots4"
        spec_mode = "none"
        [runtime]
        ctx = 2048
        slots = 4
        verify_capacity = {VERIFY_CAPACITY}
    """,
    "none": f"""
        schema = "power.profile/v1"
        name = "control"
        spec_mode = "none"
        [runtime]
        ctx = 512
        verify_capacity = {VERIFY_CAPACITY}
    """,
}
# The same plans in the float32 reference arithmetic (the fixture's quantised greedy stream on the echo prompt has
# no repeat a stop string can be cut from; the float32 one has).
PROFILES |= {f"{name}-float32": text.replace("[runtime]", "[runtime]\n        arithmetic = \"float32\"")
             for name, text in list(PROFILES.items())}


def write_plan(directory: Path, profile: str, chat_template: str | None = None, engine: str = "power") -> Path:
    """The dense fixture planned in `directory` with a profile above (a JSON plan file) for `engine`; with
    `chat_template`, the target's header carries that chat template."""
    target = directory / "dense-target.gguf"
    if not target.exists():
        factory.build_dense_target(directory, chat_template)
        (directory / "manifest.toml").write_text(
            'schema = "power.manifest/v1"\nname = "dense-fixture"\n[target]\n'
            f'path = "{target.name}"\nsha256 = "{sha256_file(target, progress=False)}"\n[[drafters]]\nkind = "ngram"\n'
        )
    profile_path = directory / f"{profile}.profile.toml"
    profile_path.write_text("\n".join(line.strip() for line in PROFILES[profile].splitlines()) + "\n")
    out = directory / f"{profile}.{engine}.plan.json"
    result = CliRunner().invoke(main, ["plan", str(directory / "manifest.toml"), str(profile_path),
                                       "--device", "1 GiB", "--engine", engine, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


@lru_cache(maxsize=None)
def fixture_plan(profile: str) -> Path:
    """`write_plan` in one temporary folder per test run."""
    return write_plan(_shared_dir("plain"), profile)


@lru_cache(maxsize=None)
def chat_plan(profile: str) -> Path:
    """`write_plan` over a target whose header carries the ChatML template its vocabulary's special tokens fit."""
    return write_plan(_shared_dir("chat"), profile, factory.CHATML_TEMPLATE)


@lru_cache(maxsize=None)
def _shared_dir(kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"power-runtime-plans-{kind}-"))
