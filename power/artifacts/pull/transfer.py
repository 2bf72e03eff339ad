"""A download with httpx into a partial file (a URL's, or a Hub file's from the address the Hub serves it at):
resumed from what an earlier run left (an HTTP Range request), and within the run while each retry brings more
bytes; redirects followed only under `pull.redirects`; a progress bar on a terminal. The partial file is the
caller's to check and place (`pull.place`); nothing here decides that the bytes are right."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from power.artifacts.pull import redirects
from power.artifacts.pull.errors import PullError

MAX_REDIRECTS = 5
MAX_RESUMES = 5  # retries within a run of a body cut short, each from the bytes received; only while bytes arrive
CONTENT_RANGE = re.compile(r"^bytes (\d+)-\d+/(\d+|\*)$")
TIMEOUT = httpx.Timeout(30.0, read=300.0)


def download(url: str, partial: Path, name: str, headers: dict[str, str] | None = None) -> None:
    """The body at `url` into `partial`, after any bytes already there; PullError (PWR134, PWR138) otherwise.
    `headers` (a token) go to `url`'s own host only, never along a redirect to another host."""
    partial.parent.mkdir(parents=True, exist_ok=True)
    with httpx.Client(follow_redirects=False, timeout=TIMEOUT) as client:
        for resumes in range(MAX_RESUMES + 1):
            had = _size(partial)
            try:
                _fetch(client, url, partial, name, headers or {})
                return
            except (httpx.TransportError, CutShort) as err:
                if resumes == MAX_RESUMES or _size(partial) == had:
                    raise _failed(name, url, err) from None
            except httpx.HTTPError as err:
                raise _failed(name, url, err) from None


class CutShort(Exception):
    """A body that ended before its Content-Length."""


def _failed(name: str, url: str, err: Exception) -> PullError:
    return PullError(f"{name}: the download from {url} failed: {err}", hint="check the address and the network; "
                     "run `power pull` again to resume from the bytes already received")


def _size(partial: Path) -> int:
    return partial.stat().st_size if partial.exists() else 0


def _fetch(client: httpx.Client, url: str, partial: Path, name: str, headers: dict[str, str]) -> None:
    have = _size(partial)
    origin = urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        sent = {**(headers if urlsplit(url).netloc == origin else {}), "Accept-Encoding": "identity",
                **({"Range": f"bytes={have}-"} if have else {})}
        with client.stream("GET", url, headers=sent) as response:
            if response.has_redirect_location:
                url = redirects.check(url, response.headers["Location"], name)
                continue
            if response.status_code == 416 and have:  # the partial file is already whole (or longer than the file)
                return
            if response.status_code not in (200, 206):
                raise PullError(f"{name}: {url} answered HTTP {response.status_code} {response.reason_phrase}",
                                hint="check the URL names the published file")
            resumed = response.status_code == 206 and _starts_at(response) == have
            _write(response, partial, have if resumed else 0, name)
            return
    raise PullError(f"{name}: more than {MAX_REDIRECTS} redirects from {url}", hint="fetch from the file's own address")


def _starts_at(response: httpx.Response) -> int | None:
    match = CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _write(response: httpx.Response, partial: Path, offset: int, name: str) -> None:
    length = response.headers.get("Content-Length")
    expected = int(length) if length and length.isdigit() else None
    received = 0
    from tqdm import tqdm  # here, not at import: `power pull --help` never loads it

    with partial.open("r+b" if offset else "wb") as out, tqdm(
            total=None if expected is None else offset + expected, initial=offset, unit="B", unit_scale=True,
            desc=name, disable=None, leave=False) as bar:
        out.seek(offset)
        out.truncate()
        for chunk in response.iter_raw():  # as it arrives: a body cut short keeps every byte received
            out.write(chunk)
            out.flush()  # to the OS at once: a process killed mid-transfer leaves every byte received to resume from
            received += len(chunk)
            bar.update(len(chunk))
    if expected is not None and received != expected:
        raise CutShort(f"the body ended after {offset + received:,} bytes of {offset + expected:,}")
