"""Round trip of FP32 tensors through CUDA shared memory, against one device-to-device copy of
the same bytes (the limit). Needs a CUDA device and the ``cuda-python`` package (tritonclient's
``cuda_shared_memory`` utilities use it). From the repository root:

    .venv/bin/python -m bench.cuda_shm_bench [--sizes 1,16,64]

Starts its own server (``--allow-client-shm=true``) over a temporary repository with one
TorchScript model on ``KIND_GPU`` (``y = x * 1``: it reads its input in place from the client's
allocation; its output is copied device to device into the client's output allocation). Columns
(median ms, calls one at a time):

- D2D copy: ``torch`` copy of the tensor between two device buffers, synchronized.
- CUDA shm round trip: the client's tensor copied into its registered input allocation (device to
  device), infer over HTTP with the input and output named by region; the output is then in the
  client's output allocation.
- infer only: the same without the client's copy in.

Prints a Markdown table to paste into bench/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import numpy as np

from bench import servers
from bench.shm_bench import timed

CONFIG = """
name: "scale_gpu"
platform: "pytorch_libtorch"
max_batch_size: 0
input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }]
instance_group [{ kind: KIND_GPU count: 1 gpus: [ 0 ] }]
"""


def write_repository(root: pathlib.Path) -> pathlib.Path:
    import torch

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1.0

    model = root / "repo" / "scale_gpu"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    torch.jit.script(Scale()).save(str(model / "1" / "model.pt"))
    return root / "repo"


@contextlib.contextmanager
def shoal_server(root: pathlib.Path) -> Iterator[int]:
    repo = write_repository(root)
    http, grpc, metrics = servers.free_port(), servers.free_port(), servers.free_port()
    command = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}",
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               "--allow-client-shm=true"]
    with open(root / "shoal.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = servers.Server("shoal", http, process, root, root / "shoal.log")
    try:
        servers.wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", process)
        yield http
    finally:
        server.stop()


def measure(port: int, size_mb: int, repeat: int) -> dict[str, float]:
    import torch
    import tritonclient.http as httpclient
    import tritonclient.utils.cuda_shared_memory as cudashm

    count = size_mb * 2**18
    x = torch.randn(count, device="cuda:0")
    spare = torch.empty_like(x)

    def d2d() -> None:
        spare.copy_(x)
        torch.cuda.synchronize()

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=300)
    nbytes = count * 4
    regions = [cudashm.create_shared_memory_region(n, nbytes, 0)
               for n in ("bench-in", "bench-out")]
    try:
        for name, region in zip(("bench-in", "bench-out"), regions, strict=True):
            client.register_cuda_shared_memory(name, cudashm.get_raw_handle(region), 0, nbytes)
        inp = httpclient.InferInput("INPUT__0", [count], "FP32")
        inp.set_shared_memory("bench-in", nbytes)
        out = httpclient.InferRequestedOutput("OUTPUT__0")
        out.set_shared_memory("bench-out", nbytes)

        def infer() -> None:
            client.infer("scale_gpu", [inp], outputs=[out])

        def round_trip() -> None:
            cudashm.set_shared_memory_region_from_dlpack(regions[0], [x])
            infer()

        round_trip()
        got = cudashm.get_contents_as_numpy(regions[1], np.float32, [count])
        if not (got == x.cpu().numpy()).all():
            raise RuntimeError("CUDA shared-memory round trip returned wrong data")
        return {"d2d": timed(d2d, repeat * 3), "round_trip": timed(round_trip, repeat),
                "infer": timed(infer, repeat)}
    finally:
        client.unregister_cuda_shared_memory()
        for region in regions:
            cudashm.destroy_shared_memory_region(region)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,16,64", help="tensor sizes in MB")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="shoal-cuda-bench-") as tmp, \
            shoal_server(pathlib.Path(tmp)) as port:
        for size_mb in (int(s) for s in args.sizes.split(",")):
            row = measure(port, size_mb, 25 if size_mb <= 16 else 15)
            rows.append(f"| {size_mb} MB | {row['d2d']:.3f} | {row['round_trip']:.3f} | "
                        f"{row['round_trip'] / row['d2d']:.1f}x | {row['infer']:.3f} |")
            print(size_mb, "MB", row, flush=True)
    print("\n| size | D2D copy (limit) | CUDA shm round trip | x D2D | infer only |")
    print("|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
