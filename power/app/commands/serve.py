"""`power serve PLAN [--host 127.0.0.1 --port N]`: the Power runtime behind OpenAI-style HTTP, /health and /metrics."""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

import click

from power.app.arguments.runtime_options import greedy_head_option, refuse_unusable_device, runtime_options
from power.app.cli import EXIT_USAGE, refuse
from power.app.commands.artifact_root import root_option
from power.app.commands.params import FiniteFloatRange
from power.findings import PowerError

API_KEY_FILE_ENV = "POWER_API_KEY_FILE"
MAX_API_KEY_BYTES = 4096


@click.command("serve")
@click.argument("plan", type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to bind (0: any free port).")
@click.option("--queue-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Requests that may wait for a slot (the plan's runtime.slots decode at once); more are refused "
                   "with 429 and Retry-After.")
@click.option("--timeout", "timeout_s", type=FiniteFloatRange(min=0.1), default=300.0, show_default=True,
              help="Seconds a request may take from arrival to its last token (queue wait included) "
                   "before it is cancelled.")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=None,
              help="Larger request bodies are refused with 413 (default: 4 MiB).")
@click.option("--chat-template-file", type=click.Path(path_type=Path), default=None,
              help="A Jinja chat template for /v1/chat/completions instead of the GGUF's tokenizer.chat_template.")
@click.option("--api-key-file", type=click.Path(path_type=Path), default=None, envvar=API_KEY_FILE_ENV,
              help=f"A file holding the API key every request but /health must send as 'Authorization: Bearer KEY' "
                   f"(401 otherwise); also ${API_KEY_FILE_ENV}. Without it the server answers anyone who reaches it.")
@click.option("--public-metrics", is_flag=True, help="With --api-key-file: leave /metrics open to "
                                                     "scrapers without the key.")
@runtime_options
@greedy_head_option
@root_option
def serve(plan: Path, host: str, port: int, queue_size: int, timeout_s: float, max_body_bytes: int | None,
          chat_template_file: Path | None, api_key_file: Path | None, public_metrics: bool, device: str,
          threads: int | None, greedy_head: bool, root: Path | None) -> None:
    """Serve a resolved PLAN: POST /v1/completions and /v1/chat/completions (streaming SSE or not),
    GET /v1/models, GET /health, GET /metrics. The plan's runtime.slots requests decode side by side.

    /health answers 503 until the plan's model is loaded (every artifact hashed in full first),
    then 200. Exit codes: 0 stopped cleanly, 2 usage or input error (a file that is not a
    valid plan, an address it cannot listen on, a chat template file that does not compile,
    an artifact that is not the planned file, a model that does not load).
    """
    from power.documents.plan import load_plan

    try:
        api_key_file = api_key_path(api_key_file)
    except PowerError as err:
        refuse(err)
    try:
        resolved = load_plan(plan)
        # Usage errors first: before the runtime's stack (torch) is imported or any artifact is read.
        template = _template_file(chat_template_file)
        api_key = read_api_key(api_key_file) if api_key_file else None
    except PowerError as err:
        refuse(err, at=plan)
    refuse_unusable_device(device)
    try:  # after every refusal that needs nothing loaded, before the runtime's stack is imported
        listening = listen(host, port)
    except PowerError as err:
        refuse(err, at=plan)

    from power.runtime.workload import Workload
    from power.serving.access import Access

    try:
        workload = Workload.of_plan(resolved, plan, root)
        access = Access(api_key, public_metrics)
    except PowerError as err:
        listening.close()  # a refusal leaves the port free
        refuse(err, at=plan)

    import uvicorn

    from power.runtime.engine import Engine, EngineOptions
    from power.serving.limits import ServerLimits, http_protocol
    from power.serving.server import create_app

    options = EngineOptions(device=device, threads=threads, greedy_head=greedy_head)
    server: uvicorn.Server | None = None
    failed: list[str] = []

    def stop_on_load_failure(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    limits = ServerLimits(queue_size=queue_size, request_timeout_s=timeout_s,
                          **({"max_body_bytes": max_body_bytes} if max_body_bytes else {}))
    app = create_app(lambda: Engine(workload, options), resolved.name, resolved.digest, limits, stop_on_load_failure,
                     template, access)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5,
                                           http=http_protocol(limits)))
    bound = listening.getsockname()[1]
    click.echo(f"serving plan {resolved.name} on http://{f'[{host}]' if ':' in host else host}:{bound} "
               "(Ctrl+C to stop)", err=True)
    server.run(sockets=[listening])
    if failed or not server.started:
        sys.exit(EXIT_USAGE)


def _template_file(path: Path | None):
    """The operator's chat template, read (bounded) and compiled in its sandbox before anything binds; the server
    fills in its BOS/EOS text from the model once it loads."""
    if path is None:
        return None
    from power.runtime.chat import ChatTemplate
    from power.runtime.template_sandbox import TemplateSandbox

    return ChatTemplate.load(ChatTemplate.read_file(path), str(path), "", "", TemplateSandbox())




class ApiKeyError(PowerError):
    """An API key file that cannot be used."""

    code = "PWR606"


def api_key_path(option: Path | None) -> Path | None:
    """The key file to read: `--api-key-file`, else $POWER_API_KEY_FILE. Click treats a variable set to nothing as
    unset; here that is a refusal, since serving without a key is not what whoever set it asked for."""
    if option is None and os.environ.get(API_KEY_FILE_ENV) == "":
        raise ApiKeyError(f"${API_KEY_FILE_ENV} is set but empty: it names no key file, and the server would answer "
                          "anyone", where=f"${API_KEY_FILE_ENV}",
                          hint=f"set ${API_KEY_FILE_ENV} to the key file's path, or unset it to serve without a key")
    return option


def read_api_key(path: Path) -> str:
    """The key in `path` (a regular UTF-8 file, at most 4 KiB, surrounding whitespace ignored): printable ASCII,
    never empty. A file other users can read is served with a warning."""
    from power.artifacts.bounded_reader import DocumentError, read_text

    try:
        key = read_text(path, MAX_API_KEY_BYTES).strip()
    except DocumentError as err:
        raise ApiKeyError(f"the API key file {_why(err.message)}", file=str(path),
                          hint="give a file holding the key on one line (e.g. a mounted Secret)") from None
    # HTTP header values are ASCII: a client could never send a key with other characters.
    if not key or any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ApiKeyError("the API key file holds no key, or a key with spaces, control or non-ASCII characters",
                          file=str(path), hint="write one key of printable ASCII characters, e.g. "
                                               "`openssl rand -hex 32 > FILE`")
    mode = os.stat(path).st_mode
    if mode & stat.S_IROTH:
        click.echo(f"warning: {path} (the API key) is readable by every user of this machine (mode "
                   f"{stat.S_IMODE(mode):04o}): chmod o-r {path}", err=True)
    return key


def _why(message: str) -> str:
    """A reader's message as the rest of a sentence about the key file."""
    if message.startswith(("is ", "grew ")):
        return message
    return f"cannot be used: {message.removeprefix('cannot read: ')}"


# uvicorn's own default backlog.
LISTEN_BACKLOG = 2048


class ListenError(PowerError):
    """The address cannot be listened on: the port is taken, the host unknown, or binding not permitted."""

    code = "PWR604"


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, before anything loads: a taken port or a bad host is one finding (exit 2),
    never a server that starts, loads the model and then dies. Bound the way uvicorn binds (SO_REUSEADDR)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError, ValueError) as err:
        raise ListenError(f"cannot listen on {host!r}: {getattr(err, 'strerror', None) or err}",
                          hint="give --host an address or a name this machine resolves, e.g. 127.0.0.1") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as err:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {err.strerror or err}",
                          hint="choose another --port (0 takes any free one), or stop what holds this one") from None
    return sock

