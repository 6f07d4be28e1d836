"""Writes the python-backend stand-ins for the models Triton's client examples name.

The tritonclient example scripts expect models called ``simple``, ``simple_string``,
``simple_int8``, ``simple_identity``, ``simple_sequence``, ``simple_dyna_sequence`` and
``simple_string_dyna_sequence``; Triton ships them as TensorFlow models or custom backends.
These stand-ins have the same names, tensor names, datatypes and dims, and compute what the
example clients check (add/sub; identity; the sequence arithmetic the clients expect), with
numpy only, so both shoal and a python-backend-only tritonserver can serve them.

bench/triton_suites/run.py writes them into its work folder; by hand:
python bench/triton_suites/make_model_repository.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

ADD_SUB = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (strings parsed as integers)."""

    def initialize(self, args):
        self.strings = "{strings}" == "yes"

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if self.strings:
                ia, ib = a.astype(np.int64), b.astype(np.int64)
                out0 = np.array([str(v).encode() for v in (ia + ib).flat],
                                dtype=np.object_).reshape(a.shape)
                out1 = np.array([str(v).encode() for v in (ia - ib).flat],
                                dtype=np.object_).reshape(a.shape)
            else:
                out0, out1 = (a + b).astype(a.dtype), (a - b).astype(a.dtype)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", out0), pb_utils.Tensor("OUTPUT1", out1)]))
        return responses
'''

IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0."""

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''

# The arithmetic Triton's example sequence clients check:
#  simple_sequence, simple_dyna_sequence: OUTPUT = INPUT + START (per batch row); the dyna
#  variant adds the correlation id to the sequence's last request (END).
#  simple_string_dyna_sequence: an accumulator (START resets it to INPUT), plus the
#  correlation id (a decimal string) at END.
SEQUENCE = '''
import numpy as np
import triton_python_backend_utils as pb_utils

MODE = "{mode}"


def _flag(request, name, rows):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return np.zeros((rows, 1), dtype=np.int32)
    return tensor.as_numpy().reshape(rows, -1).astype(np.int32)


def _corrid(request):
    tensor = pb_utils.get_input_tensor_by_name(request, "CORRID")
    if tensor is not None:
        value = tensor.as_numpy().flatten()[0]
        return int(value.decode() if isinstance(value, bytes) else value)
    cid = request.correlation_id()
    return int(cid)


class TritonPythonModel:
    def initialize(self, args):
        self.acc = {{}}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            rows = value.shape[0]
            start = _flag(request, "START", rows)
            end = _flag(request, "END", rows)
            v = value.reshape(rows, -1).astype(np.int64)
            if MODE == "accumulate":
                key = request.correlation_id()
                previous = self.acc.get(key, np.zeros_like(v))
                out = np.where(start != 0, v, previous + v)
                self.acc[key] = out
            else:
                out = v + start
            if MODE in ("dyna", "accumulate") and end.any():
                out = out + np.where(end != 0, _corrid(request), 0)
                if MODE == "accumulate":
                    self.acc.pop(request.correlation_id(), None)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", out.astype(np.int32).reshape(value.shape))]))
        return responses
'''


def _io(kind: str, entries: list[tuple[str, str, str]]) -> str:
    body = ",\n".join(f'  {{ name: "{n}", data_type: {t}, dims: [ {d} ] }}'
                      for n, t, d in entries)
    return f"{kind} [\n{body}\n]\n"


def _control(name: str, kind: str, extra: str = "int32_false_true: [ 0, 1 ]") -> str:
    return (f'    {{ name: "{name}"\n      control [ {{ kind: {kind}\n'
            f"        {extra} }} ] }}")


def _sequence_config(name: str, controls: list[str], strategy: str, count: int) -> str:
    joined = ",\n".join(controls)
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            f"sequence_batching {{\n{strategy}  control_input [\n{joined}\n  ]\n}}\n"
            + _io("input", [("INPUT", "TYPE_INT32", "1")])
            + _io("output", [("OUTPUT", "TYPE_INT32", "1")])
            + f"instance_group [ {{ kind: KIND_CPU, count: {count} }} ]\n")


def _write(root: Path, name: str, config: str, model: str) -> None:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(model.lstrip())


def build(root: Path) -> None:
    for name, dtype, strings in (("simple", "TYPE_INT32", "no"),
                                 ("simple_int8", "TYPE_INT8", "no"),
                                 ("simple_string", "TYPE_STRING", "yes")):
        config = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
                  + _io("input", [("INPUT0", dtype, "16"), ("INPUT1", dtype, "16")])
                  + _io("output", [("OUTPUT0", dtype, "16"), ("OUTPUT1", dtype, "16")]))
        _write(root, name, config, ADD_SUB.format(strings=strings))
    _write(root, "simple_identity",
           'name: "simple_identity"\nbackend: "python"\nmax_batch_size: 8\n'
           + _io("input", [("INPUT0", "TYPE_STRING", "-1")])
           + _io("output", [("OUTPUT0", "TYPE_STRING", "-1")]), IDENTITY)
    start = _control("START", "CONTROL_SEQUENCE_START")
    end = _control("END", "CONTROL_SEQUENCE_END")
    ready = _control("READY", "CONTROL_SEQUENCE_READY")
    oldest = ("  max_sequence_idle_microseconds: 10000000\n"
              "  oldest { max_candidate_sequences: 1024, max_queue_delay_microseconds: 10000 }\n")
    _write(root, "simple_sequence",
           _sequence_config("simple_sequence", [start, ready], "", 1),
           SEQUENCE.format(mode="plain"))
    _write(root, "simple_dyna_sequence",
           _sequence_config("simple_dyna_sequence",
                            [start, end, ready,
                             _control("CORRID", "CONTROL_SEQUENCE_CORRID",
                                      "data_type: TYPE_UINT64")], oldest, 2),
           SEQUENCE.format(mode="dyna"))
    _write(root, "simple_string_dyna_sequence",
           _sequence_config("simple_string_dyna_sequence",
                            [start, end, ready,
                             _control("CORRID", "CONTROL_SEQUENCE_CORRID",
                                      "data_type: TYPE_STRING")], oldest, 2),
           SEQUENCE.format(mode="accumulate"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model_repository.py OUT_DIR")
    out = Path(sys.argv[1])
    build(out)
    print(f"wrote {out}")
