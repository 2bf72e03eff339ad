"""What a manifest's `source` tables mean: a Hub repository pinned to a commit, or an HTTPS URL.

The rules (PWR130-PWR133, `power.orchestrator.inputs.rules`) and `power pull` read a source
through these helpers, so both agree on what "pinned" and "secure" are.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

COMMIT = re.compile(r"^[0-9a-f]{40}$")

# Plain http is accepted only to this machine (a mirror or a test server on loopback); anything else is https.
LOOPBACK_NAMES = frozenset({"localhost"})


def is_commit(revision: object) -> bool:
    """Whether `revision` is an immutable commit id, not a branch or tag that can move."""
    return isinstance(revision, str) and COMMIT.match(revision) is not None


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_secure(url: str) -> bool:
    """https, or plain http to a loopback address (where no one stands between the client and the server)."""
    parts = urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.hostname))
