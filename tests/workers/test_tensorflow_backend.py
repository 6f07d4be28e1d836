"""TensorflowBackend in process: the signature read from saved_model.pb equals TensorFlow's own
view, outputs equal the SavedModel called in TensorFlow, batching, BYTES / FP16, a model without
a batch dim, another signature by parameter, thread counts, and load errors naming the
problem."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

import numpy as np
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from shoal.workers.backends.tensorflow.params import tf_parameters, thread_counts
from shoal.workers.backends.tensorflow.signature import read_signature
from tests.workers.helpers import bytes_array, make_context, make_request

models = pytest.importorskip("tests.tensorflow_models")
tf = models.tf

from shoal.workers.backends.tensorflow.backend import TensorflowBackend  # noqa: E402

ADD_SUB = """
name: "add_sub"
platform: "tensorflow_savedmodel"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

STRINGS = """
name: "strings"
backend: "tensorflow"
platform: "tensorflow_savedmodel"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] },
        { name: "HALF" data_type: TYPE_FP16 dims: [ 3 ] } ]
output [ { name: "UPPER" data_type: TYPE_STRING dims: [ 2 ] },
         { name: "LENGTH" data_type: TYPE_INT32 dims: [ 2 ] },
         { name: "HALF_OUT" data_type: TYPE_FP16 dims: [ 3 ] } ]
"""

FIXED = """
name: "fixed"
platform: "tensorflow_savedmodel"
input [ { name: "x" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]
output [ { name: "doubled" data_type: TYPE_INT64 dims: [ 2, 3 ] },
         { name: "total" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } } ]
"""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("savedmodels")
    return {
        "add_sub": models.save(models.AddSub(), root / "add_sub", product="product"),
        "strings": models.save(models.Strings(), root / "strings"),
        "fixed": models.save(models.FixedShape(), root / "fixed"),
        "mlp": models.save(models.Mlp(), root / "mlp"),
    }


def loaded(tmp_path: pathlib.Path, savedmodel: pathlib.Path, pbtxt: str,
           settings: dict[str, str] | None = None) -> TensorflowBackend:
    ctx = make_context(tmp_path / "m", pbtxt, settings=settings)
    shutil.copytree(savedmodel, pathlib.Path(ctx.version_dir) / "model.savedmodel")
    backend = TensorflowBackend()
    backend.load(ctx)
    return backend


def outputs(answer: BackendResponse | Error | None) -> dict[str, Any]:
    assert isinstance(answer, BackendResponse), answer
    return {t.name: t.array for t in answer.outputs}


def tf_view(path: pathlib.Path, key: str = "serving_default") -> tuple[Any, Any]:
    function = tf.saved_model.load(str(path)).signatures[key]
    def dims(spec: Any) -> tuple[int, ...]:
        return tuple(-1 if d is None else d for d in spec.shape.as_list()) \
            if spec.shape.rank is not None else ()
    inputs = {name: (spec.dtype.as_datatype_enum, dims(spec))
              for name, spec in function.structured_input_signature[1].items()}
    outputs_ = {name: (spec.dtype.as_datatype_enum, dims(spec))
                for name, spec in function.structured_outputs.items()}
    return inputs, outputs_


@pytest.mark.parametrize("name", ["add_sub", "strings", "fixed", "mlp"])
def test_signature_read_from_the_file_equals_tensorflows_view(
        saved: dict[str, pathlib.Path], name: str) -> None:
    from shoal.workers.backends.tensorflow.signature import WIRE_OF_TF_TYPE

    signature = read_signature(str(saved[name]), name)
    expected_inputs, expected_outputs = tf_view(saved[name])
    assert {t.name: (t.datatype, t.dims) for t in signature.inputs} == {
        key: (WIRE_OF_TF_TYPE[dtype], dims) for key, (dtype, dims) in expected_inputs.items()}
    assert {t.name: (t.datatype, t.dims) for t in signature.outputs} == {
        key: (WIRE_OF_TF_TYPE[dtype], dims) for key, (dtype, dims) in expected_outputs.items()}
    assert [t.name for t in signature.inputs] == sorted(t.name for t in signature.inputs)


def test_another_signature_is_read_when_asked_for(saved: dict[str, pathlib.Path]) -> None:
    signature = read_signature(str(saved["add_sub"]), "add_sub", wanted="product")
    assert signature.key == "product"
    assert [t.name for t in signature.outputs] == ["PRODUCT"]
    missing = read_signature(str(saved["mlp"]), "mlp", wanted="nope")
    assert missing.key == "serving_default"  # Triton: the first non-internal one instead


def test_a_missing_tag_is_named(saved: dict[str, pathlib.Path]) -> None:
    with pytest.raises(ShoalError, match="expected 'gpu' tag"):
        read_signature(str(saved["mlp"]), "mlp", tag="gpu")


def test_batched_requests_equal_tensorflow_in_process(
        tmp_path: pathlib.Path, saved: dict[str, pathlib.Path]) -> None:
    backend = loaded(tmp_path, saved["mlp"], MLP)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    requests = [make_request(i, {"x": a}, batch_size=len(a)) for i, a in enumerate(arrays)]
    function = tf.saved_model.load(str(saved["mlp"])).signatures["serving_default"]
    for a, answer in zip(arrays, backend.execute(requests), strict=True):
        np.testing.assert_array_equal(outputs(answer)["y"], function(x=tf.constant(a))["y"])


MLP = """
name: "mlp"
platform: "tensorflow_savedmodel"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def test_bytes_and_fp16_round_trip(tmp_path: pathlib.Path,
                                   saved: dict[str, pathlib.Path]) -> None:
    backend = loaded(tmp_path, saved["strings"], STRINGS)
    text = bytes_array(["ünï".encode(), b"", b"ab", b"c\x00d"], (2, 2))
    half = np.array([[1.5, -2, 1024], [0, 0.25, 3]], np.float16)
    answer = outputs(backend.execute(
        [make_request(0, {"TEXT": text, "HALF": half}, batch_size=2)])[0])
    assert answer["UPPER"].tolist() == tf.strings.upper(tf.constant(text)).numpy().tolist()
    assert answer["UPPER"][1].tolist() == [b"AB", b"C\x00D"]
    np.testing.assert_array_equal(answer["LENGTH"], [[len("ünï".encode()), 0], [2, 3]])
    np.testing.assert_array_equal(answer["HALF_OUT"], half * 2)


def test_a_model_without_batch_dim_runs_each_request_alone(
        tmp_path: pathlib.Path, saved: dict[str, pathlib.Path]) -> None:
    backend = loaded(tmp_path, saved["fixed"], FIXED)
    a, b = np.arange(6).reshape(2, 3), np.ones((2, 3), np.int64)
    answers = [outputs(r) for r in backend.execute([make_request(0, {"x": a}),
                                                     make_request(1, {"x": b})])]
    np.testing.assert_array_equal(answers[0]["doubled"], a * 2)
    np.testing.assert_array_equal(answers[1]["total"], [6])  # reshape: the scalar as [1]


def test_a_signature_parameter_serves_that_signature(
        tmp_path: pathlib.Path, saved: dict[str, pathlib.Path]) -> None:
    config = """
        name: "product"
        platform: "tensorflow_savedmodel"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "PRODUCT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "product" } }
    """
    backend = loaded(tmp_path, saved["add_sub"], config)
    a = np.full((1, 4), 3, np.float32)
    answer = outputs(backend.execute([make_request(0, {"INPUT0": a, "INPUT1": a})])[0])
    np.testing.assert_array_equal(answer["PRODUCT"], a * a)


@pytest.mark.parametrize(("change", "message"), [
    (("TYPE_FP32 dims: [ 4 ] },\n        { name: \"INPUT1\"",
      "TYPE_INT32 dims: [ 4 ] },\n        { name: \"INPUT1\""),
     "configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"),
    (('{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }',
      '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 5 ] }'),
     "tensor 'OUTPUT1': the model expects 2 dimensions (shape [-1, 4])"),
    (('{ name: "INPUT1"', '{ name: "INPUT9"'),
     "unexpected inference input 'INPUT9', allowed inputs are: INPUT0, INPUT1"),
])
def test_a_config_that_does_not_match_the_signature_fails_the_load(
        tmp_path: pathlib.Path, saved: dict[str, pathlib.Path], change: tuple[str, str],
        message: str) -> None:
    assert change[0] in ADD_SUB
    with pytest.raises(ShoalError) as info:
        loaded(tmp_path, saved["add_sub"], ADD_SUB.replace(*change))
    assert info.value.code == ErrorCode.INVALID_ARG
    assert message in info.value.message


def test_corrupt_variables_fail_the_load_clearly(
        tmp_path: pathlib.Path, saved: dict[str, pathlib.Path]) -> None:
    ctx = make_context(tmp_path / "m", MLP)
    target = pathlib.Path(ctx.version_dir) / "model.savedmodel"
    shutil.copytree(saved["mlp"], target)
    for data in (target / "variables").glob("variables.data-*"):
        data.write_bytes(b"not a checkpoint")
    with pytest.raises(ShoalError) as info:
        TensorflowBackend().load(ctx)
    assert "unable to load model 'mlp': cannot load SavedModel 'model.savedmodel'" in \
        info.value.message
    assert str(tmp_path) not in info.value.message


def test_a_missing_savedmodel_directory_is_named(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ShoalError, match=r"unable to find 'mlp/1/model\.savedmodel'"):
        TensorflowBackend().load(make_context(tmp_path / "m", MLP))


def test_thread_counts_parameter_then_backend_config_then_policy_then_share() -> None:
    from google.protobuf import text_format
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    def config(params: str = "") -> Any:
        return text_format.Parse(f'name: "m" instance_group [ {{ count: 2 }} ] {params}',
                                 ModelConfig())

    named = config('parameters { key: "TF_NUM_INTRA_THREADS" value: { string_value: "3" } }')
    assert thread_counts(tf_parameters(named), named, {"intra-op-thread-count": "5"}, 7) == (3, 1)
    plain = config()
    assert thread_counts(tf_parameters(plain), plain, {"intra-op-thread-count": "5"}, 7) == (5, 1)
    assert thread_counts(tf_parameters(plain), plain, {}, 7) == (7, 1)
    share = thread_counts(tf_parameters(plain), plain, {}, 0)[0]
    assert share >= 1
    bad = config('parameters { key: "TF_NUM_INTER_THREADS" value: { string_value: "-2" } }')
    with pytest.raises(ShoalError, match="'TF_NUM_INTER_THREADS' must be non-negative"):
        tf_parameters(bad)


GRAPHDEF = ADD_SUB.replace('name: "add_sub"\nplatform: "tensorflow_savedmodel"',
                           'name: "add_sub"\nplatform: "tensorflow_graphdef"')


def loaded_graphdef(tmp_path: pathlib.Path, pbtxt: str) -> TensorflowBackend:
    ctx = make_context(tmp_path / "m", pbtxt)
    (pathlib.Path(ctx.version_dir) / "model.graphdef").write_bytes(models.add_sub_graphdef())
    backend = TensorflowBackend()
    backend.load(ctx)
    return backend


def test_a_graphdef_runs_by_node_names_and_batches(tmp_path: pathlib.Path) -> None:
    assert "tensorflow_graphdef" in GRAPHDEF
    backend = loaded_graphdef(tmp_path, GRAPHDEF)
    rng = np.random.default_rng(4)
    pairs = [(rng.standard_normal((n, 4)).astype(np.float32),
              rng.standard_normal((n, 4)).astype(np.float32)) for n in (2, 1)]
    answers = backend.execute([make_request(i, {"INPUT0": a, "INPUT1": b}, batch_size=len(a))
                               for i, (a, b) in enumerate(pairs)])
    for (a, b), answer in zip(pairs, answers, strict=True):
        np.testing.assert_allclose(outputs(answer)["OUTPUT0"], a + b, rtol=1e-6)
        np.testing.assert_allclose(outputs(answer)["OUTPUT1"], a - b, rtol=1e-6)


@pytest.mark.parametrize(("change", "message"), [
    (('{ name: "INPUT1"', '{ name: "add"'),
     "unexpected inference input 'add', allowed inputs are: INPUT0, INPUT1"),
    (('{ name: "OUTPUT1"', '{ name: "nowhere"'), "unexpected inference output 'nowhere'"),
    (("TYPE_FP32 dims: [ 4 ] },\n        { name: \"INPUT1\"",
      "TYPE_INT64 dims: [ 4 ] },\n        { name: \"INPUT1\""),
     "configuration expects datatype TYPE_INT64 for input 'INPUT0', model provides TYPE_FP32"),
])
def test_a_graphdef_config_naming_other_nodes_fails_the_load(
        tmp_path: pathlib.Path, change: tuple[str, str], message: str) -> None:
    assert change[0] in GRAPHDEF
    with pytest.raises(ShoalError) as info:
        loaded_graphdef(tmp_path, GRAPHDEF.replace(*change))
    assert message in info.value.message


def test_a_corrupt_graphdef_fails_the_load_clearly(tmp_path: pathlib.Path) -> None:
    ctx = make_context(tmp_path / "m", GRAPHDEF)
    (pathlib.Path(ctx.version_dir) / "model.graphdef").write_bytes(b"\x0a\x05 not a graph")
    with pytest.raises(ShoalError, match=r"cannot parse GraphDef 'add_sub/1/model\.graphdef'"):
        TensorflowBackend().load(ctx)


SEQUENCE = """
name: "seq"
platform: "tensorflow_savedmodel"
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

CONTROL_ROWS = [(5, 1, 1), (7, 0, 1), (9, 0, 0)]  # (INPUT, START, READY); the last not ready


def control_requests() -> list[Any]:
    return [make_request(k, {name: np.array([[value]], np.int32) for name, value in
                             zip(("INPUT", "START", "READY"), row, strict=True)})
            for k, row in enumerate(CONTROL_ROWS)]


def test_sequence_controls_are_signature_inputs_fed_from_the_requests(
        tmp_path: pathlib.Path) -> None:
    backend = loaded(tmp_path, models.save(models.SequenceControls(), tmp_path / "s"),
                     SEQUENCE)
    got = [outputs(answer)["OUTPUT"].tolist() for answer in backend.execute(control_requests())]
    assert got == [[[6]], [[7]], [[0]]]


@pytest.mark.parametrize(("edit", "message"), [
    (('name: "READY"', 'name: "GO"'),
     "configuration specified sequence control 'GO', but model does not provide that input"),
    (("CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]",
      "CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ]"),
     "unable to load model 'seq', sequence control 'START': the model expects TYPE_INT32 but "
     "the model configuration specifies data-type TYPE_FP32"),
    (("},\n    { name: \"READY\" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: "
      "[ 0, 1 ] } ] }", "}"),
     "unable to load model 'seq', configuration expects 2 inputs, model provides 3"),
])
def test_sequence_controls_that_do_not_match_the_signature_fail_the_load(
        tmp_path: pathlib.Path, edit: tuple[str, str], message: str) -> None:
    text = SEQUENCE.replace(*edit, 1)
    assert text != SEQUENCE
    with pytest.raises(ShoalError) as failure:
        loaded(tmp_path, models.save(models.SequenceControls(), tmp_path / "s"), text)
    assert message in failure.value.message


def test_graphdef_sequence_controls_are_placeholders_fed_by_name(tmp_path: pathlib.Path) -> None:
    config = SEQUENCE.replace("tensorflow_savedmodel", "tensorflow_graphdef")
    ctx = make_context(tmp_path / "m", config)
    (pathlib.Path(ctx.version_dir) / "model.graphdef").write_bytes(
        models.sequence_controls_graphdef())
    backend = TensorflowBackend()
    backend.load(ctx)
    got = [outputs(answer)["OUTPUT"].tolist() for answer in backend.execute(control_requests())]
    assert got == [[[6]], [[7]], [[0]]]
    missing = make_context(tmp_path / "other", config.replace('name: "READY"', 'name: "GO"'))
    (pathlib.Path(missing.version_dir) / "model.graphdef").write_bytes(
        models.sequence_controls_graphdef())
    with pytest.raises(ShoalError, match="configuration specified sequence control 'GO', but "
                                         "model does not provide that input"):
        TensorflowBackend().load(missing)


@pytest.mark.parametrize(("edit", "message"), [
    (("CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]",
      "CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ]"),
     "unable to load model 'seq', sequence control 'START': the model expects TYPE_INT32 but "
     "the model configuration specifies data-type TYPE_FP32"),
    (("    { name: \"READY\"",
      "    { name: \"END\" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] "
      "},\n    { name: \"READY\""),
     "unable to load model 'seq', configuration expects 4 inputs, model provides at most 3"),
])
def test_graphdef_sequence_controls_are_type_checked_and_counted(
        tmp_path: pathlib.Path, edit: tuple[str, str], message: str) -> None:
    config = SEQUENCE.replace("tensorflow_savedmodel", "tensorflow_graphdef")
    text = config.replace(*edit, 1)
    assert text != config
    ctx = make_context(tmp_path / "m", text)
    (pathlib.Path(ctx.version_dir) / "model.graphdef").write_bytes(
        models.sequence_controls_graphdef())
    with pytest.raises(ShoalError) as failure:
        TensorflowBackend().load(ctx)
    assert message in failure.value.message
