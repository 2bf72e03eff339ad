"""A loopback HTTP server that answers as the Hugging Face Hub does for file downloads (no network): HEAD and
GET /{repo}/resolve/{revision}/{filename} with X-Repo-Commit, the LFS X-Linked-Etag (the file's sha256) and
X-Linked-Size, byte ranges, and the Hub's X-Error-Code on a 404; plus plain files under /files/. Each file can be
served tampered, cut short, or redirected, to show what `power pull` refuses."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


@dataclass
class Hub:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> filename -> bytes (repo "o/n")
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit
    files: dict[str, bytes] = field(default_factory=dict)  # /files/NAME
    served: dict[str, bytes] = field(default_factory=dict)  # name -> the bytes actually sent instead (tampered)
    cut_at: dict[str, int] = field(default_factory=dict)  # name -> bytes sent before the connection closes
    cut_once: set[str] = field(default_factory=set)  # names cut only on their first GET
    redirect: dict[str, str] = field(default_factory=dict)  # name -> Location
    hold_at: dict[str, int] = field(default_factory=dict)  # name -> bytes sent before the body stalls until released
    holding: threading.Event = field(default_factory=threading.Event)  # set once a body has stalled
    released: threading.Event = field(default_factory=threading.Event)  # set to end the stall (then bodies flow)
    requests: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)  # method, path, Range, auth
    body_bytes: int = 0

    def commit(self, commit: str, files: dict[str, bytes], branch: str = "main") -> None:
        self.commits[commit] = files
        self.refs[branch] = commit

    def gets(self) -> list[tuple[str, str, str | None, str | None]]:
        return [r for r in self.requests if r[0] == "GET"]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: Hub

    def log_message(self, format, *args):  # noqa: A002 - the signature BaseHTTPRequestHandler calls
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        hub = self.hub
        hub.requests.append((self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        found = self._resolve(unquote(self.path.split("?")[0]))
        if found is None:
            return
        name, data, headers = found
        if name in hub.redirect:
            self.send_response(302)
            self.send_header("Location", hub.redirect[name])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        sent = hub.served.get(name, data)
        start = int(self.headers["Range"].split("=")[1].split("-")[0]) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(sent) - 1}/{len(sent)}")
        self.send_header("Content-Length", str(len(sent) - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not body:
            return
        chunk = sent[start:]
        if name in hub.hold_at and not hub.released.is_set():
            self._stall(chunk[:max(0, hub.hold_at[name] - start)])
            return
        if name in hub.cut_at and (name not in hub.cut_once or not hasattr(self.server, f"cut-{name}")):
            setattr(self.server, f"cut-{name}", True)
            chunk = chunk[:max(0, hub.cut_at[name] - start)]
            self.close_connection = True
        self.wfile.write(chunk)
        hub.body_bytes += len(chunk)

    def _stall(self, chunk: bytes) -> None:
        """Send `chunk`, then nothing until the hub is released: a transfer hanging mid-body, for a test to kill."""
        self.wfile.write(chunk)
        self.wfile.flush()
        self.hub.body_bytes += len(chunk)
        self.hub.holding.set()
        self.hub.released.wait()
        self.close_connection = True

    def _resolve(self, path: str) -> tuple[str, bytes, dict[str, str]] | None:
        hub = self.hub
        if path.startswith("/files/"):
            name = path.removeprefix("/files/")
            if name not in hub.files:
                return self._missing("EntryNotFound")
            return name, hub.files[name], {}
        parts = path.lstrip("/").split("/", 4)
        if len(parts) != 5 or parts[2] != "resolve" or "/".join(parts[:2]) != "o/n":
            return self._missing("RepoNotFound")
        revision, filename = parts[3], parts[4]
        commit = hub.refs.get(revision, revision)
        if commit not in hub.commits:
            return self._missing("RevisionNotFound")
        if filename not in hub.commits[commit]:
            return self._missing("EntryNotFound")
        data = hub.commits[commit][filename]
        return filename, data, {"X-Repo-Commit": commit, "ETag": f'"{sha256(data)}"',
                                "X-Linked-Etag": f'"{sha256(data)}"', "X-Linked-Size": str(len(data))}

    def _missing(self, code: str) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", code)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None


@contextmanager
def serving(hub: Hub) -> Iterator[Hub]:
    """The hub answering on a free loopback port (its URL in `hub.base`) until the block ends."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hub.base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
