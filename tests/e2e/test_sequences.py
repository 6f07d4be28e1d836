"""The sequence batcher end to end: an accumulator with explicit state (the kind Triton's docs
use), many sequences interleaved from concurrent clients (more sequences than slots), the
control tensors the model sees, and the misuse cases."""

from __future__ import annotations

import concurrent.futures
import pathlib
import textwrap
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.server import ShoalServer

ACCUMULATE = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    """Running sum per sequence, keyed by the CORRID control; START resets it. Rows that are
    not READY (idle slots) are answered with -1 and never change a sum."""

    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def scalar(name):
                return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().ravel()[0])

            value, start, ready, corrid = (scalar(n) for n in ("INPUT", "START", "READY", "CORRID"))
            if not ready:
                total = -1
            else:
                total = (0 if start else self.sums.get(corrid, 0)) + value
                self.sums[corrid] = total
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32))]))
        return responses
'''

CONFIG = '''
name: "accumulate"
backend: "python"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] },
    { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }] },
    { name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }
  ]
}
input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU count: 1 }]
'''


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("seq")
    (repo / "accumulate" / "1").mkdir(parents=True)
    (repo / "accumulate" / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (repo / "accumulate" / "1" / "model.py").write_text(ACCUMULATE)
    server = ShoalServer([str(repo)]).start()
    try:
        yield server
    finally:
        assert server.stop() == 0


def _send(client: httpclient.InferenceServerClient, seq: int, value: int, start: bool,
          end: bool) -> int:
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer("accumulate", [inp], sequence_id=seq, sequence_start=start,
                          sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def test_interleaved_sequences_keep_exact_sums(seq_server: ShoalServer) -> None:
    values = [3, 1, 4, 1, 5]

    def run(seq: int) -> list[int]:
        client = httpclient.InferenceServerClient(seq_server.url)
        return [_send(client, seq, v * seq, i == 0, i == len(values) - 1)
                for i, v in enumerate(values)]

    sequences = list(range(101, 109))  # 8 sequences, 4 slots: the rest wait in the backlog
    with concurrent.futures.ThreadPoolExecutor(len(sequences)) as pool:
        sums = dict(zip(sequences, pool.map(run, sequences), strict=True))
    for seq, got in sums.items():
        assert got == list(np.cumsum([v * seq for v in values])), (seq, got)
    stats = httpclient.InferenceServerClient(seq_server.url).get_inference_statistics(
        "accumulate")["model_stats"][0]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert max(sizes) > 1, "no execution held two sequences"


def test_grpc_sequence_with_string_free_ids(seq_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"localhost:{seq_server.grpc_port}")
    totals = []
    for i, v in enumerate([10, 20, 30]):
        inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[v]], np.int32))
        result = client.infer("accumulate", [inp], sequence_id=777, sequence_start=i == 0,
                              sequence_end=i == 2)
        totals.append(int(result.as_numpy("OUTPUT")[0, 0]))
    assert totals == [10, 30, 60]


def test_request_without_correlation_id_is_rejected(seq_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="correlation ID"):
        client.infer("accumulate", [inp])


def test_continuation_without_start_is_rejected(seq_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    with pytest.raises(InferenceServerException, match="START"):
        _send(client, 4242, 1, start=False, end=False)
    assert client.is_server_live()


def test_batch_size_above_one_is_rejected(seq_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    inp = httpclient.InferInput("INPUT", [2, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1], [2]], np.int32))
    with pytest.raises(InferenceServerException, match="batch"):
        client.infer("accumulate", [inp], sequence_id=5, sequence_start=True)


OLDEST_CONFIG = CONFIG.replace('name: "accumulate"', 'name: "accumulate_oldest"').replace(
    "max_sequence_idle_microseconds: 5000000",
    "max_sequence_idle_microseconds: 5000000\n"
    "  oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 5000 }")


def test_oldest_strategy_keeps_exact_sums(tmp_path: pathlib.Path,
                                          fresh_server_factory: list[ShoalServer]) -> None:
    """The oldest strategy batches across sequences dynamically (never two requests of one
    sequence in one execution); each sequence's running sum must still be exact."""
    model = tmp_path / "accumulate_oldest"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(textwrap.dedent(OLDEST_CONFIG))
    (model / "1" / "model.py").write_text(ACCUMULATE)
    server = ShoalServer([str(tmp_path)]).start()
    fresh_server_factory.append(server)
    values = [2, 7, 1, 8]

    def run(seq: int) -> list[int]:
        client = httpclient.InferenceServerClient(server.url)
        totals = []
        for i, v in enumerate(values):
            inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[v + seq]], np.int32))
            result = client.infer("accumulate_oldest", [inp], sequence_id=seq,
                                  sequence_start=i == 0, sequence_end=i == len(values) - 1)
            totals.append(int(result.as_numpy("OUTPUT")[0, 0]))
        return totals

    sequences = list(range(1, 7))
    with concurrent.futures.ThreadPoolExecutor(len(sequences)) as pool:
        sums = dict(zip(sequences, pool.map(run, sequences), strict=True))
    for seq, got in sums.items():
        assert got == list(np.cumsum([v + seq for v in values])), (seq, got)
    assert server.stop() == 0
