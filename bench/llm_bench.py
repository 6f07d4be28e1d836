"""LLM executor benchmark: in-flight batching vs static batching vs one request at a time.

A tiny Llama-family checkpoint (random weights, seeded) is built in a temp dir at run time. For
each concurrency C, C closed-loop clients each send streaming requests of mixed prompt and
output lengths, one after another with an exponential think time between them (so requests
arrive over time). The same request list runs under three executor configurations:

- in-flight: ``BatchingType.INFLIGHT``, ``max_batch_size`` = C;
- static: ``BatchingType.STATIC``, ``max_batch_size`` = C (a batch starts only after the
  previous one has drained);
- one-at-a-time: ``max_batch_size`` = 1.

Reported: generated tokens/s (all generated tokens / time from the first submission to the last
token), time to first token and inter-token latency (p50 / p99, from the client's side).

    .venv/bin/python bench/llm_bench.py --threads 2
"""

from __future__ import annotations

import argparse
import collections
import platform
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shoal.llm import BatchingType, Executor, ExecutorConfig, KvCacheConfig, Request

MODES = ("in-flight", "static", "one-at-a-time")


@dataclass
class Workload:
    prompt_tokens: tuple[int, int] = (16, 128)
    output_tokens: tuple[int, int] = (16, 128)
    think_ms: float = 20.0  # mean of the exponential pause between a client's requests
    requests_per_client: dict[int, int] = field(default_factory=lambda: {1: 8, 8: 6, 32: 4})


@dataclass
class Trace:
    submitted: float
    token_times: list[float] = field(default_factory=list)
    tokens: int = 0


def build_checkpoint(path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=1024)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)


def client_plans(concurrency: int, workload: Workload,
                 seed: int) -> list[list[tuple[float, list[int], int]]]:
    """Per client: (think seconds, prompt, max tokens) of each request, the same for every
    mode."""
    rng = random.Random(seed)
    plans = []
    for client in range(concurrency):
        plan = []
        for index in range(workload.requests_per_client[concurrency]):
            think = rng.expovariate(1000.0 / workload.think_ms)
            if index == 0:
                think += client * 0.005  # staggered start
            prompt = [rng.randrange(3, 2048) for _ in range(rng.randint(*workload.prompt_tokens))]
            plan.append((think, prompt, rng.randint(*workload.output_tokens)))
        plans.append(plan)
    return plans


class Dispatcher:
    """One thread drains ``await_responses`` and time-stamps every streamed token."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.lock = threading.Lock()
        self.traces: dict[int, Trace] = {}
        self.done: collections.defaultdict[int, threading.Event] = collections.defaultdict(
            threading.Event)
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop:
            responses = self.executor.await_responses(timeout=0.05)
            now = time.perf_counter()
            with self.lock:
                for response in responses:
                    assert response.result is not None, response.error_msg
                    trace = self.traces[response.request_id]
                    trace.token_times += [now] * len(response.result.output_token_ids[0])
                    trace.tokens += len(response.result.output_token_ids[0])
                    if response.result.is_final:
                        self.done[response.request_id].set()

    def submit(self, prompt: list[int], max_tokens: int) -> threading.Event:
        with self.lock:  # the dispatcher must see the trace before the first token
            submitted = time.perf_counter()
            request_id = self.executor.enqueue_request(Request(prompt, max_tokens,
                                                               streaming=True))
            self.traces[request_id] = Trace(submitted)
            return self.done[request_id]


def run_mode(model_dir: Path, mode: str, concurrency: int,
             plans: list[list[tuple[float, list[int], int]]]) -> dict[str, float]:
    config = ExecutorConfig(
        max_batch_size=1 if mode == "one-at-a-time" else concurrency,
        batching_type=BatchingType.STATIC if mode == "static" else BatchingType.INFLIGHT,
        max_num_tokens=8192,
        kv_cache_config=KvCacheConfig(tokens_per_block=32, max_tokens=concurrency * 400))
    with Executor(model_dir, config) as executor:
        dispatcher = Dispatcher(executor)
        dispatcher.submit([5] * 32, 4).wait()  # warm-up, not measured
        with dispatcher.lock:
            dispatcher.traces.clear()

        def client(plan: list[tuple[float, list[int], int]]) -> None:
            for think, prompt, max_tokens in plan:
                time.sleep(think)
                dispatcher.submit(prompt, max_tokens).wait()

        threads = [threading.Thread(target=client, args=(plan,)) for plan in plans]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        dispatcher.stop = True
        dispatcher.thread.join()
    return summarize(list(dispatcher.traces.values()))


def summarize(traces: list[Trace]) -> dict[str, float]:
    start = min(t.submitted for t in traces)
    end = max(t.token_times[-1] for t in traces)
    ttft = [(t.token_times[0] - t.submitted) * 1000 for t in traces]
    itl = [(later - earlier) * 1000 for t in traces
           for earlier, later in zip(t.token_times, t.token_times[1:], strict=False)]
    return {"requests": len(traces), "tokens": sum(t.tokens for t in traces),
            "tokens_per_s": sum(t.tokens for t in traces) / (end - start),
            "ttft_p50": percentile(ttft, 50), "ttft_p99": percentile(ttft, 99),
            "itl_p50": percentile(itl, 50), "itl_p99": percentile(itl, 99)}


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workload = Workload()
    rows = []
    with tempfile.TemporaryDirectory(prefix="llm-bench-") as tmp:
        model_dir = Path(tmp)
        build_checkpoint(model_dir)
        for concurrency in args.concurrency:
            plans = client_plans(concurrency, workload, args.seed + concurrency)
            for mode in MODES:
                started = time.perf_counter()
                result = run_mode(model_dir, mode, concurrency, plans)
                rows.append((concurrency, mode, result))
                print(f"c={concurrency} {mode}: {result} ({time.perf_counter() - started:.1f} s)",
                      flush=True)
    print_report(rows, args, workload)


def print_report(rows: list[tuple[int, str, dict[str, float]]], args: argparse.Namespace,
                 workload: Workload) -> None:
    import os

    import transformers

    print(f"\nMachine: {os.cpu_count()} cores, {cpu_model()}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, Python {platform.python_version()}; "
          f"torch.set_num_threads({args.threads}).")
    print(f"Workload: prompts {workload.prompt_tokens[0]}-{workload.prompt_tokens[1]} tokens, "
          f"outputs {workload.output_tokens[0]}-{workload.output_tokens[1]} tokens (uniform), "
          f"think time exp(mean {workload.think_ms:g} ms), requests per client "
          f"{workload.requests_per_client}, greedy, streaming.\n")
    print("| concurrency | mode | requests | generated tokens | tokens/s | TTFT p50 ms "
          "| TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for concurrency, mode, r in rows:
        print(f"| {concurrency} | {mode} | {r['requests']:.0f} | {r['tokens']:.0f} | "
              f"{r['tokens_per_s']:,.0f} | {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | "
              f"{r['itl_p50']:.1f} | {r['itl_p99']:.1f} |")
    by = {(c, m): r for c, m, r in rows}
    for concurrency in args.concurrency:
        inflight, static = by[(concurrency, "in-flight")], by[(concurrency, "static")]
        single = by[(concurrency, "one-at-a-time")]
        print(f"\nc={concurrency}: in-flight / one-at-a-time tokens/s = "
              f"{inflight['tokens_per_s'] / single['tokens_per_s']:.2f}x; TTFT p99 in-flight "
              f"{inflight['ttft_p99']:.1f} ms vs static {static['ttft_p99']:.1f} ms")


if __name__ == "__main__":
    main()
