"""Loading the model file of a ``pytorch``-backend model into one callable, whatever its format.

Three formats, told apart by their content (not their name):

- **TorchScript** (``torch.jit.save``; Triton's ``model.pt``): ``torch.jit.load``. forward()'s
  argument names come from its TorchScript schema (``torchscript_io.forward_arguments``).
- **exported program** (``torch.export.save``; a ``.pt2`` zip archive without AOTInductor code):
  ``torch.export.load(path).module()``, moved to the instance's device. Argument names are the
  program's user inputs. ``batch_dims`` says, per argument, whether its dim 0 is symbolic (the
  program was exported with ``dynamic_shapes`` for it) — a batching model needs that.
- **AOTInductor package** (``torch._inductor.aoti_compile_and_package``; Triton's
  ``platform: "torch_aoti"`` with ``model.pt2``): ``torch._inductor.aoti_load_package``. Its
  argument names are not recorded in the package, so inputs map by ``<name>__<index>`` or config
  order; its dynamic dims are not readable either (``batch_dims`` is None).

``LoadedProgram.module`` takes positional tensors (or one dict for a TorchScript
``forward(Dict[str, Tensor])``) and returns a tensor or a tuple of them.
"""

from __future__ import annotations

import enum
import zipfile
from dataclasses import dataclass
from typing import Any

from shoal.errors import invalid_arg
from shoal.workers.backends.torchscript_io import forward_arguments

TORCHSCRIPT_FILENAME = "model.pt"
PT2_FILENAME = "model.pt2"
# Every file of an AOTInductor package lives under <archive>/data/aotinductor/.
_AOTI_MARKER = "/data/aotinductor/"


class ProgramFormat(enum.Enum):
    TORCHSCRIPT = "TorchScript"
    EXPORTED = "exported program"
    AOTI = "AOTInductor package"


@dataclass(frozen=True)
class LoadedProgram:
    module: Any
    format: ProgramFormat
    arg_names: list[str]  # forward()'s argument names, [] when unknown (AOTInductor)
    dict_input: bool  # TorchScript forward(self, inputs: Dict[str, Tensor])
    batch_dims: dict[str, bool] | None  # argument -> dim 0 is dynamic; None when unknown


def file_format(path: str) -> ProgramFormat:
    """The format of the model file at ``path`` (see the module docstring)."""
    if not zipfile.is_zipfile(path):
        return ProgramFormat.TORCHSCRIPT  # torch.jit.load gives the precise error
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if any(_AOTI_MARKER in f"/{name}" for name in names):
        return ProgramFormat.AOTI
    if any(name.endswith("/models/model.json") or name == "models/model.json" for name in names):
        return ProgramFormat.EXPORTED
    return ProgramFormat.TORCHSCRIPT


def load_program(torch: Any, path: str, device: Any) -> LoadedProgram:
    """The model at ``path`` on ``device`` (a ``torch.device``). Raises what the loader raises."""
    kind = file_format(path)
    if kind is ProgramFormat.EXPORTED:
        return _load_exported(torch, path, device)
    if kind is ProgramFormat.AOTI:
        return _load_aoti(torch, path, device)
    load_torchscript: Any = torch.jit.load
    module = load_torchscript(path, map_location=device)
    module.eval()
    names, is_dict = forward_arguments(module)
    return LoadedProgram(module, kind, names, is_dict, None)


def _load_exported(torch: Any, path: str, device: Any) -> LoadedProgram:
    program = torch.export.load(path)
    names = [str(name) for name in program.graph_signature.user_inputs]
    batch_dims: dict[str, bool] = {}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            value = node.meta.get("val")
            shape = getattr(value, "shape", None)
            if shape is None:
                raise invalid_arg(f"exported program input '{node.name}' is not a tensor; only "
                                  "tensor inputs are supported")
            batch_dims[node.name] = len(shape) > 0 and isinstance(shape[0], torch.SymInt)
    module = program.module().to(device)
    return LoadedProgram(module, ProgramFormat.EXPORTED, names, False, batch_dims)


def _load_aoti(torch: Any, path: str, device: Any) -> LoadedProgram:
    index = device.index if device.type != "cpu" and device.index is not None else -1
    module = torch._inductor.aoti_load_package(path, device_index=index)
    return LoadedProgram(module, ProgramFormat.AOTI, [], False, None)


def static_batch_inputs(program: LoadedProgram, batched_args: list[str]) -> list[str]:
    """The arguments among ``batched_args`` whose dim 0 the program fixed at export time."""
    if program.batch_dims is None:
        return []
    return [name for name in batched_args if not program.batch_dims.get(name, True)]
