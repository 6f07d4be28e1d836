"""The worker's own CPU per batch, model excluded: ``WorkerProc.execute`` + ``encode`` of the
BatchResult + release of its lease, in process (no broker, no sockets), on the realistic MLP
(bench/realistic.py, pytorch backend, one intra-op thread) with batches of ``--rows`` one-row
requests. For A/B of the worker's hot path against another source tree:

    .venv/bin/python -m bench.worker_batch_bench [--checkout DIR] [--rows 21] [--rounds 5]

Two input layouts in a stand-in frontend arena: ``adjacent`` (the requests' tensors back to back
in one segment, as JSON bodies often land: the backend joins them without a copy) and ``gapped``
(a gap before each tensor, as binary bodies with their JSON header: one copy into the
workspace), the latter with the output requested by name (as binary requests do). Each is run
once as is ("full") and once with the module's forward replaced by a cached answer
("overhead": what the worker adds to the model). Prints thread CPU microseconds per batch and per
request, the minimum over ``--rounds`` rounds of ``--iters`` batches (contention only adds).
``--checkout DIR``: import ``shoal`` from DIR (e.g. ``git archive`` of the base commit).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=21)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--overhead-only", action="store_true")
    args = parser.parse_args()
    if args.checkout is not None:
        sys.path.insert(0, str(args.checkout.resolve()))
    run(args)


def run(args: argparse.Namespace) -> None:
    import numpy as np
    import orjson
    import torch

    from bench import realistic
    from shoal.config.model_config import config_to_json, parse_config_text
    from shoal.messages import Batch, RequestedOutput, TensorRef, WorkerRequest, WorkerSpec, encode
    from shoal.settings import settings_from_flags
    from shoal.shm.arena import Arena
    from shoal.workers.proc import WorkerProc

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        realistic.shoal_model(tmp)
        config = parse_config_text(realistic.SHOAL_CONFIG, "bench")
        instance = uuid.uuid4().hex[:8]
        settings = settings_from_flags(model_repositories=[str(tmp)],
                                       instance_id=instance).for_workers()
        spec = WorkerSpec(
            identity="bench", model_name=realistic.NAME, model_version=1,
            model_dir=str(tmp / realistic.NAME), version_dir=str(tmp / realistic.NAME / "1"),
            backend="pytorch", config_json=orjson.dumps(config_to_json(config)).decode(),
            instance_name="bench_0", kind="KIND_CPU", device_id=0,
            broker_endpoint=f"ipc://{tmp}/nobody.sock", arena_prefix=f"/shoal-{instance}-w1-",
            settings_json=settings.to_json().decode(), intra_op_threads=1)
        proc = WorkerProc(spec, settings)
        frontend = Arena(f"/shoal-{instance}-fe1-", 1 << 24, 1 << 26)
        try:
            proc.load()
            gc.collect()
            gc.freeze()  # as run_worker does
            rng = np.random.default_rng(0)

            def batch(gapped: bool) -> Batch:
                requests = []
                for i in range(args.rows):
                    if gapped:
                        frontend.allocate(128)
                    slot = frontend.allocate(1024)
                    slot.view[:] = rng.standard_normal(256).astype("float32").tobytes()
                    ref = TensorRef("INPUT__0", "FP32", [1, 256], slot.region, slot.offset, 1024)
                    wanted = [RequestedOutput("OUTPUT__0")] if gapped else []
                    requests.append(WorkerRequest(i + 1, [ref], wanted))
                return Batch(1, requests)

            def cpu_us(message: Batch) -> float:
                start = time.thread_time_ns()
                for _ in range(args.iters):
                    result = proc.execute(message)
                    encode(result)
                    if result.lease is not None:
                        proc.outputs.release(result.lease.lease_id)
                return (time.thread_time_ns() - start) / args.iters / 1000

            backend: Any = proc.backend
            module = backend._module
            with torch.inference_mode():  # as the backend calls it (a call with autograd on
                cached = module(torch.zeros(args.rows, 256))  # would respecialize the module)
            print(f"rows {args.rows}, {args.rounds} rounds of {args.iters} batches, "
                  "thread CPU us (min of rounds)")
            for name, message in (("adjacent", batch(False)), ("gapped", batch(True))):
                cpu_us(message)  # warm up
                cells = []
                if not args.overhead_only:
                    full = min(cpu_us(message) for _ in range(args.rounds))
                    cells.append(f"full {full:7.1f}/batch {full / args.rows:6.2f}/request")
                backend._module = lambda *_: cached
                try:
                    over = min(cpu_us(message) for _ in range(args.rounds))
                finally:
                    backend._module = module
                cells.append(f"overhead {over:7.1f}/batch {over / args.rows:6.2f}/request")
                print(f"{name:9s} " + "  ".join(cells), flush=True)
        finally:
            proc.close()
            frontend.close()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
