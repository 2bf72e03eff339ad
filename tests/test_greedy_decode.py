"""The exact greedy LM head wired into decoding (`power.documents.greedy_head`, docs/runtime.md "The exact greedy LM
head"): on the bundled Gemma 3 270M, whose tied head is Q8_0 and which caps no logits, a greedy request's one-row
forwards take their token from the greedy head, and every stream is the full head's token for token: through
`power run`, through `power serve` over HTTP with requests side by side, beside n-gram speculation (whose
verification rows keep the full head); a sampled request never takes it; the plan charges its copy of the head.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from plan_helpers import write_profile
from power_serve import power_serve
from spec_helpers import GEMMA, REPO

from power.app.cli import main
from power.documents.plan import load_plan
from power.runtime.decoder import Decoder
from power.runtime.gguf_weights import GGUFFile
from power.runtime.sampling import Sampler, SamplingParams
from power.runtime.scheduler import SchedulerConfig
from power.runtime.speculators.base import NGramWindow, SpeculatorRequest
from power.runtime.speculators.registry import build as build_speculator
from power.runtime.tokenizer import Tokenizer
from power.runtime.trunks import load_trunk

pytestmark = pytest.mark.slow  # outside `scripts/test --fast`: runs the real model for long streams

PROMPTS = ("Once upon a time there was a little girl named Lily. She loved to",
           "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "The history of the Roman Empire begins with")
TOKENS = 300
BOUND_S = 300.0


def power_run(prompt: str, greedy_head: str) -> dict:
    result = CliRunner().invoke(main, ["run", "--gguf", str(GEMMA), "--prompt", prompt, "--max-tokens", str(TOKENS),
                                       "--threads", "1", "--greedy-head", greedy_head, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_power_run_streams_are_the_same_with_the_greedy_head_on_and_off(prompt):
    on, off = power_run(prompt, "on"), power_run(prompt, "off")
    assert on["token_ids"] == off["token_ids"]
    assert len(on["token_ids"]) > 100
    assert on["runtime"]["lm_head"].startswith("greedy (exact bound and refine")
    assert off["runtime"]["lm_head"] == "full (turned off (--greedy-head off))"


@pytest.fixture(scope="module")
def gemma_plan(tmp_path_factory) -> Path:
    """Gemma alone, three slots: requests sent together decode side by side, some rounds one row, some several."""
    folder = tmp_path_factory.mktemp("greedy")
    profile = write_profile(folder, "none", runtime={"ctx": 3072, "slots": 3, "verify_capacity": 4})
    host = folder / "cpu.toml"
    host.write_text('schema = "power.host/v1"\nname = "cpu"\n'
                    'devices = [{ model = "cpu", vram = "16 GiB", kind = "cpu" }]\n')
    made = CliRunner().invoke(main, ["plan", str(REPO / "manifests" / "gemma3-270m.toml"), str(profile),
                                     "--host", str(host), "-o", str(folder / "plan.json")])
    assert made.exit_code == 0, made.output
    return folder / "plan.json"


def test_the_plan_charges_what_holding_the_head_once_adds(gemma_plan):
    components = {c.name: c for c in load_plan(gemma_plan).memory.components}
    assert components["greedy LM head"].bytes == 262_144 // 16 * 14 * 16  # a norm byte a row and bounded block


def served_completions(plan: Path, greedy_head: str) -> list[dict]:
    """Every prompt sent at once to a real `power serve` of the plan; each answer's receipt."""
    with power_serve(plan, "--device", "cpu", "--threads", "1", "--greedy-head", greedy_head,
                     bound_s=BOUND_S) as served:

        def complete(prompt: str) -> dict:
            body = {"prompt": prompt, "max_tokens": TOKENS, "temperature": 0}
            answer = httpx.post(f"{served.base}/v1/completions", json=body, timeout=BOUND_S)
            assert answer.status_code == 200, answer.text
            return answer.json()["receipt"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            return list(pool.map(complete, PROMPTS))


def test_power_serve_answers_are_the_same_with_the_greedy_head_on_and_off(gemma_plan):
    on, off = served_completions(gemma_plan, "on"), served_completions(gemma_plan, "off")
    assert [receipt["token_ids"] for receipt in on] == [receipt["token_ids"] for receipt in off]
    assert all(len(receipt["token_ids"]) > 100 for receipt in on)
    assert on[0]["runtime"]["lm_head"].startswith("greedy") and off[0]["runtime"]["lm_head"].startswith("full")


@pytest.fixture(scope="module")
def gemma():
    trunk = load_trunk(GEMMA, n_ctx=1024, verify_capacity=8)
    return trunk, Tokenizer.from_gguf(GGUFFile(GEMMA))


def test_a_sampled_request_never_takes_the_greedy_head(gemma):
    trunk, tokenizer = gemma
    before = trunk.greedy_rows
    sampled = Decoder(trunk, Sampler(SamplingParams(temperature=0.8, seed=3)))
    sampled.generate(tokenizer.encode(PROMPTS[0]), 40)
    assert trunk.greedy_rows == before
    Decoder(trunk, Sampler(SamplingParams())).generate(tokenizer.encode(PROMPTS[0]), 40)
    assert trunk.greedy_rows == before + 40  # the prompt's last row and 39 one-row rounds


def test_ngram_speculation_beside_the_greedy_head_equals_the_full_heads_plain_stream(gemma):
    trunk, tokenizer = gemma
    echo = tokenizer.encode("The cat sat on the mat. The dog sat on the log. " * 6)
    plain = Decoder(load_trunk(GEMMA, n_ctx=1024, verify_capacity=8, greedy_head=False), Sampler(SamplingParams()))
    expected = plain.generate(echo, TOKENS).tokens
    before = trunk.greedy_rows
    ngram = build_speculator("ngram", SpeculatorRequest(trunk, ngram=NGramWindow(2, 1, 64)))
    speculative = Decoder(trunk, Sampler(SamplingParams()), ngram, SchedulerConfig(k=7, s=7))
    generation = speculative.generate(echo, TOKENS)
    assert generation.tokens == expected
    assert generation.stats.speculative_rounds > 0 and trunk.greedy_rows > before
