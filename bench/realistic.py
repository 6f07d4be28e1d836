"""The realistic model of the serving benchmark (issue #16 part 2): a TorchScript MLP
256 -> 1024 -> 1024 -> 16 (~0.15 ms a call at batch 1 on one thread), built here from a fixed
seed (no download), served at both servers' defaults with dynamic / adaptive batching up to 32
rows and a 1 ms delay."""

from __future__ import annotations

import pathlib

import torch

NAME = "mlp_large"
DELAY_US = 1000  # shoal max_queue_delay_microseconds; MLServer max_batch_time 0.001 s
MAX_BATCH = 32

# At shoal's defaults: no INTRA_OP_THREAD_COUNT (the thread policy decides), one CPU instance
# as the example MLP has.
SHOAL_CONFIG = f"""name: "{NAME}"
platform: "pytorch_libtorch"
max_batch_size: {MAX_BATCH}
input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 256 ] }}]
output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 16 ] }}]
dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}
instance_group [{{ kind: KIND_CPU count: 1 }}]
"""


def build(path: pathlib.Path) -> pathlib.Path:
    """Write the traced MLP to ``path`` (seed 0) and return it."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 16)).eval()
    with torch.no_grad():
        traced = torch.jit.trace(module, torch.zeros(1, 256))
    path.parent.mkdir(parents=True, exist_ok=True)
    traced.save(str(path))
    return path


def shoal_model(repo: pathlib.Path) -> None:
    """``repo/mlp_large``: the model and its config."""
    (repo / NAME).mkdir(parents=True, exist_ok=True)
    build(repo / NAME / "1" / "model.pt")
    (repo / NAME / "config.pbtxt").write_text(SHOAL_CONFIG)


def mlserver_settings(model_path: pathlib.Path) -> dict[str, object]:
    """model-settings.json: the runtime a user would write (no thread pinning, see
    bench/mlserver/runtimes.py), adaptive batching 32 rows / 1 ms."""
    return {"name": NAME, "implementation": "runtimes.TorchScriptDefaultRuntime",
            "max_batch_size": MAX_BATCH, "max_batch_time": DELAY_US / 1e6,
            "parameters": {"uri": str(model_path)}}
