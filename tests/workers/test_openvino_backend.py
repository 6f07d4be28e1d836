"""OpenvinoBackend in process: outputs equal OpenVINO called directly, batching (dynamic, and
static with padding), data type conversion, zero-copy inputs and lent outputs, the config's
parameters, and load errors naming the problem."""

from __future__ import annotations

import dataclasses
import mmap
import pathlib
from typing import Any

import numpy as np
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from tests.workers.helpers import make_context, make_request

ov = pytest.importorskip("openvino")
models = pytest.importorskip("tests.openvino_models")

from shoal.workers.backends.openvino.backend import OpenvinoBackend  # noqa: E402
from shoal.workers.backends.openvino.parameters import openvino_options  # noqa: E402

ADD_SUB = """
name: "add_sub"
backend: "openvino"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def loaded(tmp_path: pathlib.Path, model: Any, pbtxt: str, **context: Any) -> OpenvinoBackend:
    ctx = make_context(tmp_path / "m", pbtxt)
    if context:
        ctx = dataclasses.replace(ctx, **context)
    models.write_ir(pathlib.Path(ctx.version_dir), model)
    backend = OpenvinoBackend()
    backend.load(ctx)
    return backend


def outputs(answer: BackendResponse | Error | None) -> dict[str, Any]:
    assert isinstance(answer, BackendResponse), answer
    return {t.name: t.array for t in answer.outputs}


def test_batched_requests_equal_openvino_in_process(tmp_path: pathlib.Path) -> None:
    config = ADD_SUB.replace('"add_sub"', '"mlp"').replace("INPUT0", "x").replace(
        ',\n        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }', "").replace(
        '{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },\n         '
        '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }',
        '{ name: "y" data_type: TYPE_FP32 dims: [ 3 ] }')
    backend = loaded(tmp_path, models.mlp(), config)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    requests = [make_request(i, {"x": a}, batch_size=len(a)) for i, a in enumerate(arrays)]
    answers = backend.execute(requests)
    for a, answer in zip(arrays, answers, strict=True):
        np.testing.assert_allclose(outputs(answer)["y"], models.reference(models.mlp(),
                                                                          {"x": a})[0],
                                   rtol=1e-6, atol=1e-6)


def test_two_outputs_split_back_per_request(tmp_path: pathlib.Path) -> None:
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), np.float32)
    answers = backend.execute([make_request(0, {"INPUT0": a[:1], "INPUT1": b[:1]}),
                               make_request(1, {"INPUT0": a[1:], "INPUT1": b[1:]},
                                            batch_size=2)])
    np.testing.assert_array_equal(outputs(answers[0])["OUTPUT0"], a[:1] + 1)
    np.testing.assert_array_equal(outputs(answers[1])["OUTPUT1"], a[1:] - 1)


def test_read_only_shared_memory_inputs_are_read_in_place(tmp_path: pathlib.Path) -> None:
    """Inputs mapped read-only (as the frontend arena is in a worker) and lying back to back
    reach OpenVINO as one tensor over that very memory: no copy."""
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB)
    page = mmap.mmap(-1, 4096)
    source = np.frombuffer(page, np.float32, count=24).reshape(6, 4)
    source[:] = np.arange(24, dtype=np.float32).reshape(6, 4)
    readonly = mmap.mmap(-1, 4096, prot=mmap.PROT_READ)  # zero pages, mapped read-only
    zeros = np.frombuffer(readonly, np.float32, count=24).reshape(6, 4)
    assert not zeros.flags.writeable
    answers = backend.execute([
        make_request(0, {"INPUT0": source[:2], "INPUT1": zeros[:2]}, batch_size=2),
        make_request(1, {"INPUT0": source[2:], "INPUT1": zeros[2:]}, batch_size=4)])
    runner = backend._runner
    assert runner is not None
    assert runner.bound_inputs["INPUT0"] == source.ctypes.data
    assert runner.bound_inputs["INPUT1"] == zeros.ctypes.data
    np.testing.assert_array_equal(outputs(answers[1])["OUTPUT0"], source[2:])
    backend.unload()
    del answers, runner, zeros, source
    readonly.close()
    page.close()


def test_fixed_shape_outputs_are_written_into_lent_arena_slots(
        tmp_path: pathlib.Path, shm_prefix: str) -> None:
    """With the worker lending arena slots, OpenVINO writes each fixed-shape output straight
    into one: every request's output lies inside a lent slot, so the worker never copies it."""
    from shoal.shm.arena import Arena
    from shoal.workers.output_lending import OutputLender

    arena = Arena(shm_prefix + "w-", 1 << 16, 1 << 20)
    lender = OutputLender(arena)
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB, lend_output=lender.lend)
    lender.open()
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    answers = backend.execute([make_request(0, {"INPUT0": data[:1], "INPUT1": data[:1]}),
                               make_request(1, {"INPUT0": data[1:], "INPUT1": data[1:]},
                                            batch_size=2)])
    assert lender.lent_count == 2  # one slot per output for the whole batch
    for answer, rows in zip(answers, (data[:1], data[1:]), strict=True):
        got = outputs(answer)
        np.testing.assert_array_equal(got["OUTPUT0"], rows * 2)
        for array in got.values():
            assert lender.locate(array, array.nbytes) is not None, "output not in a lent slot"
    backend.unload()
    del answers, got, array
    lender.close()
    arena.close()


def test_unbatched_static_model_runs_each_request_alone(tmp_path: pathlib.Path) -> None:
    config = """
    name: "fixed"
    backend: "openvino"
    input [ { name: "x" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]
    output [ { name: "y" data_type: TYPE_INT32 dims: [ 3 ] } ]
    """
    backend = loaded(tmp_path, models.fixed_sum(), config)
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    answers = backend.execute([make_request(0, {"x": a}), make_request(1, {"x": a * 2})])
    assert outputs(answers[0])["y"].tolist() == [3, 5, 7]
    assert outputs(answers[1])["y"].tolist() == [6, 10, 14]


def test_config_data_type_other_than_the_models_is_converted(tmp_path: pathlib.Path) -> None:
    """The config says FP16 for an FP32 model: OpenVINO converts on the way in and out."""
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB.replace("TYPE_FP32", "TYPE_FP16"))
    half = np.array([[1.5, 2, -3, 0.25]], np.float16)
    got = outputs(backend.execute([make_request(0, {"INPUT0": half, "INPUT1": half})])[0])
    assert got["OUTPUT0"].dtype == np.float16
    np.testing.assert_array_equal(got["OUTPUT0"], half * 2)


def test_static_batch_pads_smaller_batches_with_batch_padding(tmp_path: pathlib.Path) -> None:
    static = ADD_SUB.replace("max_batch_size: 8", "max_batch_size: 4") + \
        'parameters { key: "SKIP_OV_DYNAMIC_BATCHSIZE" value { string_value: "YES" } }\n'
    refusing = loaded(tmp_path / "a", models.add_sub(), static)
    one = np.ones((1, 4), np.float32)
    answer = refusing.execute([make_request(0, {"INPUT0": one, "INPUT1": one})])[0]
    assert isinstance(answer, Error)
    assert "expected requests with batch size '4', got '1'" in answer.message
    assert "ENABLE_BATCH_PADDING" in answer.message
    padding = loaded(tmp_path / "b", models.add_sub(), static +
                     'parameters { key: "ENABLE_BATCH_PADDING" value { string_value: "yes" } }\n')
    got = outputs(padding.execute([make_request(0, {"INPUT0": one * 3, "INPUT1": one})])[0])
    assert got["OUTPUT0"].shape == (1, 4)
    np.testing.assert_array_equal(got["OUTPUT1"], one * 2)


def test_parameters_become_compile_properties() -> None:
    from google.protobuf import text_format
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    def options(params: dict[str, str]) -> Any:
        text = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                       for k, v in params.items())
        return openvino_options(text_format.Parse(text, ModelConfig()))

    got = options({"PERFORMANCE_HINT": "throughput", "NUM_STREAMS": "2",
                   "INFERENCE_NUM_THREADS": "3", "RESHAPE_IO_LAYERS": "YES"})
    assert got.compile_properties == {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": 2,
                                      "INFERENCE_NUM_THREADS": 3}
    assert got.reshape_io_layers and not got.skip_dynamic_batch_size
    assert options({"NUM_STREAMS": "auto"}).compile_properties["NUM_STREAMS"] == "AUTO"
    assert options({}).compile_properties["INFERENCE_NUM_THREADS"] >= 1  # the CPU share
    for bad, message in ((("PERFORMANCE_HINT", "fast"), "LATENCY/THROUGHPUT"),
                         (("NUM_STREAMS", "many"), "AUTO/NUMA/<int_value>"),
                         (("INFERENCE_NUM_THREADS", "-1"), "non-negative number")):
        with pytest.raises(ShoalError, match=message):
            options(dict([bad]))


def test_parameters_reach_the_compiled_model(tmp_path: pathlib.Path) -> None:
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB +
                     'parameters { key: "INFERENCE_NUM_THREADS" value { string_value: "1" } }\n'
                     'parameters { key: "COMPILATION_NUM_THREADS" value { string_value: "1" } }\n'
                     'parameters { key: "NUM_STREAMS" value { string_value: "1" } }\n'
                     'parameters { key: "PERFORMANCE_HINT" value { string_value: "latency" } }\n')
    assert backend.compiled_properties == {"NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "1",
                                           "PERFORMANCE_HINT": "LATENCY"}
    one = np.ones((1, 4), np.float32)
    assert outputs(backend.execute([make_request(0, {"INPUT0": one, "INPUT1": one})])[0])[
        "OUTPUT0"].tolist() == [[2, 2, 2, 2]]


@pytest.mark.parametrize(("edit", "message"), [
    (('{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]', "]"),
     "configuration expects 1 inputs, model provides 2"),
    (('name: "INPUT1"', 'name: "NOPE"'), "unexpected inference input 'NOPE'"),
    (('name: "OUTPUT1"', 'name: "NOPE"'), "unexpected inference output 'NOPE'"),
    (('name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ]',
      'name: "INPUT1" data_type: TYPE_FP32 dims: [ 5 ]'), "tensor 'INPUT1'"),
    (('TYPE_FP32', 'TYPE_STRING'), "unsupported datatype TYPE_STRING"),
])
def test_config_that_does_not_match_the_model_fails_the_load(
        tmp_path: pathlib.Path, edit: tuple[str, str], message: str) -> None:
    pbtxt = ADD_SUB.replace(*edit, 1)
    if edit[0] == '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]':
        pbtxt = pbtxt.replace('dims: [ 4 ] },\n        ]', "dims: [ 4 ] } ]")
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, models.add_sub(), pbtxt)
    assert message in failure.value.message


def test_corrupt_model_file_fails_with_a_clear_error(tmp_path: pathlib.Path) -> None:
    ctx = make_context(tmp_path / "m", ADD_SUB)
    (pathlib.Path(ctx.version_dir) / "model.xml").write_text("not a real model")
    with pytest.raises(ShoalError) as failure:
        OpenvinoBackend().load(ctx)
    message = failure.value.message
    assert "cannot read OpenVINO model 'model.xml'" in message
    assert str(tmp_path) not in message


def test_truncated_weights_fail_with_a_clear_error(tmp_path: pathlib.Path) -> None:
    ctx = make_context(tmp_path / "m", ADD_SUB.replace("add_sub", "mlp"))
    models.write_ir(pathlib.Path(ctx.version_dir), models.mlp())
    (pathlib.Path(ctx.version_dir) / "model.bin").write_bytes(b"xx")
    with pytest.raises(ShoalError) as failure:
        OpenvinoBackend().load(ctx)
    assert "Incorrect weights in bin file" in failure.value.message


def test_missing_model_file_names_it(tmp_path: pathlib.Path) -> None:
    ctx = make_context(tmp_path / "m", ADD_SUB)
    with pytest.raises(ShoalError) as failure:
        OpenvinoBackend().load(ctx)
    assert failure.value.code == ErrorCode.UNAVAILABLE
    assert "unable to find '1/model.xml' for model 'add_sub'" in failure.value.message


def test_onnx_model_is_read_through_openvino(tmp_path: pathlib.Path) -> None:
    onnx_models = pytest.importorskip("tests.onnx_models")
    ctx = make_context(tmp_path / "m", ADD_SUB + 'default_model_filename: "model.onnx"\n')
    (pathlib.Path(ctx.version_dir) / "model.onnx").write_bytes(onnx_models.add_sub())
    backend = OpenvinoBackend()
    backend.load(ctx)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = outputs(backend.execute([make_request(0, {"INPUT0": a, "INPUT1": a}, batch_size=2)])[0])
    np.testing.assert_array_equal(got["OUTPUT0"], a * 2)


def test_gpu_instances_are_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ShoalError, match="supports only CPU device"):
        loaded(tmp_path, models.add_sub(), ADD_SUB, kind="GPU", device="cuda:0")


def test_missing_openvino_fails_the_load_naming_the_extra(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "openvino", None)  # import fails
    ctx = make_context(tmp_path / "m", ADD_SUB)
    with pytest.raises(ShoalError) as failure:
        OpenvinoBackend().load(ctx)
    assert "pip install 'shoal[openvino]'" in failure.value.message


def test_example_openvino_mlp_completes_and_equals_the_onnx_example() -> None:
    """examples/openvino_repository/mlp_openvino: auto-complete gives INPUT__0 [256] ->
    OUTPUT__0 [16], and the backend's outputs equal OpenVINO running the ONNX example (the file
    the IR was built from)."""
    import json

    from shoal.broker.repository import load_model_source
    from shoal.config.model_config import config_to_json
    from shoal.workers.backends.base import InstanceContext
    from shoal.workers.backends.openvino.autocomplete import openvino_auto_complete

    examples = pathlib.Path(__file__).resolve().parents[2] / "examples"
    model_dir = examples / "openvino_repository" / "mlp_openvino"
    source = load_model_source(
        "mlp_openvino", str(model_dir), str(model_dir.parent), default_max_batch_size=4,
        gpu_count=0,
        auto_complete=lambda directory, partial: openvino_auto_complete(directory, partial, 4))
    assert [(i.name, list(i.dims)) for i in source.config.input] == [("INPUT__0", [256])]
    assert [(o.name, list(o.dims)) for o in source.config.output] == [("OUTPUT__0", [16])]
    assert source.config.max_batch_size == 32
    backend = OpenvinoBackend()
    backend.load(InstanceContext(
        model_name="mlp_openvino", model_version=1, model_dir=str(model_dir),
        version_dir=str(model_dir / "1"), config=source.config,
        config_json=json.dumps(config_to_json(source.config)),
        instance_name="mlp_openvino_0", kind="CPU", device="cpu", device_id=0))
    x = np.random.default_rng(5).standard_normal((6, 256)).astype(np.float32)
    got = outputs(backend.execute([make_request(0, {"INPUT__0": x}, batch_size=6)])[0])
    onnx_model = ov.Core().read_model(str(examples / "onnx_repository" / "mlp_onnx" / "1" /
                                          "model.onnx"))
    np.testing.assert_allclose(got["OUTPUT__0"], models.reference(onnx_model, {"INPUT__0": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_the_thread_policy_count_is_the_default(tmp_path: pathlib.Path) -> None:
    """Without INFERENCE_NUM_THREADS the instance runs the server's thread policy count."""
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB, default_intra_op_threads=1)
    assert backend.compiled_properties["INFERENCE_NUM_THREADS"] == "1"


def test_reshape_io_layers_gives_the_model_the_configs_dims(tmp_path: pathlib.Path) -> None:
    """A model fixed at x [2, 3] takes any number of rows once RESHAPE_IO_LAYERS reshapes it to
    the config's [-1, 3]; without the parameter the same config fails the load."""
    config = """
    name: "fixed"
    backend: "openvino"
    input [ { name: "x" data_type: TYPE_INT32 dims: [ -1, 3 ] } ]
    output [ { name: "y" data_type: TYPE_INT32 dims: [ 3 ] } ]
    """
    with pytest.raises(ShoalError, match="tensor 'x'"):
        loaded(tmp_path / "a", models.fixed_sum(), config)
    backend = loaded(tmp_path / "b", models.fixed_sum(), config +
                     'parameters { key: "RESHAPE_IO_LAYERS" value { string_value: "yes" } }\n')
    rows = np.arange(12, dtype=np.int32).reshape(4, 3)
    got = outputs(backend.execute([make_request(0, {"x": rows})])[0])
    assert got["y"].tolist() == rows.sum(axis=0).tolist()


OV_SEQUENCE = """
name: "seq"
backend: "openvino"
default_model_filename: "model.onnx"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.mark.parametrize(("batch", "message"), [
    ("batch", None),
    (4, "for the model to support batching the shape should have at least 1 dimension and the "
        "first dimension must be -1; but shape expected by the model is [4, 1]"),
])
def test_sequence_control_inputs_are_checked_as_the_batcher_feeds_them(
        tmp_path: pathlib.Path, batch: object, message: str | None) -> None:
    """Control inputs are model inputs of dims [-1, 1] (checked as Triton's onnxruntime backend
    checks them, sequence_controls.check_control), fed from each request's rows."""
    from tests import onnx_models

    ctx = make_context(tmp_path / "m", OV_SEQUENCE)
    (pathlib.Path(ctx.version_dir) / "model.onnx").write_bytes(
        onnx_models.sequence_controls(batch=batch))
    backend = OpenvinoBackend()
    if message is not None:
        with pytest.raises(ShoalError) as failure:
            backend.load(ctx)
        assert message in failure.value.message
        return
    backend.load(ctx)
    requests = [make_request(k, {name: np.array([[value]], np.int32) for name, value in
                                 zip(("INPUT", "START", "READY"), row, strict=True)})
                for k, row in enumerate([(5, 1, 1), (7, 0, 1), (9, 0, 0)])]
    got = [outputs(answer)["OUTPUT"].tolist() for answer in backend.execute(requests)]
    assert got == [[[6]], [[7]], [[0]]]
