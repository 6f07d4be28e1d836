"""Prefix caching and chunked context through the server (OpenAI completions, streaming).

The model is issue #14's tiny random Llama (4 layers, hidden 256, 8 query / 4 key-value heads,
vocabulary 2,048, float32, word-level tokenizer: one token per word), built once into a temp
dir, served by ``shoal serve`` with the example's ``llm`` config (KV blocks of 32 tokens).

1. TTFT with a shared system prompt, block reuse off vs on (``enable_kv_cache_reuse``): one
   warm-up request, then ``--requests`` requests one after another, each the same
   ``--system-words``-token system prompt followed by its own 16-word question (max_tokens 8).
   TTFT = request sent -> first streamed text event, measured by the client. The reuse-on
   server also answers a 16-word prompt without the system prompt before each request: the
   floor (serving path + one short prefill) that reuse can approach.
   The same requests (as token ids) also go to an in-process ``Executor`` (no HTTP, no broker):
   the executor's own TTFT, reuse off vs on.
2. Inter-token latency of running generations while long prompts arrive, chunked context off vs
   on (``enable_chunked_context``, ``max_num_tokens`` ``--max-num-tokens``, reuse off): 4
   streams of ``--stream-tokens`` tokens start from short prompts; 0.2 s later
   ``--long-prompts`` distinct ``--long-words``-token prompts are sent one after another. ITL
   p50 / p99 / max over the streams' tokens while the long prompts were being answered (the
   run fails if a stream ended before the last of them: it would measure nothing).

    .venv/bin/python -m bench.llm_prefix_bench                   # prints a markdown section
    .venv/bin/python -m bench.llm_prefix_bench --write           # ... and writes RESULTS.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import random
import re
import statistics
import tempfile
import threading
import time

import httpx

from bench.sections import write_marked_section
from bench.servers import BENCH, ROOT, Server, launch_shoal

BEGIN = "<!-- llm-prefix-benchmark:begin -->"
END = "<!-- llm-prefix-benchmark:end -->"
EXAMPLE_CONFIG = ROOT / "examples" / "llm_repository" / "llm" / "config.pbtxt"
VOCAB = 2048


def build_checkpoint(path: pathlib.Path) -> None:
    from shoal.llm.tiny_checkpoint import TinyLlamaSpec, build_tiny_llama

    build_tiny_llama(path, TinyLlamaSpec(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=8,
        num_kv_heads=4, max_position_embeddings=4096, seed=0, tokenizer="word_level"))


def make_repository(root: pathlib.Path, checkpoint: pathlib.Path, parameters: dict[str, str],
                    ) -> pathlib.Path:
    """A repository whose ``llm`` model is the example's config over ``checkpoint``, with
    ``parameters`` set (replaced when the example names them, else added)."""
    repo = root / "repo"
    (repo / "llm" / "1").mkdir(parents=True)
    (repo / "llm" / "checkpoint").symlink_to(checkpoint)
    config = EXAMPLE_CONFIG.read_text()
    for key, value in parameters.items():
        line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
        config, count = re.subn(rf'parameters \{{ key: "{key}" value: \{{[^}}]*\}} \}}', line,
                                config)
        if not count:
            config += line + "\n"
    (repo / "llm" / "config.pbtxt").write_text(config)
    return repo


def words(rng: random.Random, count: int) -> str:
    return " ".join(f"w{rng.randrange(3, VOCAB)}" for _ in range(count))


# one client (keep-alive connections, thread-safe) for every request: httpx.stream() builds a
# client and its SSL context per call, tens of ms that would be counted as TTFT
_HTTP = httpx.Client(timeout=300, limits=httpx.Limits(max_connections=64))


def stream_completion(base: str, prompt: str, max_tokens: int) -> list[float]:
    """Send one streaming completion; the monotonic time of each text event (first: TTFT),
    preceded by the send time."""
    body = {"model": "llm", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    times = [time.monotonic()]
    with _HTTP.stream("POST", f"{base}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.monotonic())
    return times


def start(workdir: pathlib.Path, checkpoint: pathlib.Path, parameters: dict[str, str]) -> Server:
    workdir.mkdir(parents=True)
    repo = make_repository(workdir, checkpoint, parameters)
    # the repository links the one checkpoint built for every run
    return launch_shoal(repo, workdir, [f"--backend-config=llm,checkpoint-roots={checkpoint}"],
                        "llm")


def ttft_ms(base: str, prompt: str) -> float:
    times = stream_completion(base, prompt, 8)
    return (times[1] - times[0]) * 1000.0


def measure_ttft(checkpoint: pathlib.Path, tmp: pathlib.Path, reuse: bool,
                 args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """TTFTs with the system prompt, and (reuse on only) of short prompts without it."""
    rng = random.Random(7)
    system = words(rng, args.system_words)
    server = start(tmp / f"ttft-{reuse}", checkpoint, {
        "enable_kv_cache_reuse": str(reuse).lower(), "max_num_tokens": "4096"})
    base = f"http://127.0.0.1:{server.port}"
    try:
        stream_completion(base, f"{system} {words(rng, 16)}", 8)  # warm-up (primes the cache)
        ttfts, floor = [], []
        for _ in range(args.requests):
            if reuse:
                floor.append(ttft_ms(base, words(rng, 16)))
            ttfts.append(ttft_ms(base, f"{system} {words(rng, 16)}"))
        return ttfts, floor
    finally:
        server.stop()


def measure_in_process(checkpoint: pathlib.Path, reuse: bool,
                       args: argparse.Namespace) -> list[float]:
    """TTFT of the same kind of requests submitted as token ids to an in-process Executor."""
    from shoal.llm import Executor, ExecutorConfig, KvCacheConfig, Request

    rng = random.Random(7)
    system = [rng.randrange(3, VOCAB) for _ in range(args.system_words)]
    config = ExecutorConfig(max_num_tokens=4096, max_batch_size=32, kv_cache_config=KvCacheConfig(
        max_tokens=16384, enable_block_reuse=reuse))
    with Executor(checkpoint, config) as executor:
        ttfts = []
        for index in range(args.requests + 1):  # the first is the warm-up
            prompt = system + [rng.randrange(3, VOCAB) for _ in range(16)]
            sent = time.monotonic()
            request_id = executor.enqueue_request(Request(prompt, 8, streaming=True))
            responses = executor.await_responses(request_id, timeout=60)
            first = time.monotonic()
            while not any(r.has_error() or (r.result is not None and r.result.is_final)
                          for r in responses):  # the final one may come with the first
                responses = executor.await_responses(request_id, timeout=60)
            if index:
                ttfts.append((first - sent) * 1000.0)
        return ttfts


def measure_itl(checkpoint: pathlib.Path, tmp: pathlib.Path, chunked: bool,
                args: argparse.Namespace) -> list[float]:
    rng = random.Random(11)
    server = start(tmp / f"itl-{chunked}", checkpoint, {
        "enable_kv_cache_reuse": "false", "enable_chunked_context": str(chunked).lower(),
        "max_num_tokens": str(args.max_num_tokens)})
    base = f"http://127.0.0.1:{server.port}"
    try:
        stream_completion(base, words(rng, 8), 4)  # warm-up
        streams: list[list[float]] = []

        def run_stream(prompt: str) -> None:
            streams.append(stream_completion(base, prompt, args.stream_tokens))

        threads = [threading.Thread(target=run_stream, args=(words(rng, 8),)) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        long_prompts = [words(rng, args.long_words) for _ in range(args.long_prompts)]
        first = time.monotonic()  # the clock of stream_completion's times
        for prompt in long_prompts:
            stream_completion(base, prompt, 1)
        last = time.monotonic()
        for thread in threads:
            thread.join()
        if min(times[-1] for times in streams) < last:
            raise RuntimeError(f"a stream ended before the long prompts did: raise "
                               f"--stream-tokens ({args.stream_tokens})")
        # gaps between consecutive text events while the long prompts were answered (the
        # send -> first token gap is TTFT)
        return [(b - a) * 1000.0 for times in streams for a, b in itertools.pairwise(times[1:])
                if b >= first and a <= last]
    finally:
        server.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _load_note() -> str:
    """What the load average says about the run: the benchmark itself keeps about one core
    busy, so only more than the core count means other work shared the machine."""
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        return " (above the core count: other work shared the machine)"
    return ""


def report(ttft: dict[bool, list[float]], floor: list[float], in_process: dict[bool, list[float]],
           itl: dict[bool, list[float]], args: argparse.Namespace) -> str:
    lines = [BEGIN, "## LLM prefix caching and chunked context", "",
             "`.venv/bin/python -m bench.llm_prefix_bench --write` "
             f"(requests {args.requests}, system prompt {args.system_words} tokens, "
             f"long prompts {args.long_prompts} x {args.long_words} tokens, "
             f"max_num_tokens {args.max_num_tokens} and streams of {args.stream_tokens} tokens "
             "for the ITL runs); "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, on this "
             f"{os.cpu_count()}-core machine, 1-minute load average {os.getloadavg()[0]:.1f} at "
             f"the end{_load_note()}.", "",
             "| TTFT, shared system prompt | p50 ms | mean ms | min ms |", "|---|---|---|---|"]
    for reuse in (False, True):
        values = ttft[reuse]
        lines.append(f"| block reuse {'on' if reuse else 'off'} | "
                     f"{statistics.median(values):.1f} | {statistics.fmean(values):.1f} | "
                     f"{min(values):.1f} |")
    lines.append(f"| floor: 16-token prompt, no system prompt (reuse-on server) | "
                 f"{statistics.median(floor):.1f} | {statistics.fmean(floor):.1f} | "
                 f"{min(floor):.1f} |")
    for reuse in (False, True):
        values = in_process[reuse]
        lines.append(f"| in-process Executor, block reuse {'on' if reuse else 'off'} | "
                     f"{statistics.median(values):.1f} | {statistics.fmean(values):.1f} | "
                     f"{min(values):.1f} |")
    speedup = statistics.median(ttft[False]) / statistics.median(ttft[True])
    executor_speedup = statistics.median(in_process[False]) / statistics.median(in_process[True])
    lines += ["", f"TTFT p50 with reuse is {speedup:.1f}x lower through the server, "
              f"{executor_speedup:.1f}x lower in the Executor."]
    if not itl:
        return "\n".join([*lines, END]) + "\n"
    lines += ["",
              "| ITL of 4 running streams while long prompts arrive | p50 ms | p99 ms | max ms |",
              "|---|---|---|---|"]
    for chunked in (False, True):
        values = itl[chunked]
        lines.append(f"| chunked context {'on' if chunked else 'off'} | "
                     f"{statistics.median(values):.1f} | {percentile(values, 0.99):.1f} | "
                     f"{max(values):.1f} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--system-words", type=int, default=1000)
    parser.add_argument("--long-prompts", type=int, default=3)
    parser.add_argument("--long-words", type=int, default=1500)
    parser.add_argument("--max-num-tokens", type=int, default=256)
    parser.add_argument("--stream-tokens", type=int, default=900,
                        help="tokens of each running stream in the ITL runs")
    parser.add_argument("--skip-itl", action="store_true")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-prefix-bench-") as name:
        tmp = pathlib.Path(name)
        checkpoint = tmp / "checkpoint"
        build_checkpoint(checkpoint)
        ttft_off, _ = measure_ttft(checkpoint, tmp, False, args)
        ttft_on, floor = measure_ttft(checkpoint, tmp, True, args)
        ttft = {False: ttft_off, True: ttft_on}
        in_process = {reuse: measure_in_process(checkpoint, reuse, args)
                      for reuse in (False, True)}
        itl = {} if args.skip_itl else {chunked: measure_itl(checkpoint, tmp, chunked, args)
                                        for chunked in (False, True)}
    section = report(ttft, floor, in_process, itl, args)
    print(section)
    if args.write:
        write_marked_section(BENCH / "RESULTS.md", BEGIN, END, section)


if __name__ == "__main__":
    main()
