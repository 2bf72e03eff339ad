"""A file of a Hugging Face repository, resolved through huggingface_hub: its endpoint (HF_ENDPOINT), its token
(HF_TOKEN or the saved login), its cache (HF_HUB_CACHE, read when it already holds the file). What Power adds:
the revision resolved to a commit, the Hub's own sha256 of an LFS file (its X-Linked-Etag) and size, the address
its bytes are served from, and a client whose every redirect passes `pull.redirects` before it is followed.

The bytes themselves are fetched by `pull.transfer`, like a URL's, into a partial file that the next run resumes:
huggingface_hub writes each download to a file of its own process and deletes it when the process ends, so a
transfer cut short would start again from zero."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub
from huggingface_hub import constants, errors
from huggingface_hub.utils import _http

from power.artifacts import provenance
from power.artifacts.pull import redirects
from power.artifacts.pull.errors import PullError

SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class HubFile:
    repo: str
    filename: str
    commit: str
    size: int | None
    lfs_sha256: str | None  # the Hub's sha256 of an LFS file; None for a file kept in git itself
    location: str  # where its bytes are served: the endpoint itself, or the storage it redirects to

    @property
    def label(self) -> str:
        return f"hf://{self.repo}@{self.commit}/{self.filename}"


def endpoint() -> str:
    """The Hub endpoint huggingface_hub uses (HF_ENDPOINT), refused (PWR133) unless https or loopback http."""
    if not provenance.is_secure(constants.ENDPOINT):
        raise PullError(f"the Hub endpoint {constants.ENDPOINT} is not https", code="PWR133",
                        hint="set HF_ENDPOINT to an https:// address (plain http only to a loopback address)")
    return constants.ENDPOINT


def resolve(repo: str, revision: str, filename: str) -> HubFile:
    """The file at `revision` (a commit, branch or tag): the commit it is at, its size and LFS sha256."""
    endpoint()
    _police_redirects()
    url = huggingface_hub.hf_hub_url(repo, filename, revision=revision)
    try:
        meta = huggingface_hub.get_hf_file_metadata(url)
    except (errors.HfHubHTTPError, OSError, _http.httpx2.HTTPError) as err:
        raise _unreachable(repo, revision, filename, err) from None
    if not provenance.is_commit(meta.commit_hash):
        raise PullError(f"{repo}: the Hub named no commit for revision {revision!r}", hint="check the endpoint "
                        "serves the Hugging Face Hub API (HF_ENDPOINT)")
    commit = str(meta.commit_hash)
    etag = meta.etag or ""
    redirected = meta.location != url  # to the storage serving this very blob; else the file at its commit
    location = redirects.check(url, meta.location, filename) if redirected else \
        huggingface_hub.hf_hub_url(repo, filename, revision=commit)
    return HubFile(repo, filename, commit, meta.size, etag if SHA256.match(etag) else None, location)


def cached(file: HubFile) -> Path | None:
    """The file at its commit in huggingface_hub's cache, when the cache already holds it."""
    found = huggingface_hub.try_to_load_from_cache(file.repo, file.filename, revision=file.commit)
    return Path(found) if isinstance(found, str) else None


def headers(file: HubFile) -> dict[str, str]:
    """The headers huggingface_hub sends (its user agent, the token), for the endpoint's own host only: storage
    the Hub redirects to is served by a signed address, and is never sent the token."""
    if urlsplit(file.location).netloc.lower() != urlsplit(endpoint()).netloc.lower():
        return {}
    return huggingface_hub.utils.build_hf_headers()


def _unreachable(repo: str, revision: str, filename: str, err: Exception) -> PullError:
    what = {errors.RepositoryNotFoundError: "no such repository (or it needs a token: HF_TOKEN)",
            errors.RevisionNotFoundError: f"no revision {revision!r}",
            errors.RemoteEntryNotFoundError: f"no file {filename!r} at revision {revision!r}"}
    reason = next((text for kind, text in what.items() if isinstance(err, kind)), str(err).splitlines()[0])
    return PullError(f"{filename}: cannot fetch from {repo} on {constants.ENDPOINT}: {reason}",
                     hint="check source.repo, source.revision and source.filename (run `power pull --pin` after "
                          "moving a revision); run `power pull` again to resume")


def _police_redirects() -> None:
    """huggingface_hub's shared client, with a hook that refuses a redirect `pull.redirects` does not allow."""
    if getattr(_http.get_session(), "_power_policed", False):
        return

    def factory():
        client = _http.default_client_factory()
        hooks = client.event_hooks
        hooks["response"] = [*hooks.get("response", []), _check_redirect]
        client.event_hooks = hooks
        client._power_policed = True
        return client

    huggingface_hub.set_client_factory(factory)


def _check_redirect(response) -> None:
    if response.has_redirect_location:
        redirects.check(str(response.request.url), response.headers["Location"], response.request.url.path)
