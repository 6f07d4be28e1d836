"""bench/RESULTS.md: the serving benchmark's section (between markers; other sections of the
file, such as the LLM executor's, are kept as they are)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import subprocess
from typing import Any

BEGIN, END = "<!-- serving-benchmark:begin -->", "<!-- serving-benchmark:end -->"


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": str(os.cpu_count()), "cpu": model, "memory_gib": f"{mem:.0f}"}


def versions(args: argparse.Namespace) -> dict[str, str]:
    found = {name: importlib.metadata.version(name)
             for name in ("torch", "numpy", "pyzmq", "uvicorn", "starlette", "uvloop")}
    try:
        found["shoal"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, check=False
                                        ).stdout.strip() or "?"
    except OSError:
        found["shoal"] = "?"
    venv = pathlib.Path(args.mlserver_venv)
    if not args.skip_mlserver and (venv / "bin" / "python").exists():
        out = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import importlib.metadata as m;print(m.version('mlserver'),"
                              "m.version('uvloop'))"], capture_output=True, text=True,
                             check=False).stdout.split()
        if len(out) == 2:
            found["mlserver"], found["mlserver_uvloop"] = out
    return found


def _row(name: str, r: dict[str, Any] | None) -> str:
    if not r:
        return f"| {name} | – | – | – | – | – |"
    return (f"| {name} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {int(r['errors'])} |")


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if not a or not b or not b["requests_per_s"]:
        return "–"
    return f"{a['requests_per_s'] / b['requests_per_s']:.1f}×"


def _side_by_side(shoal: dict[str, Any], mls: dict[str, Any], transport: str, c: int) -> str:
    """One row of the realistic table: shoal, MLServer and the req/s ratio (binary: against
    MLServer's JSON, as its REST has no binary tensor extension)."""
    mine = shoal.get(f"{transport}/c{c}")
    peer_key = f"{'json' if transport == 'binary' else transport}/c{c}"
    peer = mls.get(peer_key)

    def figures(r: dict[str, Any] | None) -> str:
        if not r:
            return "– | – | –"
        return f"{r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.1f}"

    peer_text = ("(JSON above) | | " if transport == "binary" and peer else figures(peer))
    errors = int((mine or {}).get("errors", 0)) + int((peer or {}).get("errors", 0))
    label = {"json": "JSON", "binary": "binary", "grpc": "gRPC"}[transport]
    return (f"| {label} | {c} | {figures(mine)} | {peer_text} | {_ratio(mine, peer)} "
            f"| {errors} |")


def _saturation_lines(shoal: dict[str, Any]) -> list[str]:
    lines = []
    for key, r in shoal.items():
        if "mean_batch" in r:
            lines.append(f"- saturation ({key}): mean executed batch {r['mean_batch']:.1f} rows; "
                         f"the worker spends {r['execute_share']:.0%} of wall time in "
                         f"backend.execute ({r['worker_busy_share']:.0%} busy in all).")
    return lines


def _in_process_line(ip: dict[str, float]) -> str:
    return ", ".join(f"batch {b}: {ip[f'batch{b}_rows_per_s']:,.0f} rows/s "
                     f"({ip[f'batch{b}_call_ms']:.3f} ms/call)" for b in (1, 8, 32))


def realistic_lines(results: dict[str, Any]) -> list[str]:
    """The realistic model's part: table, limit, targets, saturation, the curves."""
    from bench.targets import realistic_targets

    real = results["realistic"]
    shoal, mls = real.get("shoal", {}), real.get("mlserver", {})
    lines = [
        "### Realistic model at defaults: TorchScript MLP 256→1024→1024→16", "",
        f"Built by the bench (`bench/realistic.py`, seed 0, no download). Dynamic batching "
        f"max_batch_size 32 with max_queue_delay_microseconds {real['delay_us']} for shoal, "
        f"adaptive batching max_batch_size 32 / max_batch_time {real['delay_us'] / 1e6} s for "
        "MLServer. Both servers at their defaults, no hand tuning: shoal's config names no "
        "INTRA_OP_THREAD_COUNT, so its thread policy decides (its log: "
        f"`{real.get('shoal_policy', '?')}`); "
        "MLServer serves it through `bench/mlserver/runtimes.py` `TorchScriptDefaultRuntime`, "
        "the runtime as a user would write it (`torch.jit.load`, no thread settings). "
        "MLServer's default thread behaviour: inference runs in one parallel worker process "
        "(`parallel_workers` 1) and MLServer sets no OMP/torch thread count, so torch there "
        f"runs {real.get('mlserver_torch_threads', '?')} intra-op threads (one per core). "
        + _loadgen_text(results.get("loadgen")), "",
        "| transport | clients | shoal req/s | p50 ms | p99 ms | MLServer req/s | p50 ms "
        "| p99 ms | shoal / MLServer | errors |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for transport in ("json", "binary", "grpc"):
        for c in real["concurrency"]:
            lines.append(_side_by_side(shoal, mls, transport, c))
    lines += ["", "In-process limit (the same model.pt, `torch.set_num_threads(1)`): "
              + _in_process_line(real["inprocess"]) + ".", "",
              "Targets (issue #16, ratios from this run):", ""]
    lines += [t.line() for t in realistic_targets(shoal, mls, real["inprocess"])]
    lines += _saturation_lines(shoal)
    lines += _python_loadgen_lines(real.get("python_loadgen"), shoal, mls)
    if real.get("curves"):
        lines += ["", f"![req/s and p99 against concurrency]({real['curves']})", "",
                  f"[`bench/{real['curves']}`]({real['curves']}): req/s and p99 against "
                  "concurrency for each server and transport (solid: shoal, dashed: MLServer)."]
    return lines


def _loadgen_text(tools: dict[str, str] | None) -> str:
    if not tools:
        return ("HTTP cells: bench/loadgen.py (HTTP/1.1 keep-alive, the same pre-encoded bytes "
                "for both); gRPC cells: bench/grpc_loadgen.py (`ModelInfer` with the tensor in "
                "raw_input_contents, as tritonclient sends it; the same bytes for both).")
    return (f"HTTP cells: wrk (`{tools['wrk']}`; HTTP/1.1 keep-alive, one connection per "
            "client, the same pre-encoded bytes for both); gRPC cells: h2load "
            f"(`{tools['h2load']}`; `ModelInfer` with the tensor in raw_input_contents, as "
            "tritonclient sends it, the same bytes for both, 64 streams per connection); "
            "through bench/native_loadgen.py. They cost ~11-17 µs of CPU per request on the "
            "cores the servers use, where the Python generators cost ~40 (HTTP) and ~160 µs "
            "(gRPC): the table after the targets gives the c=64 cells with those.")


def _python_loadgen_lines(cells: dict[str, dict[str, Any]] | None, shoal: dict[str, Any],
                          mls: dict[str, Any]) -> list[str]:
    """The c=64 cells once more with the Python generators, beside the compiled ones."""
    if not cells:
        return []
    lines = ["", "The same c=64 cells driven by the Python generators (bench/loadgen.py, "
             "bench/grpc_loadgen.py), measured right after the table above: the generator's "
             "own CPU is taken from the same 2 cores.", "",
             "| cell | generator | shoal req/s | p99 ms | MLServer req/s | p99 ms | "
             "shoal / MLServer |", "|---|---|---|---|---|---|---|"]
    for key in cells.get("shoal", {}):
        for generator, ours, theirs in (("wrk / h2load", shoal.get(key), mls.get(key)),
                                        ("Python", cells["shoal"].get(key),
                                         cells.get("mlserver", {}).get(key))):
            if ours is None:
                continue
            ratio = (f"{ours['requests_per_s'] / theirs['requests_per_s']:.1f}×"
                     if theirs and theirs["requests_per_s"] else "")
            lines.append(f"| {key} | {generator} | {ours['requests_per_s']:,.0f} | "
                         f"{ours['p99_ms']:.1f} | "
                         + (f"{theirs['requests_per_s']:,.0f} | {theirs['p99_ms']:.1f}"
                            if theirs else "| ") + f" | {ratio} |")
    return lines


def tiny_lines(results: dict[str, Any]) -> list[str]:
    shoal, mls = results.get("shoal", {}), results.get("mlserver", {})
    lines = ["", "### The tiny example MLP (256→64→16)", "",
             f"`examples/model_repository/mlp` (no thread setting: the thread policy gives it 1 "
             f"on 2 cores; MLServer's `TorchScriptRuntime` pins one thread), dynamic batching 32 "
             f"rows, delay {results['delay_us']} µs on both; the per-request cost of each server.",
             "",
             "| server / workload | req/s | p50 ms | p90 ms | p99 ms | errors |",
             "|---|---|---|---|---|---|"]
    for key in results.get("tiny_cells", []):
        lines.append(_row(f"shoal {key}", shoal.get(key)))
        if not key.startswith("binary"):
            lines.append(_row(f"MLServer {key}", mls.get(key)))
    lines.append(_row("shoal identity16 (python) c=1", shoal.get("identity/c1")))
    lines.append(_row("MLServer identity16 (python) c=1", mls.get("identity/c1")))
    two = results.get("http_workers_2", {})
    lines.append(_row("shoal --http-workers=2 JSON c=64", two.get("json/c64")))
    lines.append(_row("shoal --http-workers=2 binary c=64", two.get("binary/c64")))
    lines += ["", "In-process limit (`torch.set_num_threads(1)`): "
              + _in_process_line(results["inprocess"]) + "."]
    return lines


def render(results: dict[str, Any], command: str) -> str:
    m, v = results["machine"], results["versions"]
    load = results.get("load_average", [0.0, 0.0])
    lines = [BEGIN, "## Serving: shoal vs MLServer vs the in-process limit", "",
             f"Command (from the repository root): `{command}`", "",
             f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory_gib']} GiB; load average "
             f"{load[0]:.1f} at start, {load[1]:.1f} at end (above the core count the figures "
             "are indicative only). Versions: "
             + ", ".join(f"{k} {val}" for k, val in v.items()) + ".", "",
             f"Both servers run at once and each cell is measured on shoal then right after on "
             f"MLServer (the machine's speed drifts over minutes), {results['seconds']:.0f} s "
             "per cell, closed loop.", ""]
    if "realistic" in results:
        lines += realistic_lines(results)
    lines += tiny_lines(results)
    soak = results.get("soak")
    if soak:
        lines += ["", f"Soak: tiny MLP, binary c=64 for {results.get('soak_seconds', 60)} s, "
                  f"{soak['requests_per_s']:,.0f} req/s, {int(soak['errors'])} errors. RSS (MiB) "
                  "of every shoal process, start → end:", ""]
        for proc, (before, after) in soak["rss_mib"].items():
            lines.append(f"- `{proc}`: {before} → {after}")
    lines += ["", END]
    return "\n".join(lines)


def write_results(results: dict[str, Any], path: pathlib.Path, command: str, host: str) -> None:
    section = render(results, command)
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + section + tail
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)
