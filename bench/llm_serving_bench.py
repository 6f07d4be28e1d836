"""LLM serving benchmark: shoal vs vLLM's CPU build vs ``transformers serve``, through the
OpenAI-compatible endpoint, and shoal's in-process Executor (no HTTP) at the same load.

The model is issue #14's tiny random Llama (4 layers, hidden 256, SwiGLU 688, 8 query / 4
key-value heads, vocabulary 2,048, float32, word-level tokenizer with the tiny chat template),
built once into a temp dir. Its ``lm_head`` row of ``</s>`` is zeroed, so greedy decoding never
ends a request early on any server (none of the three has the same "ignore eos" switch); every
request's ``usage.completion_tokens`` is checked to be the number asked for.

Load: C closed-loop clients (C = 1, 8, 32), each sending 4 streaming chat completions one after
another (temperature 0, max_tokens 64, distinct 24-word prompts). tokens/s = generated tokens /
(last token - first request sent); TTFT and ITL are measured by the client per text event.
The in-process row submits the same prompts' token ids (rendered with the checkpoint's chat
template) to an ``Executor`` with C client threads.

    .venv/bin/python -m bench.llm_serving_bench                    # all four, writes RESULTS.md
    .venv/bin/python -m bench.llm_serving_bench --no-write --clients 8 --systems shoal in-process

Peers come from ``bash bench/llm_peers_install.sh`` (virtualenvs in ``--peers``); a system whose
virtualenv is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import platform
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.llm_bench import Dispatcher, Trace, cpu_model, summarize
from bench.llm_peers import MODEL_NAME, start_shoal_llm, start_transformers, start_vllm
from bench.llm_sse_client import ChatLoad, run_clients
from bench.sections import write_marked_section
from bench.servers import BENCH, Server

BEGIN = "<!-- llm-serving-benchmark:begin -->"
END = "<!-- llm-serving-benchmark:end -->"
SYSTEMS = ("shoal", "vllm", "transformers", "in-process")
LABELS = {"shoal": "shoal (`shoal serve`, OpenAI API)",
          "vllm": "vLLM CPU 0.32 (OpenAI server)",
          "transformers": "`transformers serve --continuous-batching`",
          "in-process": "shoal's Executor in-process (no HTTP)"}
PROMPT_WORDS = 24


@dataclass
class Row:
    system: str
    clients: int
    result: dict[str, float]


def build_checkpoint(path: pathlib.Path) -> None:
    """The issue's tiny Llama with a word-level tokenizer of exactly 2,048 tokens; the
    ``</s>`` row of ``lm_head`` zeroed (its logit is 0, far below the random rows' maximum)."""
    import torch
    from safetensors.torch import load_file, save_file

    from shoal.llm.tiny_checkpoint import EOS_ID, TinyLlamaSpec, build_tiny_llama

    build_tiny_llama(path, TinyLlamaSpec(
        vocab_size=2048, hidden_size=256, intermediate_size=688, num_layers=4, num_heads=8,
        num_kv_heads=4, max_position_embeddings=2048, seed=0, tokenizer="word_level"))
    weights_file = path / "model.safetensors"
    weights = load_file(weights_file)
    weights["lm_head.weight"][EOS_ID] = torch.zeros_like(weights["lm_head.weight"][EOS_ID])
    save_file(weights, weights_file, metadata={"format": "pt"})


def client_prompts(clients: int, per_client: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[" ".join(f"w{rng.randrange(3, 2048)}" for _ in range(PROMPT_WORDS))
             for _ in range(per_client)] for _ in range(clients)]


def check_lengths(traces: list[Trace], max_tokens: int, system: str) -> None:
    short = [t.tokens for t in traces if t.tokens != max_tokens]
    if short:
        raise RuntimeError(f"{system}: {len(short)} of {len(traces)} requests did not generate "
                           f"{max_tokens} tokens (got {short[:8]})")


def measure_server(server: Server, load: ChatLoad, clients: list[int], per_client: int,
                   seed: int, cell_seconds: float, notes: list[str]) -> list[Row]:
    """Rows of ``server`` at each client count; a count whose requests take longer than
    ``cell_seconds`` ends the server's measurement with a note (a peer too slow to finish)."""
    warm = client_prompts(2, 2, seed - 1)  # warm-up (first-call compilation, caches)
    try:
        asyncio.run(asyncio.wait_for(run_clients(server.port, load, warm), cell_seconds))
    except TimeoutError:
        notes.append(f"{server.name}: the warm-up (2 clients x 2 requests) did not finish "
                     f"within {cell_seconds:g} s; not measured")
        print(notes[-1], flush=True)
        return []
    rows = []
    for count in clients:
        plans = client_prompts(count, per_client, seed + count)
        try:
            traces = asyncio.run(asyncio.wait_for(run_clients(server.port, load, plans),
                                                  cell_seconds))
        except TimeoutError:
            notes.append(f"{server.name}: {count} clients did not finish their "
                         f"{count * per_client} requests within {cell_seconds:g} s; "
                         "larger counts not measured")
            print(notes[-1], flush=True)
            break
        check_lengths(traces, load.max_tokens, server.name)
        rows.append(Row(server.name, count, summarize(traces)))
        print(f"{server.name} c={count}: {rows[-1].result}", flush=True)
    return rows


def measure_in_process(checkpoint: pathlib.Path, clients: list[int], per_client: int,
                       max_tokens: int, seed: int) -> list[Row]:
    """The same prompts, rendered and tokenized as the llm backend does, into an Executor
    configured as the example's config.pbtxt (max batch = the largest client count)."""
    from shoal.llm import Executor, ExecutorConfig, KvCacheConfig
    from shoal.llm.checkpoint import load_tokenizer
    from shoal.workers.backends.llm.chat_template import load_chat_template

    template = load_chat_template(checkpoint)
    tokenizer = load_tokenizer(checkpoint)
    assert template is not None and tokenizer is not None

    def ids(prompt: str) -> list[int]:
        text = template.render([{"role": "user", "content": prompt}])
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    config = ExecutorConfig(max_batch_size=max(clients), max_num_tokens=4096,
                            kv_cache_config=KvCacheConfig(max_tokens=16384))
    rows = []
    with Executor(checkpoint, config) as executor:
        dispatcher = Dispatcher(executor)
        for prompts in client_prompts(2, 2, seed - 1):
            for prompt in prompts:
                dispatcher.submit(ids(prompt), max_tokens).wait()
        for count in clients:
            with dispatcher.lock:
                dispatcher.traces.clear()
            plans = [[ids(p) for p in prompts]
                     for prompts in client_prompts(count, per_client, seed + count)]

            def client(plan: list[list[int]]) -> None:
                for prompt_ids in plan:
                    dispatcher.submit(prompt_ids, max_tokens).wait()

            threads = [threading.Thread(target=client, args=(plan,)) for plan in plans]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            with dispatcher.lock:
                traces = list(dispatcher.traces.values())
            check_lengths(traces, max_tokens, "in-process")
            rows.append(Row("in-process", count, summarize(traces)))
            print(f"in-process c={count}: {rows[-1].result}", flush=True)
        dispatcher.stop = True
        dispatcher.thread.join()
    return rows


def run_system(system: str, args: argparse.Namespace, checkpoint: pathlib.Path,
               tmp: pathlib.Path, notes: list[str]) -> list[Row]:
    clients, per_client, max_tokens = args.clients, args.requests_per_client, args.max_tokens
    if system == "in-process":
        return measure_in_process(checkpoint, clients, per_client, max_tokens, args.seed)
    starters: dict[str, Callable[[], Server]] = {
        "shoal": lambda: start_shoal_llm(tmp / "shoal", checkpoint, max(clients),
                                         args.shoal_threads),
        "vllm": lambda: start_vllm(args.peers / "vllm", tmp / "vllm", checkpoint, max(clients),
                                   args.peer_threads),
        "transformers": lambda: start_transformers(args.peers / "hf", tmp / "transformers",
                                                   checkpoint, args.peer_threads),
    }
    venv = {"vllm": args.peers / "vllm", "transformers": args.peers / "hf"}.get(system)
    if venv is not None and not (venv / "bin" / "python").exists():
        notes.append(f"{system}: skipped, no virtualenv at {venv} "
                     f"(bash bench/llm_peers_install.sh)")
        return []
    # transformers serve names the model by the path it was started with; the others by name
    model = str(checkpoint) if system == "transformers" else MODEL_NAME
    extra = {"ignore_eos": True} if system == "vllm" else {}
    started = time.perf_counter()
    server = starters[system]()
    print(f"{system} ready in {time.perf_counter() - started:.0f} s", flush=True)
    try:
        return measure_server(server, ChatLoad(model, max_tokens, extra), clients, per_client,
                              args.seed, args.cell_seconds, notes)
    finally:
        server.stop()


def report(rows: list[Row], args: argparse.Namespace, notes: list[str]) -> str:
    import torch

    lines = [BEGIN, "## LLM serving: shoal vs vLLM CPU vs transformers serve", "",
             "Command (from the repository root): `make bench-llm` (= `.venv/bin/python -m "
             "bench.llm_serving_bench`); peers from `bash bench/llm_peers_install.sh`.", "",
             f"Machine: {os.cpu_count()} cores, {cpu_model()}; torch {torch.__version__}, "
             f"Python {platform.python_version()}. Torch / OpenMP threads: vLLM and "
             f"transformers {args.peer_threads}; shoal's llm worker "
             f"{args.shoal_threads or 'the backend default (CPUs - 1)'}; in-process Executor "
             f"{torch.get_num_threads()} (torch's default).",
             "",
             "Model: tiny random Llama (4 layers, hidden 256, SwiGLU 688, 8 / 4 heads, vocabulary "
             "2,048 word-level tokens, float32), the `</s>` row of lm_head zeroed so no request "
             "ends early. Load: C closed-loop clients, each sending "
             f"{args.requests_per_client} streaming chat completions in turn (temperature 0, "
             f"{args.max_tokens} tokens each, checked with usage.completion_tokens; distinct "
             f"{PROMPT_WORDS}-word prompts). tokens/s = generated tokens / (last token - first "
             "request sent); TTFT and ITL measured by the client per streamed text event.", "",
             "| system | clients | tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
             "|---|---|---|---|---|"]
    for row in rows:
        r = row.result
        lines.append(f"| {LABELS[row.system]} | {row.clients} | {r['tokens_per_s']:,.0f} | "
                     f"{r['ttft_p50']:.0f} / {r['ttft_p99']:.0f} | "
                     f"{r['itl_p50']:.1f} / {r['itl_p99']:.1f} |")
    lines += ["", *ratio_lines(rows), *[f"- {note}" for note in notes], END]
    return "\n".join(lines) + "\n"


def ratio_lines(rows: list[Row]) -> list[str]:
    """The issue's targets at the largest client count measured."""
    if not rows:
        return []
    top = max(row.clients for row in rows)
    at = {row.system: row.result for row in rows if row.clients == top}
    lines = [f"At {top} clients:"]
    shoal = at.get("shoal")
    if shoal is not None:
        for peer, goal in (("vllm", 1.5), ("transformers", 2.0)):
            if peer in at:
                ratio = shoal["tokens_per_s"] / at[peer]["tokens_per_s"]
                lines.append(f"- shoal / {peer} tokens/s = {ratio:.2f}x (target >= {goal}x)")
        if "in-process" in at:
            cost = 1 - shoal["tokens_per_s"] / at["in-process"]["tokens_per_s"]
            lines.append(f"- serving cost (1 - shoal / in-process tokens/s) = {cost:.0%} "
                         "(target <= 15%)")
        servers = {s: r["ttft_p99"] for s, r in at.items() if s != "in-process"}
        if len(servers) > 1:
            best = min(servers, key=lambda s: servers[s])
            lines.append(f"- lowest TTFT p99 of the servers: {best} ({servers[best]:.0f} ms)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--peers", type=pathlib.Path,
                        default=pathlib.Path(os.environ.get("LLM_PEERS", "/work/peers")),
                        help="folder of the peers' virtualenvs (vllm/, hf/)")
    parser.add_argument("--peer-threads", type=int, default=os.cpu_count() or 1,
                        help="OpenMP threads of vLLM and transformers serve")
    parser.add_argument("--cell-seconds", type=float, default=300.0,
                        help="longest a server may take for one client count")
    parser.add_argument("--shoal-threads", type=int, default=None,
                        help="torch threads of shoal's llm worker (default: the backend's)")
    parser.add_argument("--no-write", action="store_true",
                        help="print the section instead of writing bench/RESULTS.md")
    parser.add_argument("--note", action="append", default=[],
                        help="a line added under the table (e.g. the machine was shared)")
    args = parser.parse_args()
    rows: list[Row] = []
    notes: list[str] = list(args.note)
    with tempfile.TemporaryDirectory(prefix="llm-serving-bench-") as tmp_name:
        tmp = pathlib.Path(tmp_name)
        checkpoint = tmp / "checkpoint"
        build_checkpoint(checkpoint)
        for system in args.systems:
            rows += run_system(system, args, checkpoint, tmp, notes)
    rows.sort(key=lambda row: (row.clients, SYSTEMS.index(row.system)))
    section = report(rows, args, notes)
    print(section)
    if not args.no_write:
        write_marked_section(BENCH / "RESULTS.md", BEGIN, END, section)
        print("wrote bench/RESULTS.md")


if __name__ == "__main__":
    main()
