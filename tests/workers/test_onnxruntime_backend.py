"""OnnxruntimeBackend in process: outputs equal ONNX Runtime called directly, batching, BYTES,
FP16, BF16, implicit state, zero-copy input binding, and load errors naming the problem."""

from __future__ import annotations

import pathlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from shoal.errors import ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from tests.workers.helpers import bytes_array, make_context, make_request

ort = pytest.importorskip("onnxruntime")
models = pytest.importorskip("tests.onnx_models")

from shoal.workers.backends.onnxruntime.backend import OnnxruntimeBackend  # noqa: E402

ADD_SUB = """
name: "add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def loaded(tmp_path: pathlib.Path, model: bytes, pbtxt: str) -> OnnxruntimeBackend:
    ctx = make_context(tmp_path / "m", pbtxt)
    (pathlib.Path(ctx.version_dir) / "model.onnx").write_bytes(model)
    backend = OnnxruntimeBackend()
    backend.load(ctx)
    return backend


def outputs(answer: BackendResponse | Error | None) -> dict[str, Any]:
    assert isinstance(answer, BackendResponse), answer
    return {t.name: t.array for t in answer.outputs}


def test_batched_requests_equal_onnxruntime_in_process(tmp_path: pathlib.Path) -> None:
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB)
    rng = np.random.default_rng(1)
    arrays = [(rng.standard_normal((n, 4)).astype(np.float32),
               rng.standard_normal((n, 4)).astype(np.float32)) for n in (1, 3, 2)]
    requests = [make_request(i, {"INPUT0": a, "INPUT1": b}, batch_size=len(a))
                for i, (a, b) in enumerate(arrays)]
    session = ort.InferenceSession(models.add_sub(), providers=["CPUExecutionProvider"])
    for (a, b), answer in zip(arrays, backend.execute(requests), strict=True):
        expected = session.run(None, {"INPUT0": a, "INPUT1": b})
        got = outputs(answer)
        np.testing.assert_array_equal(got["OUTPUT0"], expected[0])
        np.testing.assert_array_equal(got["OUTPUT1"], expected[1])


def test_inputs_adjacent_in_one_buffer_are_bound_without_a_copy(tmp_path: pathlib.Path) -> None:
    """Two requests whose rows lie back to back (as the frontend arena places them) reach ONNX
    Runtime as one OrtValue over that very memory, and so does a lone request's view."""
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB)
    buffer = np.arange(24, dtype=np.float32).reshape(6, 4)
    other = np.ones((6, 4), np.float32)
    requests = [make_request(0, {"INPUT0": buffer[:2], "INPUT1": other[:2]}, batch_size=2),
                make_request(1, {"INPUT0": buffer[2:], "INPUT1": other[2:]}, batch_size=4)]
    answers = backend.execute(requests)
    runner = backend._runner
    assert runner is not None
    assert runner.bound_inputs["INPUT0"] == buffer.ctypes.data
    assert runner.bound_inputs["INPUT1"] == other.ctypes.data
    np.testing.assert_array_equal(outputs(answers[1])["OUTPUT0"], buffer[2:] + 1)
    lone = np.full((1, 4), 5, np.float32)
    backend.execute([make_request(2, {"INPUT0": lone, "INPUT1": lone}, batch_size=1)])
    assert runner.bound_inputs["INPUT0"] == lone.ctypes.data


def test_outputs_are_views_of_what_onnxruntime_wrote(tmp_path: pathlib.Path) -> None:
    """Each request's output is a slice of the batch's one output buffer (no per-request copy):
    the second request's rows start right after the first's."""
    backend = loaded(tmp_path, models.add_sub(), ADD_SUB)
    data = np.ones((3, 4), np.float32)
    answers = backend.execute([make_request(0, {"INPUT0": data[:1], "INPUT1": data[:1]}),
                               make_request(1, {"INPUT0": data[1:], "INPUT1": data[1:]},
                                            batch_size=2)])
    first, second = outputs(answers[0])["OUTPUT0"], outputs(answers[1])["OUTPUT0"]
    assert second.ctypes.data == first.ctypes.data + first.nbytes
    assert not first.flags.owndata


def test_unbatched_model_runs_each_request_alone(tmp_path: pathlib.Path) -> None:
    config = """
    name: "fixed"
    backend: "onnxruntime"
    input [ { name: "x" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]
    output [ { name: "y" data_type: TYPE_INT64 dims: [ 3 ] } ]
    """
    backend = loaded(tmp_path, models.fixed_shape(), config)
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    answers = backend.execute([make_request(0, {"x": a}), make_request(1, {"x": a * 2})])
    assert outputs(answers[0])["y"].tolist() == [3, 5, 7]
    assert outputs(answers[1])["y"].tolist() == [6, 10, 14]


def test_bytes_and_fp16(tmp_path: pathlib.Path) -> None:
    config = """
    name: "strings"
    backend: "onnxruntime"
    max_batch_size: 4
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] },
            { name: "HALF" data_type: TYPE_FP16 dims: [ 3 ] } ]
    output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 2 ] },
             { name: "HALF_OUT" data_type: TYPE_FP16 dims: [ 3 ] } ]
    """
    backend = loaded(tmp_path, models.strings_and_half(), config)
    text = bytes_array(["ünï".encode(), b"", b"a", b"bc"], (2, 2))
    half = np.array([[1, 2, 3], [0.5, -1, 8]], np.float16)
    answers = backend.execute([make_request(0, {"TEXT": text[:1], "HALF": half[:1]}),
                               make_request(1, {"TEXT": text[1:], "HALF": half[1:]})])
    got = [outputs(a) for a in answers]
    assert got[0]["TEXT_OUT"].tolist() == [["ünï".encode(), b""]]
    assert got[1]["TEXT_OUT"].tolist() == [[b"a", b"bc"]]
    np.testing.assert_array_equal(np.concatenate([g["HALF_OUT"] for g in got]), half * 2)
    assert got[0]["HALF_OUT"].dtype == np.float16


def test_bytes_input_that_is_not_utf8_is_refused_by_name(tmp_path: pathlib.Path) -> None:
    config = """
    name: "strings"
    backend: "onnxruntime"
    max_batch_size: 4
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] },
            { name: "HALF" data_type: TYPE_FP16 dims: [ 3 ] } ]
    output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 2 ] } ]
    """
    backend = loaded(tmp_path, models.strings_and_half(), config)
    answer = backend.execute([make_request(0, {"TEXT": bytes_array([b"\xff", b"x"], (1, 2)),
                                               "HALF": np.zeros((1, 3), np.float16)})])[0]
    assert isinstance(answer, Error) and "input 'TEXT'" in answer.message


def test_bf16_as_uint16_bit_patterns(tmp_path: pathlib.Path) -> None:
    config = """
    name: "bf16"
    backend: "onnxruntime"
    max_batch_size: 4
    input [ { name: "B" data_type: TYPE_BF16 dims: [ 2 ] } ]
    output [ { name: "B_OUT" data_type: TYPE_BF16 dims: [ 2 ] } ]
    """
    backend = loaded(tmp_path, models.bf16_scale(), config)
    values = np.array([[1.5, -3.0], [0.25, 100.0]], dtype=ml_dtypes.bfloat16)
    answer = backend.execute([make_request(0, {"B": values.view(np.uint16)}, batch_size=2,
                                           datatypes={"B": "BF16"})])[0]
    got = outputs(answer)["B_OUT"]
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got.view(ml_dtypes.bfloat16), values * 2)


def test_state_tensors_are_one_more_input_and_output(tmp_path: pathlib.Path) -> None:
    config = """
    name: "accumulate"
    backend: "onnxruntime"
    max_batch_size: 2
    sequence_batching {
      state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
    }
    input [ { name: "VALUE" data_type: TYPE_INT64 dims: [ 1 ] } ]
    output [ { name: "SUM" data_type: TYPE_INT64 dims: [ 1 ] } ]
    """
    backend = loaded(tmp_path, models.accumulate(), config)
    rows = [make_request(i, {"VALUE": np.array([[v]], np.int64),
                             "SUM_IN": np.array([[s]], np.int64)})
            for i, (v, s) in enumerate([(3, 10), (4, 20)])]
    got = [outputs(a) for a in backend.execute(rows)]
    assert [int(g["SUM"][0, 0]) for g in got] == [13, 24]
    assert [int(g["SUM_OUT"][0, 0]) for g in got] == [13, 24]


@pytest.mark.parametrize(("edit", "message"), [
    (('name: "INPUT1"', 'name: "OTHER"'),
     "unexpected inference input 'OTHER', allowed inputs are: INPUT0, INPUT1"),
    (("TYPE_FP32 dims: [ 4 ] },\n        {", "TYPE_INT32 dims: [ 4 ] },\n        {"),
     "unexpected datatype TYPE_INT32 for inference input 'INPUT0', expecting TYPE_FP32"),
    (('name: "OUTPUT1"', 'name: "OUT"'),
     "unexpected inference output 'OUT', allowed outputs are: OUTPUT0, OUTPUT1"),
    (("dims: [ 4 ] }", "dims: [ 5 ] }"), "the model expects 1 dimensions (shape [4])"),
])
def test_config_that_does_not_match_the_graph_fails_the_load(
        tmp_path: pathlib.Path, edit: tuple[str, str], message: str) -> None:
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, models.add_sub(), ADD_SUB.replace(*edit, 1))
    assert message in failure.value.message


def test_corrupt_model_file_fails_with_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, b"not an onnx model", ADD_SUB)
    message = failure.value.message
    assert "cannot load ONNX model 'model.onnx'" in message
    assert str(tmp_path) not in message


def test_directory_model_is_read_from_dir_model_onnx(tmp_path: pathlib.Path) -> None:
    ctx = make_context(tmp_path / "m", ADD_SUB)
    directory = pathlib.Path(ctx.version_dir) / "model.onnx"
    directory.mkdir()
    (directory / "model.onnx").write_bytes(models.add_sub())
    backend = OnnxruntimeBackend()
    backend.load(ctx)
    one = np.ones((1, 4), np.float32)
    assert outputs(backend.execute([make_request(0, {"INPUT0": one, "INPUT1": one})])[0])[
        "OUTPUT0"].tolist() == [[2, 2, 2, 2]]


def test_missing_onnxruntime_fails_the_load_naming_the_extra(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # import fails
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, models.add_sub(), ADD_SUB)
    assert "pip install 'shoal[onnx]'" in failure.value.message


def test_ragged_inputs_batch_input_and_scattered_output(tmp_path: pathlib.Path) -> None:
    config = """
    name: "ragged"
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
    batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32
                    source_input: "INPUT" } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "COUNT_OUT" data_type: TYPE_INT32 dims: [ 1 ] reshape { shape: [ ] } } ]
    batch_output [ { target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                     source_input: "INPUT" } ]
    """
    backend = loaded(tmp_path, models.ragged_double(), config)
    lengths = [3, 1, 5]
    requests = [make_request(i, {"INPUT": np.arange(n, dtype=np.float32).reshape(1, n)})
                for i, n in enumerate(lengths)]
    got = [outputs(answer) for answer in backend.execute(requests)]
    for n, result in zip(lengths, got, strict=True):
        np.testing.assert_array_equal(result["OUT"], np.arange(n, dtype=np.float32)[None] * 2)
        assert result["COUNT_OUT"].tolist() == [[n]]


def test_fixed_shape_outputs_are_written_into_lent_arena_slots(
        tmp_path: pathlib.Path, shm_prefix: str) -> None:
    """With the worker lending arena slots, ONNX Runtime writes each fixed-shape output straight
    into one: every request's output lies inside a lent slot, so the worker never copies it."""
    import dataclasses

    from shoal.shm.arena import Arena
    from shoal.workers.output_lending import OutputLender

    arena = Arena(shm_prefix + "w-", 1 << 16, 1 << 20)
    lender = OutputLender(arena)
    ctx = dataclasses.replace(make_context(tmp_path / "m", ADD_SUB), lend_output=lender.lend)
    (pathlib.Path(ctx.version_dir) / "model.onnx").write_bytes(models.add_sub())
    backend = OnnxruntimeBackend()
    backend.load(ctx)
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


SEQUENCE = """
name: "seq"
backend: "onnxruntime"
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


def test_control_inputs_of_the_graph_are_fed_from_the_requests(tmp_path: pathlib.Path) -> None:
    """A graph that takes the START / READY controls loads (Triton counts them as inputs) and
    each request's control rows reach the session by name, one batch run for all rows."""
    backend = loaded(tmp_path, models.sequence_controls(), SEQUENCE)
    rows = [(5, 1, 1), (7, 0, 1), (9, 0, 0)]  # (INPUT, START, READY); the last row not ready
    requests = [make_request(k, {name: np.array([[value]], np.int32) for name, value in
                                 zip(("INPUT", "START", "READY"), row, strict=True)})
                for k, row in enumerate(rows)]
    got = [outputs(answer)["OUTPUT"].tolist() for answer in backend.execute(requests)]
    assert got == [[[6]], [[7]], [[0]]]


@pytest.mark.parametrize(("edit", "message"), [
    (('name: "READY"', 'name: "GO"'),
     "configuration specified sequence control 'GO', but model does not provide that input"),
    (("CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]",
      "CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ]"),
     "unable to load model 'seq', sequence control 'START', the model expects data-type "
     "TYPE_INT32 but the model configuration specifies data-type TYPE_FP32"),
    (("max_batch_size: 4", "max_batch_size: 0"),  # the graph's [batch, 1] is then [-1, 1]
     "unable to load model 'seq', sequence control 'START' in model has dims [-1, 1] but "
     "dims [1] is expected"),
    (("},\n    { name: \"READY\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: "
      "[ 0, 1 ] } ] }", "}"),
     "configuration expects 2 inputs, model provides 3 (not in the configuration: READY)"),
])
def test_control_inputs_that_do_not_match_the_graph_fail_the_load(
        tmp_path: pathlib.Path, edit: tuple[str, str], message: str) -> None:
    text = SEQUENCE.replace(*edit, 1)
    assert text != SEQUENCE
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, models.sequence_controls(), text)
    assert message in failure.value.message


def test_a_control_input_without_a_dynamic_batch_dim_fails_the_load(
        tmp_path: pathlib.Path) -> None:
    """A batching model's control is fed [rows, 1]: a graph control of fixed batch dim ([4, 1])
    is refused at load, as Triton does, instead of failing requests of other batch sizes."""
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, models.sequence_controls(batch=4), SEQUENCE)
    assert ("model 'seq', tensor 'START': for the model to support batching the shape should "
            "have at least 1 dimension and the first dimension must be -1; but shape expected "
            "by the model is [4, 1]") in failure.value.message
