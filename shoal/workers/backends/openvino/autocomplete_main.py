"""The throw-away interpreter of openvino auto-complete (see ``autocomplete``):
``python -m shoal.workers.backends.openvino.autocomplete_main <model path> <default max batch>``
reads the partial config as protobuf JSON on stdin, reads the model with OpenVINO and writes
the completed config as Triton /config JSON on stdout. On failure it writes one line naming
the problem on stderr and exits with status 1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from shoal.config.model_config import config_from_json, config_to_json
from shoal.errors import ShoalError
from shoal.workers.backends.openvino.autocomplete import ModelTensor, complete_config
from shoal.workers.backends.openvino.model_setup import port_info
from shoal.workers.backends.openvino.runtime import import_openvino, openvino_message


def model_tensors(ov: Any, ports: Any) -> list[ModelTensor]:
    tensors: list[ModelTensor] = []
    for port in ports:
        info = port_info(port)
        layout = ov.layout_helpers.get_layout(port)
        tensors.append(ModelTensor(info.name, info.datatype, info.dims,
                                   bool(layout.has_name("N"))))
    return tensors


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].lstrip("-").isdigit():
        sys.stderr.write("usage: python -m shoal.workers.backends.openvino.autocomplete_main "
                         "<model path> <default max batch size>\n")
        return 1
    path = args[0]
    try:
        partial = config_from_json(sys.stdin.read() or "{}")
        ov = import_openvino()
        try:
            model = ov.Core().read_model(path)
        except Exception as exc:
            _fail(f"cannot read the model: {openvino_message(exc, path)}")
            return 1
        completed = complete_config(partial, model_tensors(ov, model.inputs),
                                    model_tensors(ov, model.outputs), int(args[1]))
        sys.stdout.write(json.dumps(config_to_json(completed)) + "\n")
    except ShoalError as exc:
        _fail(exc.message)
        return 1
    except Exception as exc:
        _fail(f"{type(exc).__name__}: {openvino_message(exc, path)}")
        return 1
    return 0


def _fail(message: str) -> None:
    sys.stderr.write(message.replace("\n", " ") + "\n")


if __name__ == "__main__":
    sys.exit(main())
