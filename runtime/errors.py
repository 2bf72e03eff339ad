"""Input errors the runtime reports to the user (exit code 2), as opposed to bugs.

Each message names the artifact, tensor or limit at fault and what to do about it;
the CLI prints it without a traceback.
"""

from __future__ import annotations


class RuntimeInputError(ValueError):
    """Bad input to the runtime: an artifact, a setting or a request it cannot serve."""


class ArtifactError(RuntimeInputError):
    """A GGUF artifact the runtime cannot load: unreadable, unimplemented architecture, missing/mis-shaped tensor."""


class ContextOverflow(RuntimeInputError):
    """A request that does not fit the context the runtime was planned for."""
