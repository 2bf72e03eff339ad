"""A deliberately wrong engine for tests: the real llama-server behind a proxy that swaps one generated token.

Run as `python swapping_proxy.py REAL_BINARY LLAMA_SERVER_ARGS...`: it starts the real server on another loopback
port and serves the given `--port`, forwarding every request; in each multi-token `/completion` answer of a server
launched with speculation (`--spec-type`), the token at SWAP_AT becomes SWAPPED, a token the target gives no
weight there. Single-token completions (the divergence replay) pass through untouched, so the replay reads the
real target's probabilities. SIGTERM stops the real server too.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SWAP_AT = 2
SWAPPED = 200_000  # a rare piece of Gemma's 262k vocabulary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    real, *args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    inner = _free_port()
    words = [real, *args]
    words[words.index("--port") + 1] = str(inner)
    server = subprocess.Popen(words)
    swapping = "--spec-type" in args

    class Forward(BaseHTTPRequestHandler):
        def _forward(self, body: bytes | None) -> None:
            request = urllib.request.Request(f"http://127.0.0.1:{inner}{self.path}", data=body,
                                             headers={"Content-Type": "application/json"} if body else {})
            try:
                with urllib.request.urlopen(request, timeout=600) as response:
                    status, payload = response.status, response.read()
            except urllib.error.HTTPError as err:
                status, payload = err.code, err.read()
            except OSError:
                status, payload = 503, b'{"error": "loading"}'
            if swapping and body and self.path == "/completion" and status == 200:
                payload = _swapped(json.loads(body), payload)
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._forward(None)

        def do_POST(self) -> None:  # noqa: N802
            self._forward(self.rfile.read(int(self.headers["Content-Length"])))

        def log_message(self, *_: object) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", port), Forward)

    def stop(*_: object) -> None:
        server.terminate()
        server.wait()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    proxy.serve_forever()


def _swapped(request: dict, payload: bytes) -> bytes:
    answer = json.loads(payload)
    tokens = answer.get("tokens") or []
    if request.get("n_predict", 0) > 1 and len(tokens) > SWAP_AT:
        tokens[SWAP_AT] = SWAPPED
    return json.dumps(answer).encode()


if __name__ == "__main__":
    main()
