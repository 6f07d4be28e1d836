"""ONNX sequence models whose graph takes the sequence control inputs (START / END / READY /
CORRID as graph inputs, filled by the sequence batcher from ``sequence_batching.control_input``)
load and serve, as in Triton's onnxruntime backend (which counts the controls, and state inputs,
as model inputs): models equivalent to Triton's ``simple_sequence`` (direct strategy, INT32 START
and READY) and ``simple_dyna_sequence`` (oldest strategy, INT32 START / END / READY and UINT64
CORRID) examples, built here with the onnx helper API, plus controls of the other data types
(FP32, BOOL, STRING) beside an implicit state, a model without batching, and the openvino
backend reading the same ONNX graph. The server starts with the default ``--exit-on-error``, so
a model that failed its load would keep it from starting. Sequences go through tritonclient's
``sequence_start`` / ``sequence_end`` over gRPC and HTTP, interleaved from concurrent clients."""

from __future__ import annotations

import concurrent.futures
import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

pytest.importorskip("onnxruntime")
models = pytest.importorskip("tests.onnx_models")

pytestmark = pytest.mark.e2e

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def _control(name: str, kind: str, values: str = "int32_false_true: [ 0, 1 ]") -> str:
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}'


CORRID_UINT64 = _control("CORRID", "CORRID", "data_type: TYPE_UINT64")
INT32_IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Triton's simple_sequence example: the direct strategy (the default), START and READY.
SIMPLE_SEQUENCE = f"""
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  control_input [ {_control("START", "START")}, {_control("READY", "READY")} ]
}}
{INT32_IO}
instance_group [ {{ kind: KIND_CPU }} ]
"""

# Triton's simple_dyna_sequence example: the oldest strategy and all four controls.
def _dyna_sequence(name: str, backend: str) -> str:
    controls = ", ".join([_control("START", "START"), _control("END", "END"),
                          _control("READY", "READY"), CORRID_UINT64])
    return f"""
name: "{name}"
{backend}
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  oldest {{ max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }}
  control_input [ {controls} ]
}}
{INT32_IO}
parameters [ {{ key: "execute_delay_ms" value: {{ string_value: "3" }} }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
"""


TYPED_CONTROLS = f"""
name: "typed_controls"
backend: "onnxruntime"
max_batch_size: 4
sequence_batching {{
  max_sequence_idle_microseconds: 10000000
  control_input [
    {_control("START", "START", "fp32_false_true: [ 0, 1 ]")},
    {_control("END", "END", "bool_false_true: [ false, true ]")},
    {_control("READY", "READY", "bool_false_true: [ false, true ]")},
    {_control("CORRID", "CORRID", "data_type: TYPE_STRING")}
  ]
  state [ {{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
}}
input [ {{ name: "VALUE" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT64 dims: [ 1 ] }},
         {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 2 ] }},
         {{ name: "CORRID_OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

UNBATCHED = f"""
name: "unbatched_sequence"
backend: "onnxruntime"
max_batch_size: 0
sequence_batching {{
  control_input [ {_control("START", "START")}, {_control("READY", "READY")} ]
}}
{INT32_IO}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

MODELS = ["simple_sequence", "simple_dyna_sequence", "typed_controls", "unbatched_sequence"]
if HAS_OPENVINO:
    MODELS.append("openvino_dyna_sequence")


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("onnx_seq")
    models.write_model(repo, "simple_sequence", models.sequence_controls(), SIMPLE_SEQUENCE)
    models.write_model(repo, "simple_dyna_sequence", models.all_sequence_controls(),
                       _dyna_sequence("simple_dyna_sequence", 'platform: "onnxruntime_onnx"'))
    models.write_model(repo, "typed_controls", models.typed_controls_accumulate(),
                       TYPED_CONTROLS)
    models.write_model(repo, "unbatched_sequence", models.sequence_controls(batching=False),
                       UNBATCHED)
    if HAS_OPENVINO:  # OpenVINO reads the ONNX graph itself
        models.write_model(repo, "openvino_dyna_sequence", models.all_sequence_controls(),
                           _dyna_sequence("openvino_dyna_sequence", 'backend: "openvino"\n'
                                          'default_model_filename: "model.onnx"'))
    # default flags: --exit-on-error and --strict-readiness, so every model must load
    with serving(ShoalServer([str(repo)]), timeout=120) as srv:
        yield srv


Step = Callable[[int, bool, bool], dict[str, Any]]


def _http_step(server: ShoalServer, model: str, seq: int | str, name: str = "INPUT",
               datatype: str = "INT32", shape: tuple[int, ...] = (1, 1)) -> Step:
    client = httpclient.InferenceServerClient(server.url)

    def step(value: int, start: bool, end: bool) -> dict[str, Any]:
        inp = httpclient.InferInput(name, list(shape), datatype)
        inp.set_data_from_numpy(np.full(shape, value, dtype=_numpy(datatype)))
        result = client.infer(model, [inp], sequence_id=seq, sequence_start=start,
                              sequence_end=end)
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}

    return step


def _grpc_step(server: ShoalServer, model: str, seq: int | str, name: str = "INPUT",
               datatype: str = "INT32", shape: tuple[int, ...] = (1, 1)) -> Step:
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def step(value: int, start: bool, end: bool) -> dict[str, Any]:
        inp = grpcclient.InferInput(name, list(shape), datatype)
        inp.set_data_from_numpy(np.full(shape, value, dtype=_numpy(datatype)))
        result = client.infer(model, [inp], sequence_id=seq, sequence_start=start,
                              sequence_end=end)
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}

    return step


def _numpy(datatype: str) -> np.dtype[Any]:
    return np.dtype({"INT32": np.int32, "INT64": np.int64}[datatype])


def _run_sequence(step: Step, values: list[int]) -> list[dict[str, Any]]:
    """One full sequence: START on the first request, END on the last."""
    return [step(v, i == 0, i == len(values) - 1) for i, v in enumerate(values)]


def _batch_sizes(server: ShoalServer, model: str) -> list[int]:
    stats = httpx.get(f"{server.base}/v2/models/{model}/stats").json()["model_stats"][0]
    return [int(b["batch_size"]) for b in stats["batch_stats"]]


VALUES = [11, 7, 5, 3, 2, 0, 1]


def test_models_load_with_their_controls_and_clients_see_only_the_config_inputs(
        seq_server: ShoalServer) -> None:
    for model in MODELS:
        assert httpx.get(f"{seq_server.base}/v2/models/{model}/ready").status_code == 200
    metadata = httpx.get(f"{seq_server.base}/v2/models/simple_dyna_sequence").json()
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_sequence_direct_gets_start_and_ready(seq_server: ShoalServer,
                                                     protocol: str) -> None:
    """OUTPUT = READY * (INPUT + START): START is 1 on the first request only, READY on every
    request; interleaved sequences share the instances' batch slots."""
    make = _http_step if protocol == "http" else _grpc_step
    sequences = [1000 + k + (100 if protocol == "grpc" else 0) for k in range(6)]

    def run(seq: int) -> list[int]:
        step = make(seq_server, "simple_sequence", seq)
        return [int(r["OUTPUT"][0, 0]) for r in _run_sequence(step, [v * seq for v in VALUES])]

    with concurrent.futures.ThreadPoolExecutor(len(sequences)) as pool:
        got = dict(zip(sequences, pool.map(run, sequences), strict=True))
    for seq, outputs in got.items():
        expected = [v * seq for v in VALUES]
        expected[0] += 1
        assert outputs == expected, seq


@pytest.mark.parametrize("model", ["simple_dyna_sequence", "openvino_dyna_sequence"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dyna_sequence_oldest_gets_all_four_controls(seq_server: ShoalServer, protocol: str,
                                                     model: str) -> None:
    """OUTPUT = READY * (INPUT + START + END * CORRID): the first request adds 1, the last adds
    its sequence id (the UINT64 CORRID control)."""
    if model not in MODELS:
        pytest.skip("openvino is not installed")
    make = _http_step if protocol == "http" else _grpc_step
    base = 7000 if model.startswith("openvino") else 5000
    sequences = [base + k + (500 if protocol == "grpc" else 0) for k in range(8)]

    def run(seq: int) -> list[int]:
        return [int(r["OUTPUT"][0, 0]) for r in _run_sequence(make(seq_server, model, seq),
                                                              VALUES)]

    with concurrent.futures.ThreadPoolExecutor(len(sequences)) as pool:
        got = dict(zip(sequences, pool.map(run, sequences), strict=True))
    for seq, outputs in got.items():
        expected = list(VALUES)
        expected[0] += 1
        expected[-1] += seq
        assert outputs == expected, seq


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_fp32_bool_and_string_controls_beside_an_implicit_state(seq_server: ShoalServer,
                                                                protocol: str) -> None:
    """The FP32 START, BOOL END / READY and STRING CORRID controls reach the graph with the
    config's data types, and the state accumulates each sequence's values; more sequences
    than the 4 slots of the one instance, so rows batch together and sequences wait."""
    make = _http_step if protocol == "http" else _grpc_step
    sequences = [f"{protocol}-seq-{k}" for k in range(6)]
    values = [3, 1, 4, 1, 5, 9]

    def run(seq: str) -> list[dict[str, Any]]:
        step = make(seq_server, "typed_controls", seq, name="VALUE", datatype="INT64")
        return _run_sequence(step, [v * (1 + len(seq) % 3) for v in values])

    with concurrent.futures.ThreadPoolExecutor(len(sequences)) as pool:
        got = dict(zip(sequences, pool.map(run, sequences), strict=True))
    for seq, results in got.items():
        scaled = [v * (1 + len(seq) % 3) for v in values]
        assert [int(r["SUM"][0, 0]) for r in results] == list(np.cumsum(scaled)), seq
        flags = [r["FLAGS"][0].tolist() for r in results]
        assert flags == [[1, 0]] + [[0, 0]] * (len(values) - 2) + [[0, 1]], seq
        assert {r["CORRID_OUT"][0, 0] for r in results} == {seq.encode()}
    assert max(_batch_sizes(seq_server, "typed_controls")) > 1, "no execution held two rows"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_without_batching_gets_controls_of_shape_one(seq_server: ShoalServer,
                                                           protocol: str) -> None:
    make = _http_step if protocol == "http" else _grpc_step
    step = make(seq_server, "unbatched_sequence", 42 if protocol == "http" else 43,
                shape=(1,))
    assert [int(r["OUTPUT"][0]) for r in _run_sequence(step, VALUES)] == \
        [VALUES[0] + 1, *VALUES[1:]]


def test_the_models_config_keeps_its_controls(seq_server: ShoalServer) -> None:
    config = httpx.get(f"{seq_server.base}/v2/models/simple_dyna_sequence/config").json()
    controls = config["sequence_batching"]["control_input"]
    assert [c["name"] for c in controls] == ["START", "END", "READY", "CORRID"]
    assert [i["name"] for i in config["input"]] == ["INPUT"]
    assert "oldest" in config["sequence_batching"]
