"""req/s and p99 against concurrency, one line per server and transport, as a PNG (matplotlib,
drawn off-screen)."""

from __future__ import annotations

import pathlib
from typing import Any

SERIES = (("shoal", "json", "shoal JSON"), ("shoal", "binary", "shoal binary"),
          ("shoal", "grpc", "shoal gRPC"), ("mlserver", "json", "MLServer JSON"),
          ("mlserver", "grpc", "MLServer gRPC"))


def draw(cells: dict[str, dict[str, dict[str, Any]]], concurrency: tuple[int, ...],
         title: str, path: pathlib.Path) -> pathlib.Path:
    """``cells[server]["<transport>/c<C>"]`` (bench/loadgen.py figures) -> ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, p99) = plt.subplots(1, 2, figsize=(11, 4.2))
    for server, transport, label in SERIES:
        points = [(c, cells.get(server, {}).get(f"{transport}/c{c}")) for c in concurrency]
        found = [(c, r) for c, r in points if r]
        if not found:
            continue
        style = "-" if server == "shoal" else "--"
        xs = [c for c, _ in found]
        rate.plot(xs, [r["requests_per_s"] for _, r in found], style, marker="o", label=label)
        p99.plot(xs, [r["p99_ms"] for _, r in found], style, marker="o", label=label)
    for axis, ylabel in ((rate, "requests / s"), (p99, "p99 latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(list(concurrency), [str(c) for c in concurrency])
        axis.set_xlabel("concurrent clients (closed loop)")
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
    p99.set_yscale("log")
    rate.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
