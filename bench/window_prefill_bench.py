"""Prefill attention of one long span under a sliding window: ``window.windowed_prefill_attention``
(tiles of W queries over their 2W - 1 keys, one shared [W, 2W - 1] mask) against one SDPA call
with the full [n, n] causal-and-window mask, and plain causal attention (no window) for scale.
Prints median milliseconds per call, the peak extra device memory of each, and the largest
difference between the two windowed results.

    python -m bench.window_prefill_bench --device cuda --dtype bfloat16 --length 16384
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shoal.llm.window import tile_mask, windowed_prefill_attention

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def timed(run: Callable[[], torch.Tensor], device: torch.device,
          repeats: int) -> tuple[float, float, torch.Tensor]:
    """Median ms per call and peak extra MiB (CUDA only, else 0) of ``run``; its last result."""
    out = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    peak = ((torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda"
            else 0.0)
    return statistics.median(times), peak, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    n, window = args.length, args.window
    q = torch.randn(1, args.heads, n, args.head_dim, dtype=dtype, device=device)
    k = torch.randn(1, args.kv_heads, n, args.head_dim, dtype=dtype, device=device)
    v = torch.randn(1, args.kv_heads, n, args.head_dim, dtype=dtype, device=device)
    scale = args.head_dim ** -0.5
    mask = tile_mask(window, dtype, device)

    def tiles() -> torch.Tensor:
        return windowed_prefill_attention(q, k, v, mask, scale, True)

    def full() -> torch.Tensor:
        positions = torch.arange(n, device=device)
        offset = positions[:, None] - positions[None, :]
        dense = torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(
            (offset < 0) | (offset >= window), float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale,
                                              enable_gqa=True)

    def causal() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=True)

    print(f"device {device} {dtype} n={n} W={window} H={args.heads} Hkv={args.kv_heads} "
          f"D={args.head_dim}")
    results = {}
    for name, run in (("tiles", tiles), ("full mask", full), ("causal, no window", causal)):
        ms, peak, out = timed(run, device, args.repeats)
        results[name] = out
        print(f"{name:18s} {ms:9.2f} ms  peak +{peak:8.1f} MiB")
    difference = (results["tiles"].float() - results["full mask"].float()).abs().max().item()
    print(f"max |tiles - full mask| = {difference:.3g}")


if __name__ == "__main__":
    main()
