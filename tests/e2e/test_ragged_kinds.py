"""Every ``batch_input`` kind through the real server, over HTTP and gRPC.

A TorchScript model takes one ragged input (``dims: [ -1, -1 ]``) plus all six batch inputs and
echoes what it received: the batch-level tensors are flattened and broadcast into every batch
row, so each client gets the whole batch's view. Concurrent requests of different shapes land in
one dynamic batch; each client finds its own slot in the echoed concatenated input, and the test
rebuilds, from the requests that shared the batch, what Triton's model_config.proto defines for
each kind:

- BATCH_ELEMENT_COUNT: ``[N]``, the element count of each request's source input (batch dim
  included);
- BATCH_ACCUMULATED_ELEMENT_COUNT: ``[N]``, the running sum of those counts;
- BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: ``[N + 1]``, 0 then the running sum;
- BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: shape ``[max element count]`` (data uninitialized);
- BATCH_ITEM_SHAPE: ``[batch size, len(input dims)]``, each batch item's shape without the batch
  dim (a batch-2 request gives two rows);
- BATCH_ITEM_SHAPE_FLATTEN: the same values, 1-D.

The ragged input reaches the model as the 1-D concatenation of every request's elements, and the
BATCH_SCATTER_WITH_INPUT_SHAPE output gives each request exactly its own (doubled) data back.
A round in which no two requests share a batch is retried; if none batches, the test fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

MODEL = "ragged_kinds"
ROUNDS = 5  # attempts at getting two or more requests into one batch

CONFIG = """
name: "ragged_kinds"
backend: "pytorch"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]
output [
  { name: "ECHO" data_type: TYPE_FP32 dims: [ -1, -1 ] },
  { name: "ALL_IN" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "COUNT_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "ACC_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "ACC0_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "MAX_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ITEM_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "FLAT_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "RANKS_OUT" data_type: TYPE_INT32 dims: [ 7 ] }
]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32
    source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ACC" data_type: TYPE_FP32
    source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ACC0" data_type: TYPE_INT32
    source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX" data_type: TYPE_INT32
    source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE target_name: "ITEM" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT" data_type: TYPE_FP32
    source_input: "INPUT" }
]
batch_output [ { target_name: "ECHO" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _spread(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` flattened into one row, repeated for every batch row (so each request gets it)."""
    return t.reshape(1, -1).expand(rows, -1).contiguous()


class EchoEveryKind(torch.nn.Module):
    # Inputs are matched to the config by forward() argument name.
    def forward(self, INPUT: torch.Tensor, COUNT: torch.Tensor, ACC: torch.Tensor,
                ACC0: torch.Tensor, MAX: torch.Tensor, ITEM: torch.Tensor, FLAT: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor]:
        rows = ITEM.size(0)  # total batch size: the rows the unscattered outputs are split by
        ranks = torch.tensor([INPUT.dim(), COUNT.dim(), ACC.dim(), ACC0.dim(), MAX.dim(),
                              ITEM.dim(), FLAT.dim()], dtype=torch.int32)
        return (INPUT * 2.0, _spread(INPUT, rows), _spread(COUNT, rows), _spread(ACC, rows),
                _spread(ACC0, rows), torch.full((rows, 1), MAX.size(0), dtype=torch.int32),
                _spread(ITEM, rows), _spread(FLAT, rows), _spread(ranks, rows))


# Full request shapes [batch, d1, d2]: different element counts, one batch-2 request; 7 batch
# items in all, under max_batch_size 8 so a single batch can hold every request.
SHAPES: tuple[tuple[int, int, int], ...] = ((1, 1, 3), (1, 2, 5), (2, 3, 1), (1, 4, 2), (2, 1, 1))


def request_data(index: int, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """Values unique to request ``index`` (so it can find itself in the batch's concatenation)."""
    count = int(np.prod(shape))
    return (1000.0 * (index + 1) + np.arange(count, dtype=np.float32)).reshape(shape)


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("ragged_kinds")
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    scripted: Any = torch.jit.script(EchoEveryKind())
    scripted.save(str(repo / MODEL / "1" / "model.pt"))
    server = ShoalServer([str(repo)]).start()
    try:
        yield server
    finally:
        log = server.log()
        assert server.stop() == 0, log


@dataclass
class Answer:
    data: npt.NDArray[np.float32]  # what the request sent
    outputs: dict[str, npt.NDArray[Any]]

    @property
    def slot(self) -> int:
        """The request's start offset in the batch's concatenated ragged input."""
        flat = self.outputs["ALL_IN"][0]
        (hits,) = np.nonzero(flat == self.data.reshape(-1)[0])
        assert len(hits) == 1, "a request's first value appears once in its batch"
        return int(hits[0])


OUTPUT_NAMES = ("ECHO", "ALL_IN", "COUNT_OUT", "ACC_OUT", "ACC0_OUT", "MAX_OUT", "ITEM_OUT",
                "FLAT_OUT", "RANKS_OUT")


def http_infer(server: ShoalServer) -> Callable[[npt.NDArray[np.float32]], dict[str, Any]]:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)

    def infer(data: npt.NDArray[np.float32]) -> dict[str, Any]:
        inp = httpclient.InferInput("INPUT", list(data.shape), "FP32")
        inp.set_data_from_numpy(data, binary_data=True)
        result = client.infer(MODEL, [inp])
        return {name: result.as_numpy(name) for name in OUTPUT_NAMES}

    return infer


def grpc_infer(server: ShoalServer) -> Callable[[npt.NDArray[np.float32]], dict[str, Any]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def infer(data: npt.NDArray[np.float32]) -> dict[str, Any]:
        inp = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer(MODEL, [inp], client_timeout=60)
        return {name: result.as_numpy(name) for name in OUTPUT_NAMES}

    return infer


def send_round(make_infer: Callable[[], Callable[[npt.NDArray[np.float32]], dict[str, Any]]]
               ) -> list[Answer]:
    """One request per shape, all released at once (each thread makes its own client first:
    the HTTP client is gevent based and stays on the thread that made it)."""
    datas = [request_data(i, shape) for i, shape in enumerate(SHAPES)]
    barrier = threading.Barrier(len(datas), timeout=60)
    results: list[dict[str, Any] | BaseException | None] = [None] * len(datas)

    def run(i: int) -> None:
        try:
            infer = make_infer()
            barrier.wait()
            results[i] = infer(datas[i])
        except BaseException as exc:  # reported below, on the test's thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(datas))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    answers = []
    for data, result in zip(datas, results, strict=True):
        assert isinstance(result, dict), f"request of shape {data.shape} failed: {result!r}"
        answers.append(Answer(data, result))
    return answers


def group_by_batch(answers: list[Answer]) -> list[list[Answer]]:
    """Requests that shared an execution, each group in batch order (by slot in ALL_IN)."""
    groups: dict[bytes, list[Answer]] = {}
    for answer in answers:
        all_in = answer.outputs["ALL_IN"]
        assert (all_in == all_in[0]).all(), "every row of a request carries the same echo"
        groups.setdefault(all_in[0].tobytes(), []).append(answer)
    return [sorted(group, key=lambda a: a.slot) for group in groups.values()]


def check_batch(group: list[Answer]) -> None:
    """Each kind's echo equals Triton's definition for the requests of this batch."""
    shapes = [a.data.shape for a in group]
    counts = [int(np.prod(s)) for s in shapes]
    concatenated = np.concatenate([a.data.reshape(-1) for a in group])
    items = [list(s[1:]) for s in shapes for _ in range(s[0])]
    for answer in group:
        out = answer.outputs
        batch = answer.data.shape[0]
        for name in OUTPUT_NAMES[1:]:  # unscattered outputs are split by the request's rows
            assert out[name].shape[0] == batch, f"{name} has {out[name].shape[0]} rows"
        # every request in the batch is one of ours: the concatenation is exactly theirs
        np.testing.assert_array_equal(out["ALL_IN"][0], concatenated)
        np.testing.assert_array_equal(out["COUNT_OUT"][0], counts)
        np.testing.assert_array_equal(out["ACC_OUT"][0], np.cumsum(counts))
        assert out["ACC_OUT"].dtype == np.float32  # the batch input's configured data type
        np.testing.assert_array_equal(out["ACC0_OUT"][0], [0, *np.cumsum(counts)])
        np.testing.assert_array_equal(out["MAX_OUT"], np.full((batch, 1), max(counts)))
        np.testing.assert_array_equal(out["ITEM_OUT"][0], np.array(items).reshape(-1))
        np.testing.assert_array_equal(out["FLAT_OUT"][0], np.array(items).reshape(-1))
        assert out["FLAT_OUT"].dtype == np.float32
        # ranks: INPUT 1-D; COUNT, ACC, ACC0, MAX 1-D; ITEM [batch, 2]; FLAT 1-D
        np.testing.assert_array_equal(out["RANKS_OUT"][0], [1, 1, 1, 1, 1, 2, 1])
        # scattered by the request's own input shape: exactly its own data
        assert out["ECHO"].shape == answer.data.shape
        np.testing.assert_array_equal(out["ECHO"], answer.data * 2)


def run_until_batched(make_infer: Callable[[], Callable[[npt.NDArray[np.float32]],
                                                        dict[str, Any]]]) -> int:
    """Rounds until one batch holds two or more requests; every round's batches are checked.
    Returns the largest number of requests seen in one batch."""
    largest = 0
    for _ in range(ROUNDS):
        groups = group_by_batch(send_round(make_infer))
        for group in groups:
            check_batch(group)
        largest = max(largest, *(len(g) for g in groups))
        if largest > 1:
            return largest
    pytest.fail(f"no two of {len(SHAPES)} concurrent requests shared a batch in {ROUNDS} rounds")


def _executions(server: ShoalServer) -> tuple[int, int]:
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(MODEL)
    model = stats["model_stats"][0]
    return int(model["inference_count"]), int(model["execution_count"])


def test_every_batch_input_kind_over_http(ragged_server: ShoalServer) -> None:
    inferred_before, executions_before = _executions(ragged_server)
    assert run_until_batched(lambda: http_infer(ragged_server)) > 1
    inferred, executions = _executions(ragged_server)
    # the server's own statistics agree: fewer executions than batch items inferred
    assert executions - executions_before < inferred - inferred_before


def test_every_batch_input_kind_over_grpc(ragged_server: ShoalServer) -> None:
    assert run_until_batched(lambda: grpc_infer(ragged_server)) > 1


def test_a_request_alone_gets_the_single_request_values(ragged_server: ShoalServer) -> None:
    data = request_data(7, (1, 2, 3))
    (group,) = group_by_batch([Answer(data, http_infer(ragged_server)(data))])
    check_batch(group)
    out = group[0].outputs
    np.testing.assert_array_equal(out["ACC0_OUT"][0], [0, 6])
    np.testing.assert_array_equal(out["ITEM_OUT"][0], [2, 3])
