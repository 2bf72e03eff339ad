"""An artifact against the sha256 its plan was sealed with: every byte hashed, never an answer from the cache.

Where a plan launches (run, serve, bench) or is verified (`power verify`), each
file it names is checked here; `render` checks only that each is there at its
planned size (`present`), since `power verify` is the gate before a rendered
engine starts (the Kubernetes render runs it in the pod's init container). A file whose size differs from the planned
size fails before it is read; otherwise it is hashed in full
(`power.artifacts.digests.sha256_file(use_cache=False)`), so neither a restored
mtime nor a stale cache entry can stand in for the bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from power.artifacts.digests import read_and_hash, sha256_file
from power.artifacts.gguf_reader import ArtifactError

__all__ = ["Artifact", "ArtifactError", "present", "read_verified", "verified_sha256"]

TARGET = "target"


@dataclass(frozen=True)
class Artifact:
    """A file a workload names, with what it must be (None: anything, for a plan-less run)."""

    role: str  # TARGET or the drafter's kind
    path: Path
    sha256: str | None
    size: int | None = None
    source: str | None = None  # where it is published (`power.documents.plan.Source.label`), when the plan says

    @property
    def label(self) -> str:
        return TARGET if self.role == TARGET else f"{self.role} drafter"


def verified_sha256(artifact: Artifact) -> str:
    """The artifact's sha256 over every byte; ArtifactError (PWR110, PWR10x, PWR115) when it is not the planned file.

    For a gate that only checks (verify); whatever loads the artifact uses `read_verified`."""
    present(artifact)
    return _checked(artifact, sha256_file(artifact.path, use_cache=False))  # a progress bar on a terminal for large files


def read_verified(artifact: Artifact) -> tuple[bytearray, str]:
    """The artifact's bytes, read once into memory the caller owns, and their sha256, checked against the plan.

    The bytes handed back are the bytes that were hashed, so nothing written to the file afterwards (between
    the check and the load, or while the model runs) reaches the engine."""
    present(artifact)
    data, actual = read_and_hash(artifact.path)
    return data, _checked(artifact, actual)


def present(artifact: Artifact) -> None:
    """The file is there at its planned size (ArtifactError PWR110, PWR115), read no further: what `render` checks,
    leaving the bytes to `power verify`, the gate before an engine starts."""
    path = str(artifact.path)
    if not os.path.exists(path):
        raise ArtifactError(f"the {artifact.label} artifact does not exist", code="PWR110", file=path,
                            hint="restore the planned file there, or fix the path and re-plan")
    if artifact.size is not None and os.path.isfile(path) and (size := os.path.getsize(path)) != artifact.size:
        raise _changed(artifact, f"is {size:,} bytes, the plan expects {artifact.size:,} (so its sha256 cannot match)")


def _checked(artifact: Artifact, actual: str) -> str:
    if artifact.sha256 is not None and actual != artifact.sha256:
        raise _changed(artifact, f"has sha256 {actual[:16]}..., the plan expects {artifact.sha256[:16]}...")
    return actual


def _changed(artifact: Artifact, what: str) -> ArtifactError:
    return ArtifactError(f"the {artifact.label} {what}: it is not the file the plan was compiled with", code="PWR115",
                         file=str(artifact.path), hint="restore the planned file, or re-plan with this one")
