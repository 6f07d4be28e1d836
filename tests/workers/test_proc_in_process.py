"""The worker in process (``harness.py``): a real python model's batch executed from a stand-in
broker's ``Batch`` and answered in the worker's own segments, and the control thread answering
a metrics scrape while the model is inside ``execute``."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import numpy as np
import pytest

from shoal.messages import BatchResult, CollectCustomMetrics, CustomMetricsSnapshot
from tests.workers.harness import WorkerHarness, inline

MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="in_execute", description="set inside execute",
            kind=pb_utils.MetricFamily.GAUGE)
        self.gauge = self.family.Metric(labels={})

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.gauge.set(float(x.reshape(-1)[0]))
            time.sleep(float(x.reshape(-1)[0]) / 10)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
"""

CONFIG = """
    name: "twice"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


@pytest.fixture
def worker(tmp_path: pathlib.Path) -> Iterator[WorkerHarness]:
    harness = WorkerHarness(tmp_path, MODEL, CONFIG)
    yield harness
    harness.close()


def test_a_batch_is_executed_and_answered_in_the_worker_s_segments(
        worker: WorkerHarness) -> None:
    batch = worker.send_batch([
        (7, [inline("X", np.array([0.0, 1.5], np.float32))], ["Y"]),
        (8, [inline("X", np.array([0.0, -2.0], np.float32))], ["Y"])])
    result = worker.receive(lambda m: isinstance(m, BatchResult) and m.batch_id == batch)
    by_id = {r.request_id: r for r in result.results}
    assert sorted(by_id) == [7, 8] and all(r.error is None for r in by_id.values())
    np.testing.assert_array_equal(worker.array(by_id[7].outputs[0]), [0.0, 3.0])
    np.testing.assert_array_equal(worker.array(by_id[8].outputs[0]), [0.0, -4.0])


def test_the_control_thread_answers_a_scrape_while_the_model_executes(
        worker: WorkerHarness) -> None:
    worker.send_batch([(1, [inline("X", np.array([5.0, 0.0], np.float32))], ["Y"])])
    time.sleep(0.1)  # the model has set its gauge and sleeps 0.5 s inside execute
    worker.send_control(CollectCustomMetrics(42))
    sent = time.monotonic()
    snapshot = worker.receive(lambda m: isinstance(m, CustomMetricsSnapshot))
    assert time.monotonic() - sent < 0.35  # answered before execute returned
    assert snapshot.token == 42
    (family,) = [f for f in snapshot.custom_metrics if f.name == "in_execute"]
    assert family.metrics[0].value == 5.0
    worker.receive(lambda m: isinstance(m, BatchResult))
