"""The model repository both servers serve in the differential tests: python-backend models that
import only numpy and ``triton_python_backend_utils``, so the real tritonserver's stub (Debian's
Python 3.11 and numpy 1.24) and shoal's workers run the very same files.

Every model here exists to exercise one part of the surface; ``MODELS`` names them for the
cases (tests/conformance/cases.py)."""

from __future__ import annotations

import pathlib
import textwrap

# datatypes the python backend carries through numpy on both servers (BF16 has no numpy dtype)
IDENTITY_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                      "INT64", "FP16", "FP32", "FP64", "BYTES")


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            arr = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", arr)]))
        return out
"""

ADD_SUB = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return out
"""

# OUTPUT0 = INPUT0 + (INPUT1 if sent else 0); OUTPUT1 = 1 when INPUT1 was sent
OPTIONAL_INPUT = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1")
            total = a if b is None else a + b.as_numpy()
            sent = np.array([0 if b is None else 1], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", total.astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", sent)]))
        return out
"""

# SHAPE: the shape execute() saw (INT64); OUTPUT0: the input as it came
SHAPE_PROBE = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            arr = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", arr),
                pb_utils.Tensor("SHAPE", np.array(arr.shape, dtype=np.int64))]))
        return out
"""

ERROR_RESPONSE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[],
                                           error=pb_utils.TritonError("model says no"))
                for _ in requests]
"""

RAISES = """
class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("execute blew up")
"""

# decoupled: N responses counting down from IN-1 to 0, then the final flag alone
COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().reshape(-1)[0])
            if n < 0:
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("negative count")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([n - 1 - i], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# sequence batching: OUTPUT = running sum of INPUT in the sequence; CORRID echoed back
ACCUMULATOR = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        out = []
        for r in requests:
            start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy().reshape(-1)[0]
            end = pb_utils.get_input_tensor_by_name(r, "END").as_numpy().reshape(-1)[0]
            corrid = pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy()
            key = corrid.reshape(-1)[0].item()
            value = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            total = (0 if start else self.sums.get(key, 0)) + int(value.reshape(-1)[0])
            self.sums[key] = total
            if end:
                self.sums.pop(key, None)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.full(value.shape, total, dtype=np.int32)),
                pb_utils.Tensor("CORRID_SEEN", corrid)]))
        return out
"""

VERSIONED = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        out = []
        for r in requests:
            arr = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", arr * self.version)]))
        return out
"""

FAILS_TO_LOAD = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this model never loads")

    def execute(self, requests):
        return []
"""


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def _tensor(name: str, datatype: str, dims: str, extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {config_type(datatype)} dims: {dims} {extra}}}'


def python_model(repo: pathlib.Path, name: str, code: str, inputs: list[str],
                 outputs: list[str], max_batch_size: int = 0, extra: str = "",
                 versions: tuple[int, ...] = (1,)) -> None:
    _write(repo / name / "config.pbtxt", "\n".join([
        f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch_size}",
        "input [", ",\n".join(inputs), "]", "output [", ",\n".join(outputs), "]",
        "instance_group [{ kind: KIND_CPU count: 1 }]", textwrap.dedent(extra), ""]))
    for version in versions:
        _write(repo / name / str(version) / "model.py", code)


def build_repository(repo: pathlib.Path) -> pathlib.Path:
    """Write every model of the differential tests into ``repo``."""
    python_model(repo, "add_sub", ADD_SUB,
                 [_tensor("INPUT0", "FP32", "[ 4 ]"), _tensor("INPUT1", "FP32", "[ 4 ]")],
                 [_tensor("OUTPUT0", "FP32", "[ 4 ]"), _tensor("OUTPUT1", "FP32", "[ 4 ]")])
    for datatype in IDENTITY_DATATYPES:
        python_model(repo, f"identity_{datatype.lower()}", IDENTITY,
                     [_tensor("INPUT0", datatype, "[ -1 ]")],
                     [_tensor("OUTPUT0", datatype, "[ -1 ]")], max_batch_size=8)
    python_model(repo, "batched_identity", IDENTITY,
                 [_tensor("INPUT0", "FP32", "[ 4 ]")], [_tensor("OUTPUT0", "FP32", "[ 4 ]")],
                 max_batch_size=8,
                 extra="dynamic_batching { max_queue_delay_microseconds: 2000 }")
    python_model(repo, "nobatch_identity", IDENTITY,
                 [_tensor("INPUT0", "FP32", "[ -1, 3 ]")],
                 [_tensor("OUTPUT0", "FP32", "[ -1, 3 ]")])
    python_model(repo, "optional_input", OPTIONAL_INPUT,
                 [_tensor("INPUT0", "FP32", "[ 4 ]"),
                  _tensor("INPUT1", "FP32", "[ 4 ]", "optional: true ")],
                 [_tensor("OUTPUT0", "FP32", "[ 4 ]"), _tensor("OUTPUT1", "INT32", "[ 1 ]")])
    python_model(repo, "reshaped", SHAPE_PROBE,
                 [_tensor("INPUT0", "FP32", "[ 4 ]", "reshape: { shape: [ 2, 2 ] } ")],
                 [_tensor("OUTPUT0", "FP32", "[ 2, 2 ]"), _tensor("SHAPE", "INT64", "[ -1 ]")],
                 max_batch_size=8)
    python_model(repo, "error_response", ERROR_RESPONSE,
                 [_tensor("INPUT0", "FP32", "[ -1 ]")], [_tensor("OUTPUT0", "FP32", "[ -1 ]")])
    python_model(repo, "raises", RAISES,
                 [_tensor("INPUT0", "FP32", "[ -1 ]")], [_tensor("OUTPUT0", "FP32", "[ -1 ]")])
    # declares OUTPUT0 (FP32) and OUTPUT1 (FP16); the identity produces only OUTPUT0
    python_model(repo, "partial_outputs", IDENTITY,
                 [_tensor("INPUT0", "FP32", "[ -1 ]")],
                 [_tensor("OUTPUT0", "FP32", "[ -1 ]"), _tensor("OUTPUT1", "FP16", "[ -1 ]")])
    python_model(repo, "classify", IDENTITY,
                 [_tensor("INPUT0", "FP32", "[ 5 ]")], [_tensor("OUTPUT0", "FP32", "[ 5 ]")],
                 max_batch_size=8)
    python_model(repo, "countdown", COUNTDOWN,
                 [_tensor("IN", "INT32", "[ 1 ]")], [_tensor("OUT", "INT32", "[ 1 ]")],
                 extra="model_transaction_policy { decoupled: true }")
    python_model(
        repo, "accumulator", ACCUMULATOR,
        [_tensor("INPUT", "INT32", "[ 1 ]")],
        [_tensor("OUTPUT", "INT32", "[ 1 ]"), _tensor("CORRID_SEEN", "UINT64", "[ 1 ]")],
        max_batch_size=4,
        extra="""
        sequence_batching {
          max_sequence_idle_microseconds: 60000000
          control_input [
            { name: "START"
              control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
            { name: "END"
              control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
            { name: "READY"
              control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
            { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
          ]
        }""")
    python_model(repo, "versioned", VERSIONED,
                 [_tensor("INPUT0", "FP32", "[ -1 ]")], [_tensor("OUTPUT0", "FP32", "[ -1 ]")],
                 versions=(1, 2), extra="version_policy: { all { } }")
    _write(repo / "pipeline" / "config.pbtxt", """
        name: "pipeline"
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling {
          step [
            { model_name: "add_sub" model_version: -1
              input_map { key: "INPUT0" value: "A" }
              input_map { key: "INPUT1" value: "B" }
              output_map { key: "OUTPUT0" value: "SUM" } }
          ]
        }
        """)
    _write(repo / "pipeline" / "1" / ".keep", "")
    return repo


MODELS = ("add_sub", *(f"identity_{d.lower()}" for d in IDENTITY_DATATYPES), "batched_identity",
          "nobatch_identity", "optional_input", "reshaped", "error_response", "raises",
          "partial_outputs", "classify", "countdown", "accumulator", "versioned", "pipeline")
