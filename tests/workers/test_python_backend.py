"""PythonBackend runs Triton python_backend models unchanged."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import numpy as np
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from shoal.workers.backends.python.backend import PythonBackend
from tests.workers.helpers import bytes_array, make_context, make_request, write

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# Triton's python_backend add_sub example, plus checks of the initialize() args and a marker
# file written by finalize().
ADD_SUB_MODEL = '''
import json
import os

import triton_python_backend_utils as pb_utils

EXPECTED_KEYS = {"model_config", "model_instance_kind", "model_instance_name",
                 "model_instance_device_id", "model_repository", "model_version", "model_name"}


class TritonPythonModel:
    def initialize(self, args):
        if set(args) != EXPECTED_KEYS:
            raise pb_utils.TritonModelException(f"unexpected args {sorted(args)}")
        if not all(isinstance(v, str) for v in args.values()):
            raise pb_utils.TritonModelException("args values must be strings")
        self.args = args
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0 = in_0.as_numpy() + in_1.as_numpy()
            out_1 = in_0.as_numpy() - in_1.as_numpy()
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1],
                parameters={"request_id": request.request_id()}))
        return responses

    def finalize(self):
        with open(os.path.join(self.args["model_repository"], "finalized"), "w") as f:
            f.write("yes")
'''


def load(tmp_path: pathlib.Path, model: str, config: str = ADD_SUB_CONFIG,
         name: str = "add_sub") -> PythonBackend:
    model_dir = tmp_path / name
    ctx = make_context(model_dir, config)
    write(model_dir / "1" / "model.py", model)
    backend = PythonBackend()
    backend.load(ctx)
    return backend


@pytest.fixture
def add_sub(tmp_path: pathlib.Path) -> Iterator[PythonBackend]:
    backend = load(tmp_path, ADD_SUB_MODEL)
    yield backend
    backend.unload()


def vectors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"INPUT0": rng.random(4, dtype=np.float32), "INPUT1": rng.random(4, dtype=np.float32)}


def ok(result: BackendResponse | Error) -> BackendResponse:
    assert isinstance(result, BackendResponse), result
    return result


def by_name(response: BackendResponse) -> dict[str, np.ndarray]:
    return {o.name: o.array for o in response.outputs}


def test_add_sub_runs_unchanged(add_sub: PythonBackend) -> None:
    inputs = [vectors(1), vectors(2)]
    results = add_sub.execute([make_request(i, x) for i, x in enumerate(inputs)])
    assert len(results) == 2
    for x, result in zip(inputs, results, strict=True):
        response = ok(result)
        outputs = by_name(response)
        np.testing.assert_allclose(outputs["OUTPUT0"], x["INPUT0"] + x["INPUT1"])
        np.testing.assert_allclose(outputs["OUTPUT1"], x["INPUT0"] - x["INPUT1"])
        assert {o.datatype for o in response.outputs} == {"FP32"}
    assert ok(results[1]).parameters == {"request_id": "req-1"}


def test_initialize_receives_triton_args(tmp_path: pathlib.Path, add_sub: PythonBackend) -> None:
    args = add_sub._model.args
    assert args["model_name"] == "add_sub"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == "add_sub_0_0"
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(tmp_path / "add_sub")
    assert json.loads(args["model_config"])["input"][0]["dims"] == [4]


def test_only_requested_outputs_are_returned(add_sub: PythonBackend) -> None:
    result = ok(add_sub.execute([make_request(0, vectors(3), outputs=("OUTPUT1",))])[0])
    assert [o.name for o in result.outputs] == ["OUTPUT1"]


def test_finalize_is_called_on_unload(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, ADD_SUB_MODEL)
    backend.unload()
    assert (tmp_path / "add_sub" / "finalized").read_text() == "yes"


BYTES_CONFIG = """
name: "upper"
backend: "python"
max_batch_size: 0
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] } ]
"""

BYTES_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.reshape(-1)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper)]))
        return responses
'''


def test_bytes_in_and_out(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, BYTES_MODEL, BYTES_CONFIG, "upper")
    text = bytes_array([b"abc", b"", b"xY\x00z"], (3,))
    response = ok(backend.execute([make_request(0, {"TEXT": text})])[0])
    (output,) = response.outputs
    assert output.datatype == "BYTES"
    assert output.array.tolist() == [b"ABC", b"", b"XY\x00Z"]


RAISING_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("the model broke")
'''


def test_model_exception_fails_every_request(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, RAISING_MODEL)
    results = backend.execute([make_request(i, vectors(i)) for i in range(3)])
    assert len(results) == 3
    for result in results:
        assert isinstance(result, Error)
        assert result.code == ErrorCode.INTERNAL
        assert "TritonModelException: the model broke" in result.message
        assert "add_sub_0_0" in result.message
        assert str(tmp_path) not in result.message


ERROR_RESPONSE_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] < 0:
                error = pb_utils.TritonError("INPUT0 must be positive",
                                             pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
'''


def test_response_with_triton_error_becomes_an_error_for_that_request(
        tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, ERROR_RESPONSE_MODEL)
    good = vectors(0)
    bad = {"INPUT0": np.full(4, -1, dtype=np.float32), "INPUT1": good["INPUT1"]}
    first, second = backend.execute([make_request(0, bad), make_request(1, good)])
    # the error is what the response carries (statistics count it a success, as Triton)
    assert first == Error(ErrorCode.INVALID_ARG, "INPUT0 must be positive", in_response=True)
    np.testing.assert_allclose(by_name(ok(second))["OUTPUT0"], good["INPUT0"] * 2)


ASYNC_MODEL = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.loops = []

    async def execute(self, requests):
        await asyncio.sleep(0)
        self.loops.append(asyncio.get_running_loop())
        same = np.array([len(set(map(id, self.loops))) == 1], dtype=np.bool_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", same)])
                for _ in requests]
'''


def test_async_execute_runs_to_completion_on_one_loop(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, ASYNC_MODEL)
    try:
        for i in range(3):
            response = ok(backend.execute([make_request(i, vectors(i))])[0])
            assert response.outputs[0].array.tolist() == [True]
            assert response.outputs[0].datatype == "BOOL"
    finally:
        backend.unload()


WRONG_COUNT_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([])]
'''


def test_wrong_number_of_responses_fails_the_batch(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, WRONG_COUNT_MODEL)
    results = backend.execute([make_request(i, vectors(i)) for i in range(2)])
    assert all(isinstance(r, Error) for r in results)
    assert "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:1" in \
        results[0].message  # type: ignore[union-attr]


SENDER_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def test_non_decoupled_model_may_answer_through_the_response_sender(
        tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, SENDER_MODEL)
    x = vectors(5)
    response = ok(backend.execute([make_request(0, x)])[0])
    np.testing.assert_allclose(by_name(response)["OUTPUT0"], x["INPUT0"] + 1)


IDENTITY_MODEL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def test_output_aliasing_an_input_is_handed_over_without_a_copy(tmp_path: pathlib.Path) -> None:
    """An identity model's output is the input's memory; the worker copies it into shared memory
    before the input is released, so the backend adds no copy of its own (bench: shm round trip)."""
    backend = load(tmp_path, IDENTITY_MODEL)
    x = vectors(6)
    output = ok(backend.execute([make_request(0, x)])[0]).outputs[0]
    np.testing.assert_array_equal(output.array, x["INPUT0"])


BF16_CONFIG = """
name: "bf16"
backend: "python"
input [ { name: "IN" data_type: TYPE_BF16 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_BF16 dims: [ 2 ] } ]
"""

BF16_MODEL = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = torch.utils.dlpack.from_dlpack(
                pb_utils.get_input_tensor_by_name(r, "IN").to_dlpack())
            out = pb_utils.Tensor.from_dlpack("OUT", (x * 2).contiguous())
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''


def test_bf16_travels_as_uint16_bit_patterns(tmp_path: pathlib.Path) -> None:
    import torch

    backend = load(tmp_path, BF16_MODEL, BF16_CONFIG, "bf16")
    values = torch.tensor([1.5, -3.0], dtype=torch.bfloat16)
    bits = values.view(torch.int16).numpy().view(np.uint16)
    request = make_request(0, {"IN": bits}, datatypes={"IN": "BF16"})
    output = ok(backend.execute([request])[0]).outputs[0]
    assert output.datatype == "BF16" and output.array.dtype == np.uint16
    doubled = torch.from_numpy(output.array.view(np.int16)).view(torch.bfloat16)
    assert doubled.tolist() == [3.0, -6.0]


def test_decoupled_models_are_refused_at_load(tmp_path: pathlib.Path) -> None:
    config = ADD_SUB_CONFIG + "model_transaction_policy { decoupled: true }\n"
    with pytest.raises(ShoalError) as info:
        load(tmp_path, ADD_SUB_MODEL, config)
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert "decoupled" in info.value.message


def test_initialize_exception_fails_the_load(tmp_path: pathlib.Path) -> None:
    model = "class TritonPythonModel:\n    def initialize(self, args):\n" \
            "        raise RuntimeError('cannot start')\n    def execute(self, r):\n" \
            "        return []\n"
    with pytest.raises(RuntimeError, match="cannot start"):
        load(tmp_path, model)


def test_missing_model_class_is_a_clear_load_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ShoalError, match="does not define class TritonPythonModel"):
        load(tmp_path, "x = 1\n")


def test_relative_and_sibling_imports_work(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "add_sub" / "1" / "helpers.py", "FACTOR = 3\n")
    model = '''
from .helpers import FACTOR
import helpers
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0",
                pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * FACTOR
                * (helpers.FACTOR // 3))]) for r in requests]
'''
    backend = load(tmp_path, model)
    x = vectors(7)
    np.testing.assert_allclose(ok(backend.execute([make_request(0, x)])[0]).outputs[0].array,
                               x["INPUT0"] * 3)


def test_is_ready_uses_the_model_hook(tmp_path: pathlib.Path) -> None:
    model = IDENTITY_MODEL + "\n    def is_ready(self):\n        return False\n"
    backend = load(tmp_path, model)
    assert backend.is_ready() is False
    assert load(tmp_path / "other", IDENTITY_MODEL).is_ready() is True


def test_an_execution_env_path_is_named_in_a_warning_and_the_model_still_loads(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    config = ADD_SUB_CONFIG + ('parameters { key: "EXECUTION_ENV_PATH" value: { string_value: '
                               '"$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')
    with caplog.at_level("WARNING"):
        backend = load(tmp_path, ADD_SUB_MODEL, config)
    try:
        assert any("EXECUTION_ENV_PATH" in r.getMessage() and "env.tar.gz" in r.getMessage()
                   for r in caplog.records)
        x = vectors(3)
        outputs = by_name(ok(backend.execute([make_request(0, x)])[0]))
        np.testing.assert_allclose(outputs["OUTPUT0"], x["INPUT0"] + x["INPUT1"])
    finally:
        backend.unload()
