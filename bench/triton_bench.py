"""shoal vs the real tritonserver 2.51 vs MLServer 1.7.1 on one python model, side by side:

    make bench-triton     # = .venv/bin/python -m bench.triton_bench

``identity16`` (the example python identity, FP32 [1, 16], no batching) is the one model all
three serve: shoal and tritonserver the very same ``model.py`` and ``config.pbtxt`` (the real
tritonserver here runs only the python backend, and its stub has no torch), MLServer its
equivalent runtime (bench/mlserver/runtimes.py IdentityRuntime). All at their defaults. Each
cell (JSON c = 1, 16, 64; binary c = 64; gRPC c = 64) runs on the three servers back to back
(all three up, the idle ones costing nothing), with wrk / h2load where installed (else the
Python generators, as bench/run.py). Writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import tempfile
import time

import numpy as np

from bench import grpc_loadgen, native_loadgen, servers, tritonserver
from bench.run import NATIVE, drive
from bench.sections import write_marked_section

MODEL = "identity16"
CELLS = (("json", 1), ("json", 16), ("json", 64), ("binary", 64), ("grpc", 64))
BEGIN = "<!-- triton-bench:begin -->"
END = "<!-- triton-bench:end -->"
RESULTS = pathlib.Path(__file__).resolve().parent / "RESULTS.md"


def request_bodies(out: pathlib.Path) -> dict[str, tuple[pathlib.Path, list[str]]]:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    (out / "identity.json").write_text(json.dumps({"inputs": [{
        "name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
        "data": x.reshape(-1).tolist()}]}))
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "OUTPUT0",
                                      "parameters": {"binary_data": True}}]}).encode()
    (out / "identity.bin").write_bytes(header + x.tobytes())
    return {"json": (out / "identity.json", []),
            "binary": (out / "identity.bin", [f"Inference-Header-Content-Length: {len(header)}"])}


def cell(server: servers.Server, encoding: str, concurrency: int, seconds: float,
         bodies: dict[str, tuple[pathlib.Path, list[str]]]) -> dict[str, float]:
    if encoding == "grpc":
        request = grpc_loadgen.infer_request(MODEL, "INPUT0",
                                             np.arange(16, dtype=np.float32).reshape(1, 16))
        if NATIVE["on"]:
            return native_loadgen.grpc_load(server.extra["grpc"], request, concurrency, seconds)
        return asyncio.run(grpc_loadgen.run(server.extra["grpc"], request, concurrency,
                                            seconds))
    return drive(server.port, MODEL, bodies[encoding], concurrency, seconds)


def render(results: dict[str, dict[str, dict[str, float]]], command: str, when: str) -> str:
    names = list(results)
    lines = [BEGIN, "## shoal vs the real tritonserver 2.51 vs MLServer: one python model", "",
             f"`{command}` ({when}; {'wrk / h2load' if NATIVE['on'] else 'Python generators'}). "
             "`identity16`: the example python identity, FP32 [1, 16], no batching; shoal and "
             "tritonserver serve the same files, MLServer its identity runtime; every server "
             "at its defaults; each cell runs on the three back to back.", "",
             "| cell | " + " | ".join(f"{n} req/s (p50 / p99 ms)" for n in names)
             + " | shoal / tritonserver |",
             "|---|" + "---|" * (len(names) + 1)]
    for encoding, concurrency in CELLS:
        key = f"{encoding} c={concurrency}"
        row = [key]
        for name in names:
            r = results[name].get(key)
            if r is None:
                row.append("-")
            elif not r["requests_per_s"] and r.get("errors"):
                row.append(f"every answer an error ({r['errors']:.0f})")  # e.g. MLServer binary
            else:
                row.append(f"{r['requests_per_s']:,.0f} ({r['p50_ms']:.2f} / {r['p99_ms']:.2f})"
                           + (f", {r['errors']:.0f} errors" if r.get("errors") else ""))
        shoal, triton = results["shoal"].get(key), results.get("tritonserver", {}).get(key)
        row.append(f"{shoal['requests_per_s'] / triton['requests_per_s']:.2f}x"
                   if shoal and triton else "-")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", END, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per cell and server")
    parser.add_argument("--mlserver-venv", default=str(pathlib.Path(__file__).parent
                                                        / ".venv-mlserver"))
    parser.add_argument("--no-mlserver", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    reason = tritonserver.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot run the real tritonserver: {reason}")
    with tempfile.TemporaryDirectory(prefix="shoal-triton-bench-") as tmp:
        root = pathlib.Path(tmp)
        repo = servers.identity_repository(root / "repo")
        bodies = request_bodies(root)
        segments = tritonserver.backend_segments()
        running: list[servers.Server] = []
        try:
            running.append(servers.launch_shoal(repo, _dir(root / "shoal"), [], MODEL))
            running.append(servers.start_tritonserver(repo, root / "triton", MODEL))
            if not args.no_mlserver:
                venv = servers.ensure_mlserver_venv(pathlib.Path(args.mlserver_venv))
                running.append(servers.start_mlserver(root / "mlserver", venv, 1000))
            results: dict[str, dict[str, dict[str, float]]] = {s.name: {} for s in running}
            for encoding, concurrency in CELLS:
                for server in running:
                    figures = cell(server, encoding, concurrency, args.seconds, bodies)
                    results[server.name][f"{encoding} c={concurrency}"] = figures
                    print(server.name, encoding, concurrency, json.dumps(figures), flush=True)
        finally:
            for server in running:
                server.stop()
            tritonserver.remove_backend_segments(segments)
    section = render(results, "make bench-triton", time.strftime("%Y-%m-%d %H:%M UTC",
                                                                 time.gmtime()))
    print(section)
    if not args.no_write:
        write_marked_section(RESULTS, BEGIN, END, section)


def _dir(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    main()

