"""Hostile chat templates (issue 26, items 2 and 9): bounded in time, memory and output, never stopping the server.

Each template is what a GGUF or a `--chat-template-file` could carry; the server renders it in its sandbox
(`power.runtime.template_sandbox`), so /health and other requests answer while it runs and it costs at most the
render budget.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from runtime_plans import fixture_plan, write_plan
from test_server import BOUND_S, ONE_THREAD, complete, serving

from power.app.cli import main
from power.documents.plan import load_plan
from power.runtime.chat import ChatTemplate
from power.runtime.engine import Engine
from power.runtime.template_sandbox import RENDER_BUDGET_S, TemplateSandbox
from power.runtime.workload import Workload
from power.serving.server import create_app

HELLO = [{"role": "user", "content": "hi"}]
POWER_BOMB = "{{ (messages|length + 9) ** (messages|length * 10**9) }}"
NESTED_RANGES = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
GIGABYTE_FORMAT = "{{ '{:>999999999}'.format(1) }}"
ENDLESS_OUTPUT = "{% for i in range(100000) %}{{ messages[0]['content'] * 1000 }}{% endfor %}"


def chat(base: str, messages=HELLO) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=BOUND_S)


def served_with(source: str):
    plan_path = fixture_plan("ngram")
    plan = load_plan(plan_path)
    template = ChatTemplate.load(source, "the test's template", "", "", TemplateSandbox())
    return create_app(lambda: Engine(Workload.of_plan(plan, plan_path), ONE_THREAD), plan.name, plan.digest,
                      chat_template=template)


@pytest.mark.parametrize("source", [POWER_BOMB, NESTED_RANGES])
def test_a_template_that_never_ends_is_stopped_and_the_server_answers_meanwhile(source: str) -> None:
    with serving(served_with(source)) as base:
        answers: list[httpx.Response] = []
        started = time.monotonic()
        render = threading.Thread(target=lambda: answers.append(chat(base)))
        render.start()
        time.sleep(0.3)
        health = httpx.get(f"{base}/health", timeout=1.0)  # the event loop is free while the template runs
        assert health.status_code == 200
        render.join(BOUND_S)
        [answer] = answers
        assert answer.status_code == 400 and "ran past its budget" in answer.json()["error"]["message"]
        assert time.monotonic() - started < RENDER_BUDGET_S + 5
        assert complete(base, max_tokens=2).status_code == 200  # the engine carries on


def test_a_template_that_allocates_a_gigabyte_fails_without_growing_the_server() -> None:
    with serving(served_with(GIGABYTE_FORMAT)) as base:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        answer = chat(base)
        assert answer.status_code == 400 and "memory" in answer.json()["error"]["message"]
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kib < 256 * 1024


def test_a_template_whose_output_outgrows_the_context_is_refused() -> None:
    with serving(served_with(ENDLESS_OUTPUT)) as base:
        answer = chat(base)
        assert answer.status_code == 400 and "characters" in answer.json()["error"]["message"]


def test_any_template_failure_is_a_400_not_a_500() -> None:
    with serving(served_with("{{ messages[0]['content'] | int / 0 }}")) as base:
        answer = chat(base)
        assert answer.status_code == 400 and "ZeroDivisionError" in answer.json()["error"]["message"]


def _serve(*args: str):
    return CliRunner().invoke(main, ["serve", str(fixture_plan("ngram")), "--port", "0", *args])


def test_serve_refuses_a_template_file_that_is_a_fifo_before_it_binds(tmp_path: Path) -> None:
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    result = _serve("--chat-template-file", str(fifo))
    assert result.exit_code == 2 and "template.fifo" in result.output and "regular file" in result.output
    assert time.monotonic() - started < 10


def test_serve_refuses_a_template_file_larger_than_the_bound(tmp_path: Path) -> None:
    large = tmp_path / "large.jinja"
    large.write_text("x" * (2 << 20))
    result = _serve("--chat-template-file", str(large))
    assert result.exit_code == 2 and "large.jinja" in result.output


def test_serve_refuses_a_template_file_whose_compilation_recurses(tmp_path: Path) -> None:
    deep = tmp_path / "deep.jinja"
    deep.write_text("{{ " + "(" * 20000 + "1" + ")" * 20000 + " }}")
    result = _serve("--chat-template-file", str(deep))
    assert result.exit_code == 2 and "does not compile" in result.output


def test_a_model_template_that_cannot_compile_leaves_the_server_healthy_without_chat(tmp_path: Path) -> None:
    plan_path = write_plan(tmp_path, "ngram", "{{ " + "(" * 20000 + "1" + ")" * 20000 + " }}")
    plan = load_plan(plan_path)
    app = create_app(lambda: Engine(Workload.of_plan(plan, plan_path), ONE_THREAD), plan.name, plan.digest)
    with serving(app) as base:  # /health reaches 200: the loader thread did not die on the template
        answer = chat(base)
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "no_chat_template"
        assert "does not compile" in answer.json()["error"]["message"]


CONCATENATING = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def test_an_empty_rendered_prompt_is_a_400_and_the_engine_carries_on() -> None:
    """Issue 26 item 5: `content: ""` under a concatenating template renders nothing; on a model that adds no BOS
    the prompt has no tokens."""
    with serving(served_with(CONCATENATING)) as base:
        answer = chat(base, [{"role": "user", "content": ""}])
        assert answer.status_code == 400 and "the prompt is empty" in answer.json()["error"]["message"]
        assert httpx.get(f"{base}/health").status_code == 200
        assert chat(base, [{"role": "user", "content": "Hello world"}]).status_code == 200


class BreakingEngine(Engine):
    """An engine whose step fails outside any request (its state is then unknown)."""

    def step(self) -> None:
        raise RuntimeError("injected engine failure")


def test_a_dead_engine_makes_health_503_and_requests_503() -> None:
    plan_path = fixture_plan("ngram")
    plan = load_plan(plan_path)
    app = create_app(lambda: BreakingEngine(Workload.of_plan(plan, plan_path), ONE_THREAD), plan.name, plan.digest)
    with serving(app) as base:
        first = complete(base, max_tokens=2)
        assert first.status_code == 503 and "injected engine failure" in first.json()["error"]["message"]
        health = httpx.get(f"{base}/health")
        assert health.status_code == 503 and "the engine stopped" in health.json()["error"]
        assert complete(base, max_tokens=2).status_code == 503
