"""The ``llm`` backend's request tensors -> executor ``Request`` and results -> output tensors,
with and without a batch dimension."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shoal.errors import ShoalError
from shoal.workers.backends.base import BackendRequest
from shoal.workers.backends.llm.interface import (
    client_message,
    parse_request,
    tensor_outputs,
    text_output,
)
from shoal.workers.llm import FinishReason, Result


def _request(**inputs: Any) -> BackendRequest:
    return BackendRequest(1, {k: np.asarray(v) for k, v in inputs.items()}, {}, [], {})


def test_tensor_form_without_a_batch_dimension() -> None:
    parsed = parse_request(
        _request(input_ids=np.array([5, 6, 7, 0], np.int32), input_lengths=np.array([3]),
                 request_output_len=np.array([8]), end_id=np.array([2]),
                 beam_width=np.array([2]), runtime_top_k=np.array([4]),
                 stop_words_list=np.array([[9, 10, 11], [2, 3, -1]], np.int32),
                 streaming=np.array([True])),
        batching=False, tokenizer=None, eos_token_id=2, exclude_input=True)
    request = parsed.request
    assert not parsed.text_form
    assert (request.input_token_ids, request.max_tokens, request.end_id) == ([5, 6, 7], 8, 2)
    assert request.stop_words == [[9, 10], [11]]
    assert request.streaming and request.output_config.exclude_input_from_output
    assert (request.sampling_config.beam_width, request.sampling_config.top_k) == (2, 4)


def test_tensor_form_with_a_batch_dimension_of_one() -> None:
    parsed = parse_request(
        _request(input_ids=np.array([[5, 6]], np.int32), request_output_len=np.array([[4]])),
        batching=True, tokenizer=None, eos_token_id=None, exclude_input=False)
    assert (parsed.request.input_token_ids, parsed.request.max_tokens) == ([5, 6], 4)
    assert parsed.request.end_id is None  # the tensor form has no default end id


def test_end_id_minus_one_means_none() -> None:
    parsed = parse_request(
        _request(input_ids=np.array([5]), request_output_len=np.array([4]),
                 end_id=np.array([-1])),
        batching=False, tokenizer=None, eos_token_id=2, exclude_input=False)
    assert parsed.request.end_id is None


@pytest.mark.parametrize(("inputs", "named"), [
    ({"input_ids": [[5], [6]], "request_output_len": [[4], [4]]}, "batch size must be 1"),
    ({"input_ids": [[5]]}, "request_output_len"),
    ({"request_output_len": [[4]]}, "input_ids"),
    ({"input_ids": [[5]], "request_output_len": [[4]], "max_tokens": [[4]]}, "max_tokens"),
    ({"input_ids": [[5]], "request_output_len": [[4]], "input_lengths": [[3]]},
     "input_lengths"),
    ({"input_ids": [[5]], "request_output_len": [[4]],
      "bad_words_list": [[[5, 6], [3, -1]]]}, "bad_words_list"),
    ({"input_ids": [[5]], "request_output_len": [[4]], "temperature": [[float("nan")]]},
     "temperature"),
    ({"text_input": [[b"hi"]]}, "tokenizer.json"),
])
def test_malformed_requests_name_the_input(inputs: dict[str, Any], named: str) -> None:
    with pytest.raises(ShoalError) as caught:
        parse_request(_request(**inputs), batching=True, tokenizer=None, eos_token_id=None,
                      exclude_input=False)
    assert named in caught.value.message


def test_executor_messages_use_the_client_names() -> None:
    parsed = parse_request(
        _request(input_ids=np.array([5]), request_output_len=np.array([4])),
        batching=False, tokenizer=None, eos_token_id=None, exclude_input=False)
    message = client_message("input length 1 + max_tokens 4 = 5 exceeds ...", parsed.field_names)
    assert message == "input_ids length 1 + request_output_len 4 = 5 exceeds ..."


def test_outputs_pad_beams_and_add_the_batch_dimension() -> None:
    result = Result(is_final=True, output_token_ids=[[4, 5, 6], [7]],
                    finish_reasons=[FinishReason.LENGTH] * 2, cum_log_probs=[-1.5, -0.5],
                    log_probs=[[-0.5, -0.5, -0.5], [-0.5]])
    outputs = {t.name: t.array for t in tensor_outputs(result, batching=True, pad_id=2)}
    assert outputs["output_ids"].tolist() == [[[4, 5, 6], [7, 2, 2]]]
    assert outputs["sequence_length"].tolist() == [[3, 1]]
    assert outputs["cum_log_probs"].tolist() == [[-1.5, -0.5]]
    assert outputs["output_log_probs"].tolist() == [[[-0.5, -0.5, -0.5], [-0.5, 0.0, 0.0]]]
    assert text_output("é", batching=False)[0].array.tolist() == ["é".encode()]
