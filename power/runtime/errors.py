"""Input errors the runtime reports to the user (exit code 2), as opposed to bugs.

Each carries a finding from the check catalogue (`power.codes`) that names the
artifact, tensor or limit at fault and what to do about it; the CLI prints it
through the same renderer as every check, without a traceback. Artifacts the
runtime cannot load raise `power.artifacts.gguf_reader.ArtifactError` (PWR1xx).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from power.findings import PowerError

if TYPE_CHECKING:  # not at run time: importing power.kernels loads torch, and the template sandbox's child
    from power.kernels.cpu.cache import KernelError  # imports this module and starts against a budget


class RuntimeInputError(PowerError):
    """Bad input to the runtime: a setting or a request it cannot serve."""

    code = "PWR600"


class ContextOverflow(RuntimeInputError):
    """A request that does not fit the context the runtime was planned for."""

    code = "PWR602"


def kernel_refusal(error: KernelError) -> RuntimeInputError:
    """A kernel cache, build or instruction-path failure (power.kernels.cpu) as the finding it carries."""
    return RuntimeInputError(error.message, code=error.code, file=error.file, hint=error.hint)
