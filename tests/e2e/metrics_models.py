"""Model repositories for the metrics end-to-end tests: a python model with custom metrics
(``pb_utils.MetricFamily``), beside an identity model and a decoupled one."""

from __future__ import annotations

import pathlib
import textwrap

from tests.e2e.models import identity_model, repeat_model

# Counts its requests (a counter per model label), keeps the last batch size (a gauge) and each
# input's first value (a histogram with buckets 1, 10, 100); answers with the counter's value()
# as read in the model.
CUSTOM_METRICS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.requests_family = pb_utils.MetricFamily(
            name="model_requests_seen", description="Requests the model saw",
            kind=pb_utils.MetricFamily.COUNTER)
        self.batch_family = pb_utils.MetricFamily(
            name="model_last_batch", description="Requests in the last execute",
            kind=pb_utils.MetricFamily.GAUGE)
        self.value_family = pb_utils.MetricFamily(
            name="model_input_value", description="First value of each input",
            kind=pb_utils.MetricFamily.HISTOGRAM)
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = self.requests_family.Metric(labels=labels)
        self.batch = self.batch_family.Metric(labels=labels)
        self.values = self.value_family.Metric(labels=labels, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        self.batch.set(len(requests))
        out = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.values.observe(float(value.reshape(-1)[0]))
            self.requests.increment(1)
            seen = np.array([self.requests.value()], dtype=np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", seen)]))
        return out
"""


def custom_metrics_model(repo: pathlib.Path, name: str = "counting") -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
    """).lstrip())
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(CUSTOM_METRICS_MODEL).lstrip())


# Sets a gauge to its input, then reads /metrics itself (at the URL in the request's
# "metrics_url" parameter) inside the same execute, as Triton's QA custom-metrics model does;
# answers with the text it read.
SELF_SCRAPING_MODEL = """
import json
import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(
            name="model_self_scraped", description="Set, then read back in one execute",
            kind=pb_utils.MetricFamily.GAUGE)
        self.gauge = self.family.Metric(labels={"model": args["model_name"]})

    def execute(self, requests):
        out = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.gauge.set(float(value.reshape(-1)[0]))
            url = json.loads(request.parameters())["metrics_url"]
            with urllib.request.urlopen(url, timeout=10) as answer:
                text = answer.read()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "TEXT", np.array([text], dtype=np.object_))]))
        return out
"""


def self_scraping_model(repo: pathlib.Path, name: str = "self_scraping") -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }}]
        output [{{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }}]
    """).lstrip())
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(SELF_SCRAPING_MODEL).lstrip())


def build_metrics_repository(repo: pathlib.Path) -> pathlib.Path:
    """``identity`` (FP32), ``repeat_decoupled``, ``counting`` (custom metrics) and
    ``self_scraping`` (reads /metrics inside execute)."""
    identity_model(repo, "identity", "FP32")
    repeat_model(repo)
    custom_metrics_model(repo)
    self_scraping_model(repo)
    return repo
