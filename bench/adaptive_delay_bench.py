"""The adaptive queue delay (issue #16 part 6) side by side with the fixed one, on one server.

Two copies of the example MLP (TorchScript 256->64->16, max_batch_size 32, 1 ms
max_queue_delay_microseconds): ``mlp`` at shoal's default (adaptive) and ``mlp_fixed`` with
``shoal_adaptive_queue_delay: "false"`` (waits the whole delay, as Triton). Closed-loop JSON load
(bench/loadgen.py) at each concurrency, the two models interleaved; the executed batch size is
the statistics' inference_count / execution_count over the run.

    .venv/bin/python -m bench.adaptive_delay_bench --seconds 20 --concurrency 1 64

Expect at c=1 the adaptive p50 to drop by about the delay, and at c=64 the same req/s and batch
size for both (the adaptive delay only skips waits that cannot bring a partner).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import tempfile
import urllib.request

from bench import loadgen
from bench.servers import ROOT, launch_shoal, wait_ready

OFF = '\nparameters { key: "shoal_adaptive_queue_delay" value { string_value: "false" } }\n'


def repository(workdir: pathlib.Path) -> pathlib.Path:
    repo = workdir / "repo"
    source = ROOT / "examples" / "model_repository" / "mlp"
    for name, extra in (("mlp", ""), ("mlp_fixed", OFF)):
        shutil.copytree(source, repo / name)
        config = (source / "config.pbtxt").read_text().replace('name: "mlp"', f'name: "{name}"')
        (repo / name / "config.pbtxt").write_text(config + extra)
    return repo


def counts(port: int, model: str) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def measure(port: int, model: str, body_file: pathlib.Path, concurrency: int,
            seconds: float) -> dict[str, float | str]:
    args = argparse.Namespace(host="127.0.0.1", port=port, path=f"/v2/models/{model}/infer",
                              body_file=str(body_file), header=[], concurrency=concurrency,
                              seconds=seconds)
    before = counts(port, model)
    result: dict[str, float | str] = dict(asyncio.run(loadgen.run(args)))
    inferences, executions = (a - b for a, b in zip(counts(port, model), before, strict=True))
    result["model"] = model
    result["mean_batch"] = inferences / executions if executions else 0.0
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=1, help="repeat the interleaved pair")
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="shoal-adaptive-"))
    body_file = workdir / "body.json"
    body_file.write_text(json.dumps({"inputs": [
        {"name": "INPUT__0", "shape": [1, 256], "datatype": "FP32", "data": [0.5] * 256}]}))
    server = launch_shoal(repository(workdir), workdir, [], "mlp_fixed")
    try:
        wait_ready(f"http://127.0.0.1:{server.port}/v2/models/mlp/ready", server.process)
        print(f"{'model':<10} {'c':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'batch':>6}")
        for _ in range(args.rounds):
            for concurrency in args.concurrency:
                for model in ("mlp", "mlp_fixed"):
                    r = measure(server.port, model, body_file, concurrency, args.seconds)
                    print(f"{model:<10} {concurrency:>4} {r['requests_per_s']:>9.0f} "
                          f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['mean_batch']:>6.1f}",
                          flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
