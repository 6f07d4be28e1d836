"""LLM metrics and statistics on a real server (the tiny checkpoint of ``test_llm_serving.py``,
its own server so every count starts at zero): after requests through the OpenAI API and
tritonclient gRPC, ``/metrics`` counts exactly the prompt and generated tokens served, the
time-to-first-token histogram one observation per request and the inter-token histogram one per
generated token after the first; the statistics document carries the same figures
(``shoal_llm``); a cancelled stream's KV blocks and its active request go back to zero. On a
(test-only, fake) GPU the device-memory ledger holds the model's KV pool, exactly the bytes the
executor allocated, and its weights, from load to unload (``/metrics`` and the dashboard)."""

from __future__ import annotations

import pathlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import (  # noqa: F401  (module fixtures, shared)
    MAX_POSITIONS,
    NUM_BLOCKS,
    PROMPTS,
    Stream,
    llm_repo,
    llm_server,
    tensor_inputs,
    tokenizer,
)
from tests.fakes.gpus import fake_gpus_env
from tests.ops.live import tiny_llm_model

LABELS = {"model": "llm", "version": "1"}


@pytest.fixture(scope="module")
def client(llm_server: ShoalServer) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{llm_server.base}/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server: ShoalServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics`` keyed by (sample name as written, sorted labels)."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = _SAMPLE.match(line)
        assert match, line
        labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def sample(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float | None:
    return samples.get((name, tuple(sorted({**LABELS, **labels}.items()))))


def llm_stats(server: ShoalServer) -> dict[str, Any]:
    """The ``shoal_llm`` field of the model's statistics (waiting for the worker's first
    heartbeat after its load, which carries the first figures)."""
    def entry() -> dict[str, Any]:
        r = httpx.get(f"{server.base}/v2/models/llm/stats", timeout=10)
        assert r.status_code == 200, r.text
        (found,) = r.json()["model_stats"]
        return dict(found)

    llm: dict[str, Any] = wait_for("shoal_llm in the statistics", entry,
                                   lambda e: "shoal_llm" in e)["shoal_llm"]
    return llm


def wait_for(what: str, probe: Callable[[], Any], wanted: Callable[[Any], bool],
             timeout: float = 10.0) -> Any:
    """Poll ``probe`` until ``wanted`` holds (figures reach the broker on the worker's 1 s
    heartbeat)."""
    deadline = time.monotonic() + timeout
    while not wanted(value := probe()):
        assert time.monotonic() < deadline, f"{what}: {value}"
        time.sleep(0.1)
    return value


def test_counters_and_histograms_count_the_tokens_served(
        llm_server: ShoalServer, client: openai.OpenAI, tokenizer: Any) -> None:  # noqa: F811
    prompt_tokens = generated = requests = 0
    for prompt in PROMPTS[:3]:  # streamed through the OpenAI API, usage from the last chunk
        chunks = list(client.completions.create(
            model="llm", prompt=prompt, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        usage = chunks[-1].usage
        assert usage is not None
        prompt_tokens += usage.prompt_tokens
        generated += usage.completion_tokens
        requests += 1
    r = client.chat.completions.create(model="llm", max_tokens=7, temperature=0,
                                       messages=[{"role": "user", "content": PROMPTS[4]}])
    assert r.usage is not None
    prompt_tokens += r.usage.prompt_tokens
    generated += r.usage.completion_tokens
    requests += 1
    ids = tokenizer.encode(PROMPTS[5]).ids  # tensor form, one response, no end id
    stream = Stream(llm_server)
    try:
        stream.send(tensor_inputs(ids, 9, streaming=False))
        tokens = stream.tokens()
    finally:
        stream.close()
    assert len(tokens) == 9
    prompt_tokens += len(ids)
    generated += len(tokens)
    requests += 1

    samples = wait_for(
        "TTFT count", lambda: scrape(llm_server),
        lambda s: sample(s, "nv_llm_time_to_first_token_ms_count") == requests
        and sample(s, "nv_llm_output_token_len_count",
                   response_metric_type="total_output_tokens") == requests)
    assert sample(samples, "nv_llm_prompt_tokens") == prompt_tokens
    assert sample(samples, "nv_llm_generation_tokens") == generated
    assert sample(samples, "nv_llm_inter_token_latency_ms_count") == generated - requests
    assert sample(samples, "nv_llm_input_token_len_count",
                  response_metric_type="total_input_tokens") == requests
    assert sample(samples, "nv_llm_input_token_len_sum",
                  response_metric_type="total_input_tokens") == prompt_tokens
    assert sample(samples, "nv_llm_output_token_len_sum",
                  response_metric_type="total_output_tokens") == generated
    first_token_ms = sample(samples, "nv_llm_time_to_first_token_ms_sum")
    assert first_token_ms is not None and first_token_ms > 0
    # buckets are cumulative and end with every observation
    assert sample(samples, "nv_llm_time_to_first_token_ms_bucket", le="+Inf") == requests
    assert sample(samples, "nv_trt_llm_request_metrics", request_type="max") == 32
    assert sample(samples, "nv_trt_llm_kv_cache_block_metrics",
                  kv_cache_block_type="max") == NUM_BLOCKS
    assert sample(samples, "nv_trt_llm_kv_cache_block_metrics",
                  kv_cache_block_type="used") == 0
    iterations = sample(samples, "nv_trt_llm_general_metrics", general_type="iteration_counter")
    assert iterations is not None and iterations >= generated / requests
    assert (sample(samples, "nv_trt_llm_runtime_memory_metrics", memory_type="cpu") or 0) > 0

    stats = llm_stats(llm_server)  # the statistics extension carries the same figures
    assert stats["tokens"] == {"prompt": prompt_tokens, "generation": generated}
    assert stats["time_to_first_token"]["count"] == requests
    assert stats["inter_token"]["count"] == generated - requests
    assert stats["requests"]["finished"] == requests
    assert stats["requests"]["active"] == 0 and stats["requests"]["queued"] == 0
    assert stats["kv_cache"]["used_blocks"] == 0
    assert stats["kv_cache"]["max_blocks"] == NUM_BLOCKS
    assert stats["memory"]["kv_pool_bytes"] > 0 and stats["memory"]["weights_bytes"] > 0

    grpc = grpcclient.InferenceServerClient(llm_server.grpc_url)  # Triton's protobuf shape
    try:
        (entry,) = grpc.get_inference_statistics("llm").model_stats
        assert entry.name == "llm"
    finally:
        grpc.close()


def test_a_cancelled_stream_gives_back_its_blocks_and_request(
        llm_server: ShoalServer, tokenizer: Any) -> None:  # noqa: F811
    ids = tokenizer.encode(PROMPTS[3]).ids
    stream = Stream(llm_server)
    try:
        stream.send(tensor_inputs(ids, MAX_POSITIONS - len(ids), streaming=True))
        _, error = stream.results.get(timeout=30)
        assert error is None, error
        running = wait_for("a running request", lambda: llm_stats(llm_server),
                           lambda s: s["kv_cache"]["used_blocks"] > 0
                           and s["requests"]["active"] == 1)
        assert running["kv_cache"]["free_blocks"] == NUM_BLOCKS - running["kv_cache"]["used_blocks"]
        samples = scrape(llm_server)
        assert (sample(samples, "nv_trt_llm_kv_cache_block_metrics",
                       kv_cache_block_type="used") or 0) > 0
    finally:
        stream.close(cancel=True)
    after = wait_for("blocks back", lambda: llm_stats(llm_server),
                     lambda s: s["kv_cache"]["used_blocks"] == 0
                     and s["requests"]["active"] == 0)
    assert after["kv_cache"]["free_blocks"] == NUM_BLOCKS
    samples = scrape(llm_server)
    assert sample(samples, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used") == 0
    assert sample(samples, "nv_trt_llm_request_metrics", request_type="active") == 0


def reserved(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
             part: str) -> float | None:
    """The ledger's bytes of GPU 0 held for the llm model's ``part``."""
    return samples.get(("shoal_device_memory_reserved_bytes",
                        (("device", "0"), ("model", "llm"), ("part", part))))


def test_the_device_ledger_holds_the_kv_pool_and_weights_from_load_to_unload(
        tmp_path: pathlib.Path) -> None:
    tiny_llm_model(tmp_path / "llm")
    config = tmp_path / "llm" / "config.pbtxt"
    text = config.read_text()
    assert text.count("instance_group [ { count: 1 kind: KIND_CPU } ]") == 1
    config.write_text(text.replace("instance_group [ { count: 1 kind: KIND_CPU } ]",
                                   "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]"))
    args = ["--model-control-mode=explicit", "--load-model=llm",
            "--model-load-device-margin-bytes=0"]
    with serving(ShoalServer([str(tmp_path)], args, env=fake_gpus_env("0:2GiB"))) as srv:
        memory = llm_stats(srv)["memory"]  # what the executor allocated
        samples = scrape(srv)
        held = {part: reserved(samples, part) for part in ("kv_pool", "weights", "margin")}
        assert held["kv_pool"] == memory["kv_pool_bytes"] > 0
        weights = sum(f.stat().st_size for f in (tmp_path / "llm" / "checkpoint").glob(
            "*.safetensors"))
        assert held["weights"] == weights > 0 and held["margin"] == 0
        assert samples[("shoal_device_memory_capacity_bytes", (("device", "0"),))] == 2 << 30
        dashboard = wait_for("the ledger on the dashboard", lambda: httpx.get(
            f"http://127.0.0.1:{srv.metrics_port}/dashboard/api/stats", timeout=10).json(),
            lambda d: bool(d["devices"]))
        (gpu,) = dashboard["devices"]
        assert {"model": "llm", "part": "kv_pool", "bytes": memory["kv_pool_bytes"]} \
            in gpu["holders"]
        assert gpu["capacity_bytes"] == 2 << 30 and gpu["reserved_bytes"] >= held["kv_pool"]

        r = httpx.post(f"{srv.base}/v2/repository/models/llm/unload", timeout=30)
        assert r.status_code == 200, r.text
        wait_for("the reservation released", lambda: scrape(srv),
                 lambda s: reserved(s, "kv_pool") is None, timeout=60)
