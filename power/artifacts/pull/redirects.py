"""Which redirects a download follows: never to another scheme, never to another host (a Hub endpoint's own
storage hosts excepted, where the endpoint is the public Hub). A redirect is where a download is most easily
turned: https to http drops the transport's integrity, another host is another party's bytes."""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

from power.artifacts.pull.errors import PullError

# The public Hub answers a file's /resolve/ with a redirect to its own storage (its CDN and Xet hosts), all under
# these domains (huggingface_hub's file_download.py follows them the same way).
HUB_DOMAINS = ("huggingface.co", "hf.co")


def refused(origin: str, location: str) -> str | None:
    """Why a redirect from `origin` to `location` is not followed, or None when it may be."""
    source, target = urlsplit(origin), urlsplit(urljoin(origin, location))
    if target.scheme != source.scheme:
        return f"to another scheme ({source.scheme} -> {target.scheme})"
    if target.netloc.lower() == source.netloc.lower():
        return None
    if _on_the_hub(source.hostname) and _on_the_hub(target.hostname):
        return None
    return f"to another host ({source.netloc} -> {target.netloc})"


def check(origin: str, location: str, name: str) -> str:
    """The absolute URL to follow, or PullError PWR138 naming the file and both addresses."""
    why = refused(origin, location)
    if why is not None:
        raise PullError(f"{name}: the download from {origin} redirected {why}, to {urljoin(origin, location)}: "
                        "not followed", code="PWR138",
                        hint="fetch from the address that serves the file itself, or fix the mirror's redirect")
    return urljoin(origin, location)


def _on_the_hub(host: str | None) -> bool:
    host = (host or "").lower()
    return any(host == domain or host.endswith("." + domain) for domain in HUB_DOMAINS)
