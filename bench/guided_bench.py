"""Guided decoding's cost in the executor (in process: no HTTP, no broker).

1. The mask at a realistic vocabulary size: a synthetic 128,000-token byte-level vocabulary
   (the tiny tokenizer's byte alphabet plus random 2-8 byte tokens, seed 0). Reported: building
   the grammar compiler for it (done once when a model loads), compiling each guide type once
   (then cached), and ``GuidedDecoder.constrain`` for 8 sequences at their first token (what
   one iteration adds for 8 guided requests), median of ``--repeats``.
2. Whole requests on the example's tiny random Llama (byte-level BPE, vocabulary 2,048 at most,
   float32, CPU): 8 concurrent requests of ``--tokens`` tokens, free vs guided by the regex
   ``[a-z]{N}`` (which cannot end early), alternated ``--repeats`` times; median milliseconds
   per iteration (one token for each of the 8 sequences).

Run it on a quiet machine: the figures are a few milliseconds, and other processes competing for
the cores (or torch threads competing with them; ``--threads`` defaults to 1) swamp them.

    .venv/bin/python -m bench.guided_bench          # prints a markdown section
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from shoal.llm import Executor, ExecutorConfig, Request
from shoal.llm.checkpoint import load_tokenizer
from shoal.llm.guided import (
    GuidedDecodingBackend,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuideType,
)
from shoal.llm.guided.decoder import GuidedDecoder
from shoal.llm.sequence import RequestState
from shoal.llm.tiny_checkpoint import EOS_ID, TinyLlamaSpec, build_tiny_llama

SCHEMA = json.dumps({"type": "object", "properties": {
    "id": {"type": "integer"}, "name": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["id", "name", "tags"]})
GUIDES = [GuidedDecodingParams(GuideType.JSON_SCHEMA, SCHEMA),
          GuidedDecodingParams(GuideType.JSON),
          GuidedDecodingParams(GuideType.REGEX, r"[a-z]{3}-[0-9]{2}"),
          GuidedDecodingParams(GuideType.EBNF_GRAMMAR, 'root ::= "yes" | "no"')]
SEQUENCES = 8


def synthetic_config(tokenizer_json: str, alphabet: list[str], size: int) -> GuidedDecodingConfig:
    rng = random.Random(0)
    vocab = ["", "", "", *alphabet]
    seen = set(vocab)
    while len(vocab) < size:
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 8)))
        if token not in seen:
            seen.add(token)
            vocab.append(token)
    return GuidedDecodingConfig(GuidedDecodingBackend.XGRAMMAR, encoded_vocab=vocab,
                                tokenizer_str=tokenizer_json, stop_token_ids=[EOS_ID])


def mask_costs(checkpoint: Path, vocab_size: int, repeats: int) -> list[str]:
    tokenizer = load_tokenizer(checkpoint)
    assert tokenizer is not None
    alphabet = [t for t in tokenizer.get_vocab() if len(t) == 1]
    config = synthetic_config(tokenizer.to_str(), alphabet, vocab_size)
    started = time.perf_counter()
    decoder = GuidedDecoder(config, vocab_size)
    lines = [f"Grammar compiler for a {vocab_size:,}-token vocabulary: "
             f"{(time.perf_counter() - started) * 1000:,.0f} ms (once per model load).", "",
             "| guide type | compile (once) | constrain, 8 sequences |", "|---|---|---|"]
    logits = torch.randn(1, vocab_size)
    for params in GUIDES:
        started = time.perf_counter()
        decoder.grammars.get(params)
        compiled = (time.perf_counter() - started) * 1000
        states = [RequestState(i, Request([5], 8, end_id=EOS_ID, guided_decoding_params=params),
                               0.0) for i in range(SEQUENCES)]
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            for state in states:
                decoder.constrain(state, state.active, logits)
            times.append((time.perf_counter() - started) * 1000)
        lines.append(f"| {params.guide_type.value} | {compiled:,.1f} ms | "
                     f"{statistics.median(times):.2f} ms |")
    return lines


def iteration_costs(checkpoint: Path, tokens: int, repeats: int) -> list[str]:
    tokenizer = load_tokenizer(checkpoint)
    assert tokenizer is not None
    config = ExecutorConfig(
        guided_decoding_config=GuidedDecodingConfig.from_tokenizer(tokenizer, [EOS_ID]))
    prompt = tokenizer.encode("Hello world").ids
    guide = GuidedDecodingParams(GuideType.REGEX, f"[a-z]{{{tokens}}}")
    results: dict[str, list[float]] = {"free": [], "guided": []}
    with Executor(checkpoint, config) as executor:
        def per_iteration(params: GuidedDecodingParams | None) -> float:
            started = time.perf_counter()
            ids = executor.enqueue_requests([
                Request(prompt, tokens, end_id=EOS_ID if params else None,
                        guided_decoding_params=params) for _ in range(SEQUENCES)])
            for request_id in ids:
                while not any(r.result is not None and r.result.is_final
                              for r in executor.await_responses(request_id, timeout=120)):
                    pass
            return (time.perf_counter() - started) * 1000 / tokens

        per_iteration(None)
        per_iteration(guide)
        for _ in range(repeats):
            results["free"].append(per_iteration(None))
            results["guided"].append(per_iteration(guide))
    free, guided = (statistics.median(results[k]) for k in ("free", "guided"))
    return [f"Tiny Llama, {SEQUENCES} requests x {tokens} tokens: free {free:.2f} ms per "
            f"iteration, guided (regex) {guided:.2f} ms (+{guided - free:.2f} ms)."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-size", type=int, default=128_000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: stable figures on a busy machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as temp:
        checkpoint = Path(temp) / "llm"
        build_tiny_llama(checkpoint, TinyLlamaSpec(
            vocab_size=2048, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=8,
            num_kv_heads=4, max_position_embeddings=2048, tokenizer="byte_level"))
        lines = ["## Guided decoding (in process)", "",
                 *mask_costs(checkpoint, args.vocab_size, args.repeats), "",
                 *iteration_costs(checkpoint, args.tokens, args.repeats)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
