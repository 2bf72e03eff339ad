"""`power serve`: the HTTP server on loopback over a real engine (the factory's dense target, planned with n-gram)."""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from runtime_plans import fixture_plan, write_plan

from power.app.bench.traffic import build_shape
from power.app.cli import main
from power.documents.plan import load_plan
from power.documents.receipt import Receipt
from power.runtime.engine import Engine, EngineOptions
from power.runtime.stops import StopText
from power.runtime.transaction import Step
from power.runtime.workload import Workload
from power.serving.limits import ServerLimits
from power.serving.server import create_app

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: interpreter-heavy or runs the real model for long

PROMPT = "Hello world! The quick brown fox jumps over the lazy dog. Hello world! The quick"
HELD = PROMPT + " Hold on."  # the prompt the injected engine holds (see InjectedEngine)
SLOW = PROMPT + " Slowly."  # the prompt the injected engine decodes slowly
SLOW_ROUND_S = 0.1  # at most K + 1 = 4 tokens a round: LONG tokens take 10 s or more
LONG = 400
BOUND_S = 60.0  # every wait in these tests gives up after this long
# Tiny fixture forwards are dominated by thread hand-offs; one thread is several times faster on a shared CPU.
ONE_THREAD = EngineOptions(threads=1)


class InjectedEngine(Engine):
    """Fault injection around the real engine, by prompt: "boom" fails inside its transaction; HELD holds the engine
    thread after its first text until `release` is set (so a test acts while it runs), and its receipts, which no
    client reads once it has gone, are kept in `held_receipts`; SLOW sleeps SLOW_ROUND_S in each round, so its
    tokens keep flowing for seconds."""

    release = threading.Event()
    held_receipts: list[Receipt] = []

    def submit(self, prompt_ids, max_tokens, on_text=None, cancel=None, sampling=None, stop=(), on_done=None,
               observer=None):
        prompt = self.tokenizer.decode(prompt_ids)
        if prompt == "boom":
            observer = _fail_at_verify
        elif prompt == SLOW:
            observer = _sleep_at_verify
        elif prompt == HELD:
            streamed, finished = on_text, on_done

            def on_text(piece: str) -> None:
                streamed(piece)
                self.release.wait(BOUND_S)

            def on_done(ticket) -> None:
                if ticket.receipt is not None:
                    self.held_receipts.append(ticket.receipt)
                finished(ticket)

        return super().submit(prompt_ids, max_tokens, on_text, cancel, sampling, stop, on_done, observer)


def _fail_at_verify(step: Step) -> None:
    if step is Step.VERIFY:
        raise RuntimeError("injected fault")


def _sleep_at_verify(step: Step) -> None:
    if step is Step.VERIFY:
        time.sleep(SLOW_ROUND_S)


@lru_cache(maxsize=1)
def engine() -> Engine:
    plan_path = fixture_plan("ngram")
    return InjectedEngine(Workload.of_plan(load_plan(plan_path), plan_path), ONE_THREAD)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """The HELD request's gate: closed during the test, always opened afterwards."""
    InjectedEngine.release.clear()
    InjectedEngine.held_receipts.clear()
    yield InjectedEngine.release
    InjectedEngine.release.set()


def app_for(limits: ServerLimits | None = None, load=None):
    plan = load_plan(fixture_plan("ngram"))
    return create_app(load or engine, plan.name, plan.digest, limits or ServerLimits())


@contextmanager
def serving(app, ready: bool = True) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started, "the server to start")
    base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        if ready:
            until(lambda: httpx.get(f"{base}/health").status_code == 200, "/health to answer 200")
        yield base
    finally:
        server.should_exit = True
        thread.join(BOUND_S)


def until(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def metric(base: str, name: str, **labels: str) -> float:
    """One sample's value from /metrics (0 when the labelled series does not exist yet)."""
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def stream_events(response: httpx.Response) -> Iterator[dict | str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            yield payload if payload == "[DONE]" else json.loads(payload)


def complete(base: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT} | body, timeout=BOUND_S)


def test_completion_carries_text_usage_timings_and_receipt() -> None:
    with serving(app_for()) as base:
        health = httpx.get(f"{base}/health").json()
        assert health["status"] == "ok" and health["plan_digest"] == load_plan(fixture_plan("ngram")).digest
        response = complete(base, max_tokens=12)
        assert response.status_code == 200, response.text
        body = response.json()
        receipt = body["receipt"]
        assert receipt["schema"] == "power.receipt/v1" and len(receipt["token_ids"]) == 12
        assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["text"] == receipt["text"]
        assert body["usage"]["completion_tokens"] == 12 and body["usage"]["prompt_tokens"] == receipt["prompt_tokens"]
        timings = body["timings"]
        assert timings["tokens_sha256"] == receipt["tokens_sha256"]
        assert (timings["draft_n"], timings["draft_n_accepted"]) == (receipt["proposed"], receipt["accepted"])
        # Greedy and deterministic: the same request gives the same tokens.
        again = complete(base, max_tokens=12).json()["receipt"]
        assert again["tokens_sha256"] == receipt["tokens_sha256"]
        echo = complete(base, prompt=build_shape("echo", 24).prompt, max_tokens=12).json()["receipt"]
        served = (receipt, again, echo)
        for counter, field in (
            ("power_spec_draft_tokens_total", "proposed"),
            ("power_spec_accepted_tokens_total", "accepted"),
            ("power_spec_drafts_total", "speculative_rounds"),
            ("power_spec_replays_total", "replays"),
            ("power_spec_fallbacks_total", "fallbacks"),
            ("power_governor_parks_total", "governor_parks"),
        ):
            assert metric(base, counter) == sum(r[field] for r in served), counter
        for position in range(1, max(len(r["position_reached"]) for r in served) + 1):  # 1-based: the first draft is 1
            for counter, field in (("power_spec_position_reached_total", "position_reached"),
                                   ("power_spec_position_accepted_total", "position_accepted")):
                assert metric(base, counter, position=str(position)) == sum(
                    r[field][position - 1] for r in served if len(r[field]) >= position), (counter, position)
        assert (
            metric(base, "power_spec_position_reached_total", position="1")
            == metric(base, "power_spec_drafts_total")
            > 0
        )
        assert metric(base, "power_generated_tokens_total") == 36
        assert metric(base, "power_requests_total", status="ok") == 3


def test_streaming_sends_the_same_text_as_a_plain_response_then_the_receipt() -> None:
    with serving(app_for()) as base:
        plain = complete(base, max_tokens=10).json()
        with httpx.stream("POST", f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 10, "stream": True},
                          timeout=BOUND_S) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = list(stream_events(response))
        assert events[-1] == "[DONE]"
        last = events[-2]
        assert last["choices"][0]["finish_reason"] == "length"
        streamed = "".join(e["choices"][0]["text"] for e in events[:-2])
        assert streamed == plain["choices"][0]["text"]
        assert last["receipt"]["tokens_sha256"] == plain["receipt"]["tokens_sha256"]


def test_temperature_and_seed_are_per_request(served_base: str) -> None:
    greedy = complete(served_base, max_tokens=12).json()["receipt"]["tokens_sha256"]
    seeded = [complete(served_base, max_tokens=12, temperature=1.5, seed=seed).json()["receipt"]["tokens_sha256"]
              for seed in (7, 7, 8)]
    assert seeded[0] == seeded[1]  # the counter-based stream: same seed, same tokens
    assert len({greedy, seeded[0], seeded[2]}) == 3


def test_a_stop_string_ends_the_request_as_stop_in_the_response_and_in_the_receipt() -> None:
    with serving(app_for()) as base:
        full = complete(base, max_tokens=16).json()
        text = full["choices"][0]["text"]
        stop = text[5:8]
        cut = complete(base, max_tokens=16, stop=[stop]).json()
        receipt = cut["receipt"]
        assert cut["choices"][0]["text"] == text[: text.index(stop)] == receipt["text"]
        assert cut["choices"][0]["finish_reason"] == "stop" and receipt["stop_reason"] == "stop"
        ids = receipt["token_ids"]
        assert ids == full["receipt"]["token_ids"][: len(ids)]
        decode = engine().tokenizer.decode
        assert stop in decode(ids) and stop not in decode(ids[:-1])  # the last token completed the stop string
        assert (
            cut["usage"]["completion_tokens"] == len(ids)
            and cut["timings"]["tokens_sha256"] == receipt["tokens_sha256"]
        )
        with httpx.stream("POST", f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 16, "stop": stop,
                                                                   "stream": True}, timeout=BOUND_S) as response:
            events = list(stream_events(response))
        last = events[-2]
        assert "".join(e["choices"][0]["text"] for e in events[:-2]) == receipt["text"]
        assert last["choices"][0]["finish_reason"] == "stop" and last["receipt"]["stop_reason"] == "stop"
        assert last["receipt"]["tokens_sha256"] == receipt["tokens_sha256"]


def overshooting_stop(speculative: Engine, prompt: str, max_tokens: int) -> str:
    """A stop string completed inside a round that emitted tokens past it (first found at a round's start)."""
    rounds: list[str] = []
    text = speculative.generate(prompt, max_tokens, rounds.append).text
    starts = [len("".join(rounds[:i])) for i in range(2, len(rounds))]
    for stop in (text[at - 2: at + 1] for at in starts if text.find(text[at - 2: at + 1]) == at - 2):
        receipt = speculative.generate(prompt, max_tokens, stop=[stop])
        if 1 + receipt.rounds + receipt.accepted > len(receipt.token_ids):  # tokens emitted, tokens kept
            return stop
    raise AssertionError(f"no n-gram round ran past a stop string in {text!r}: the case under test did not happen")


def test_a_stop_string_ends_a_speculative_and_a_plain_run_on_the_same_tokens() -> None:
    prompt, max_tokens = build_shape("echo", 24).prompt, 64
    # No governor: the search below runs many requests, and a parked speculator would never run past a stop.
    ngram, plain = (Engine(Workload.of_plan(load_plan(fixture_plan(p)), fixture_plan(p)),
                           EngineOptions(governor=False, threads=1))
                    for p in ("ngram-float32", "none-float32"))
    stop = overshooting_stop(ngram, prompt, max_tokens)
    speculative, control = (e.generate(prompt, max_tokens, stop=[stop]) for e in (ngram, plain))
    assert speculative.stop_reason == control.stop_reason == "stop"
    assert speculative.text == control.text and stop not in speculative.text
    assert speculative.tokens_sha256 == control.tokens_sha256  # what a rollout's losslessness gate compares


def test_stop_text_never_emits_part_of_a_stop_string_and_counts_the_tokens_through_it() -> None:
    tokenizer = engine().tokenizer
    text = "abc EN x yEND tail END"
    ids = tokenizer.encode(text, add_bos=False)
    stops = StopText(tokenizer.stream(), ("END", "never"))
    pieces = [stops.feed([token]) for token in ids]
    assert "".join(pieces) + stops.flush() == "abc EN x y" and stops.hit
    assert "END" in tokenizer.decode(ids[: stops.tokens]) and "END" not in tokenizer.decode(ids[: stops.tokens - 1])
    assert stops.feed(ids) == "" and stops.tokens < len(ids)  # nothing is taken after the stop
    plain = StopText(tokenizer.stream())
    assert plain.feed(ids) + plain.flush() == text and plain.tokens == len(ids) and not plain.hit


@pytest.mark.parametrize("body, field", [
    (b"{not json", "JSON"),
    (b"[1, 2]", "object"),
    (b'{"max_tokens": 4}', "prompt"),
    (b'{"prompt": "x", "max_tokens": 0}', "max_tokens"),
    (b'{"prompt": "x", "max_tokens": 100000}', "max_tokens"),
    (b'{"prompt": "x", "temperature": "hot"}', "temperature"),
    (b'{"prompt": "x", "seed": -1}', "seed"),
    (b'{"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', "stop"),
    (b'{"prompt": "x", "stream": "yes"}', "stream"),
])
def test_bad_requests_are_400_naming_the_field(body: bytes, field: str, served_base: str) -> None:
    response = httpx.post(f"{served_base}/v1/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert field in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def served_base() -> Iterator[str]:
    with serving(app_for()) as base:
        yield base


def test_health_is_503_until_the_model_is_loaded() -> None:
    gate = threading.Event()

    def slow_load() -> Engine:
        assert gate.wait(BOUND_S)
        return engine()

    with serving(app_for(load=slow_load), ready=False) as base:
        assert httpx.get(f"{base}/health").status_code == 503
        assert httpx.get(f"{base}/health").json()["status"] == "loading"
        assert complete(base).status_code == 503
        assert metric(base, "power_ready") == 0
        gate.set()
        until(lambda: httpx.get(f"{base}/health").status_code == 200, "/health to answer 200")
        assert metric(base, "power_ready") == 1


def test_concurrent_requests_finish_while_a_cancelled_stream_rolls_back(release: threading.Event) -> None:
    with serving(app_for()) as base:
        tokens_before = metric(base, "power_generated_tokens_total")
        results: list[httpx.Response] = []
        with httpx.stream("POST", f"{base}/v1/completions", json={"prompt": HELD, "max_tokens": LONG, "stream": True},
                          timeout=BOUND_S) as cancelled:
            next(stream_events(cancelled))  # it is generating (and held)
            others = [threading.Thread(target=lambda: results.append(complete(base, max_tokens=6))) for _ in range(3)]
            for thread in others:
                thread.start()
            until(lambda: metric(base, "power_queue_depth") == 3, "the three requests to queue")
        # The stream is closed mid-generation: the server cancels it, its open round rolls back, the others run.
        until(lambda: metric(base, "power_requests_total", status="cancelled") == 1, "the cancellation to be counted")
        release.set()
        for thread in others:
            thread.join(BOUND_S)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert len({r.json()["receipt"]["tokens_sha256"] for r in results}) == 1
        assert metric(base, "power_requests_total", status="ok") == 3
        receipts = [r.json()["receipt"] for r in results]
        # The finished requests' drafts, plus whatever the cancelled one drafted before it stopped.
        assert metric(base, "power_spec_draft_tokens_total") >= sum(r["proposed"] for r in receipts)
        assert metric(base, "power_spec_accepted_tokens_total") >= sum(r["accepted"] for r in receipts)
        assert metric(base, "power_spec_drafts_total") >= sum(r["speculative_rounds"] for r in receipts)
        generated = metric(base, "power_generated_tokens_total") - tokens_before
        assert 3 * 6 + 1 <= generated < 3 * 6 + LONG  # the cancelled stream stopped long before its budget
        assert [r.stop_reason for r in InjectedEngine.held_receipts] == ["cancelled"]
        assert metric(base, "power_time_to_first_token_seconds_count") == 4
        assert metric(base, "power_decode_tokens_per_second_count") >= 3
        # After the cancellation the engine answers exactly as before it.
        assert (
            complete(base, max_tokens=6).json()["receipt"]["tokens_sha256"]
            == results[0].json()["receipt"]["tokens_sha256"]
        )


def test_a_full_queue_answers_429_with_retry_after(release: threading.Event) -> None:
    with serving(app_for(ServerLimits(queue_size=1))) as base:
        waiting: list[httpx.Response] = []
        with httpx.stream("POST", f"{base}/v1/completions", json={"prompt": HELD, "max_tokens": 8, "stream": True},
                          timeout=BOUND_S) as running:
            events = stream_events(running)
            next(events)
            queued = threading.Thread(target=lambda: waiting.append(complete(base, max_tokens=4)))
            queued.start()
            until(lambda: metric(base, "power_queue_depth") == 1, "the second request to queue")
            refused = complete(base, max_tokens=4)
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 1 and "queue is full" in refused.json()["error"]["message"]
            release.set()
            assert list(events)[-1] == "[DONE]"
        queued.join(BOUND_S)
        assert waiting[0].status_code == 200
        assert metric(base, "power_requests_total", status="rejected") == 1
        assert metric(base, "power_requests_total", status="ok") == 2


def test_a_request_past_its_timeout_is_cancelled_and_the_server_carries_on(release: threading.Event) -> None:
    with serving(app_for(ServerLimits(request_timeout_s=0.5))) as base:
        slow = complete(base, prompt=HELD, max_tokens=LONG)
        assert slow.status_code == 504 and "0.5 s" in slow.json()["error"]["message"]
        assert metric(base, "power_requests_total", status="timeout") == 1
        release.set()
        until(lambda: metric(base, "power_queue_depth") == 0 and complete(base, max_tokens=2).status_code == 200,
              "the engine to serve again")
        assert metric(base, "power_generated_tokens_total") < LONG  # the timed-out request was cancelled
        assert [r.stop_reason for r in InjectedEngine.held_receipts] == ["cancelled"]


def test_a_failing_request_does_not_take_the_server_down() -> None:
    with serving(app_for()) as base:
        broken = httpx.post(f"{base}/v1/completions", json={"prompt": "boom"}, timeout=BOUND_S)
        assert broken.status_code == 500 and "carries on" in broken.json()["error"]["message"]
        too_long = complete(base, prompt="word " * 600, max_tokens=4)
        assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]
        assert complete(base, max_tokens=3).status_code == 200
        assert metric(base, "power_requests_total", status="error") == 1


def test_serve_refuses_a_file_that_is_not_a_plan(tmp_path: Path) -> None:
    not_a_plan = tmp_path / "profile.toml"
    not_a_plan.write_text('schema = "power.profile/v1"\nname = "x"\n')
    result = CliRunner().invoke(main, ["serve", str(not_a_plan), "--port", "0"])
    assert result.exit_code == 2 and "not a Power plan" in result.output and "power plan" in result.output
    missing = CliRunner().invoke(main, ["serve", str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "nope.json" in missing.output


@pytest.mark.parametrize("case", ["port taken", "unknown host", "unusable host"])
def test_serve_exits_2_with_one_finding_when_it_cannot_listen(tmp_path: Path, case: str) -> None:
    plan_path = write_plan(tmp_path, "ngram")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = {"port taken": ["--port", str(taken.getsockname()[1])],
                   "unknown host": ["--host", "no-such-host.invalid", "--port", "0"],
                   "unusable host": ["--host", "a" * 300, "--port", "0"]}[case]
        result = CliRunner().invoke(main, ["serve", str(plan_path), *address])
    assert result.exit_code == 2 and "PWR604" in result.output and "cannot listen on" in result.output, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_serve_stops_with_exit_2_when_the_planned_model_does_not_load(tmp_path: Path) -> None:
    plan_path = write_plan(tmp_path, "ngram")
    target = tmp_path / "dense-target.gguf"
    target.write_bytes(target.read_bytes()[:-1] + b"\x00")  # the artifact changed after planning
    result = CliRunner().invoke(main, ["serve", str(plan_path), "--port", "0"])
    assert result.exit_code == 2 and "the model did not load" in result.output and "re-plan" in result.output


# --- requests side by side (a plan with four slots) --------------------------------------------------------------


@lru_cache(maxsize=1)
def slots_engine() -> Engine:
    plan_path = fixture_plan("slots")
    return InjectedEngine(Workload.of_plan(load_plan(plan_path), plan_path), ONE_THREAD)


def slots_app(limits: ServerLimits | None = None):
    plan = load_plan(fixture_plan("slots"))
    return create_app(slots_engine, plan.name, plan.digest, limits or ServerLimits())


def test_concurrent_requests_decode_side_by_side_with_their_alone_tokens() -> None:
    prompts = [PROMPT, build_shape("echo", 24).prompt, "The lazy dog sleeps.", "Quick brown foxes"]
    with serving(slots_app()) as base:
        assert httpx.get(f"{base}/health").json()["slots"] == 4
        alone = [complete(base, prompt=p, max_tokens=24).json()["receipt"] for p in prompts]
        results: dict[int, dict] = {}
        threads = [threading.Thread(target=lambda i=i, p=p: results.update(
            {i: complete(base, prompt=p, max_tokens=24).json()["receipt"]})) for i, p in enumerate(prompts * 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(BOUND_S)
        assert [results[i]["tokens_sha256"] for i in range(8)] == [r["tokens_sha256"] for r in alone * 2]
        assert metric(base, "power_requests_total", status="ok") == 12


def test_a_cancelled_stream_beside_others_leaves_their_tokens_alone() -> None:
    with serving(slots_app()) as base:
        expected = complete(base, max_tokens=20).json()["receipt"]["tokens_sha256"]
        with httpx.stream("POST", f"{base}/v1/completions", json={"prompt": SLOW, "max_tokens": LONG, "stream": True},
                          timeout=BOUND_S) as cancelled:
            events = stream_events(cancelled)  # kept: a dropped iterator closes the stream
            next(events)
            beside = complete(base, max_tokens=20)  # decoded while the slow stream holds another slot
            assert metric(base, "power_slots_busy") == 1
        until(lambda: metric(base, "power_requests_total", status="cancelled") == 1, "the cancellation to be counted")
        assert beside.json()["receipt"]["tokens_sha256"] == expected
        assert complete(base, max_tokens=20).json()["receipt"]["tokens_sha256"] == expected


# --- server defects: each answered with the right status, promptly ------------------------------------------------


def test_a_plain_client_that_disconnects_is_cancelled_while_tokens_flow() -> None:
    """The request would decode LONG tokens for seconds; its client gives up after half a second."""
    with serving(slots_app()) as base:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/completions", json={"prompt": SLOW, "max_tokens": LONG}, timeout=0.5)
        until(lambda: metric(base, "power_requests_total", status="cancelled") == 1, "the disconnect to cancel it")
        until(lambda: metric(base, "power_slots_busy") == 0, "its slot to free")
        assert metric(base, "power_generated_tokens_total") < LONG / 2
        assert complete(base, max_tokens=4).status_code == 200


def test_an_oversized_body_is_413_and_a_long_prompt_is_refused_before_tokenizing() -> None:
    with serving(slots_app(ServerLimits(request_timeout_s=2.0))) as base:
        huge = httpx.post(f"{base}/v1/completions", json={"prompt": "a" * 10_000_000}, timeout=BOUND_S)
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large"
        long = httpx.post(f"{base}/v1/completions", json={"prompt": "word " * 400_000}, timeout=BOUND_S)
        assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
        assert "bytes" in long.json()["error"]["message"]  # refused on its length, before any tokenizing
        assert httpx.get(f"{base}/health").status_code == 200
        assert metric(base, "power_requests_total", status="bad_request") == 2


@pytest.mark.parametrize("body, param", [
    (b'{"prompt": "a\\ud800b"}', "prompt"),
    (b'{"prompt": "x", "stop": ["\\udfff"]}', "stop"),
    (b"[" * 100_000 + b"]" * 100_000, None),
    (b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", None),
])
def test_malformed_text_deep_nesting_and_huge_numbers_are_400_in_openai_shape(body: bytes, param, served_base) -> None:
    before = metric(served_base, "power_requests_total", status="bad_request")
    response = httpx.post(f"{served_base}/v1/completions", content=body, timeout=BOUND_S)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert metric(served_base, "power_requests_total", status="bad_request") == before + 1


def test_a_vanishing_temperature_samples_greedily(served_base: str) -> None:
    greedy = complete(served_base, max_tokens=12).json()["receipt"]
    tiny = complete(served_base, max_tokens=12, temperature=5e-324, seed=3).json()["receipt"]
    assert tiny["token_ids"] == greedy["token_ids"]


def test_unknown_routes_answer_in_openai_shape(served_base: str) -> None:
    response = httpx.get(f"{served_base}/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["type"] == "invalid_request_error"


def test_chat_without_a_template_says_how_to_give_one(served_base: str) -> None:
    response = httpx.post(f"{served_base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "no_chat_template" and "--chat-template-file" in error["message"]


def test_serve_refuses_a_chat_template_file_that_does_not_compile(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}{{ message['content'] }")
    result = CliRunner().invoke(main, ["serve", str(fixture_plan("ngram")), "--port", "0",
                                       "--chat-template-file", str(broken)])
    assert result.exit_code == 2 and "does not compile" in result.output and "broken.jinja" in result.output


def test_admission_counts_free_slots_and_queue_places_together(release: threading.Event) -> None:
    """Issue 26 item 11: with 4 slots and 4 queue places, 8 requests are admitted while the engine thread is busy
    (before it moved any of them into a slot), the ninth is the first 429."""
    plan_path = fixture_plan("slots")
    plan = load_plan(plan_path)
    app = create_app(lambda: InjectedEngine(Workload.of_plan(plan, plan_path), ONE_THREAD), plan.name, plan.digest,
                     ServerLimits(queue_size=4))
    with serving(app) as base:
        answers: list[httpx.Response] = []
        burst = [threading.Thread(target=lambda: answers.append(complete(base, prompt=HELD, max_tokens=4)))
                 for _ in range(8)]
        for thread in burst:
            thread.start()
        until(lambda: metric(base, "power_queue_depth") + metric(base, "power_slots_busy") == 8, "8 admissions")
        assert complete(base, max_tokens=4).status_code == 429
        release.set()
        for thread in burst:
            thread.join(BOUND_S)
        assert [a.status_code for a in answers] == [200] * 8


@pytest.mark.parametrize("field, value", [("top_p", 0.9), ("logprobs", 2), ("logprobs", True),
                                          ("presence_penalty", 0.5),
                                          ("frequency_penalty", -1), ("logit_bias", {"5": 100}), ("n", 2),
                                          ("best_of", 3), ("echo", True), ("top_k", 40), ("min_p", 0.05),
                                          ("ignore_eos", True)])
def test_a_parameter_the_server_does_not_implement_is_a_400_naming_it(field: str, value, served_base: str) -> None:
    """Issue 23 defect 6: never answered as if it had not been asked; its neutral value is accepted."""
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = httpx.post(f"{served_base}{path}", json=body | {"max_tokens": 2, field: value}, timeout=BOUND_S)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == field and error["code"] == "unsupported_parameter"
    neutral = complete(served_base, max_tokens=2, top_p=1, presence_penalty=0.0, frequency_penalty=0, logprobs=None,
                       n=1, echo=False, top_k=0, min_p=0, ignore_eos=False)
    assert neutral.status_code == 200


@contextmanager
def serving_bounded(limits: ServerLimits) -> Iterator[tuple[str, int]]:
    """The app behind the protocol `power serve` runs (`http_protocol`): (base URL, port)."""
    from power.serving.limits import http_protocol

    server = uvicorn.Server(uvicorn.Config(app_for(limits), host="127.0.0.1", port=0, log_level="warning",
                                           http=http_protocol(limits)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started, "the server to start")
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    try:
        until(lambda: httpx.get(f"{base}/health").status_code == 200, "/health to answer 200")
        yield base, port
    finally:
        server.should_exit = True
        thread.join(BOUND_S)


def test_slow_headers_are_cut_off_a_stalled_body_is_408_and_a_client_leaving_mid_body_is_cancelled() -> None:
    """Issue 26 (low): uvicorn alone never times out a request's headers or body."""
    limits = ServerLimits(headers_timeout_s=1.0, body_timeout_s=1.0)
    with serving_bounded(limits) as (base, port):
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as slow:
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest of the headers
            started = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 10
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as stalled:
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{\"prompt\":")
            assert stalled.recv(4096).startswith(b"HTTP/1.1 408")
        before = metric(base, "power_requests_total", status="cancelled")
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as leaving:
            leaving.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 100\r\n\r\n{\"prompt\":")
            time.sleep(0.2)
        until(lambda: metric(base, "power_requests_total", status="cancelled") == before + 1, "the cancelled count")
        assert metric(base, "power_requests_total", status="error") == 0
