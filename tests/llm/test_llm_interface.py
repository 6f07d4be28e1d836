"""The ``llm`` backend's request tensors -> executor ``Request`` and results -> output tensors,
with and without a batch dimension; batches of several items split into one ``Request`` each
and their outputs stacked back (TensorRT-LLM's ``tensorrt_llm`` model rules)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from shoal.errors import ShoalError
from shoal.llm import FinishReason, Result
from shoal.llm.tiny_checkpoint import write_tokenizer
from shoal.llm.validation import Limits, request_error
from shoal.workers.backends.base import BackendRequest
from shoal.workers.backends.llm.interface import (
    batch_index_output,
    client_message,
    parse_request,
    parse_requests,
    stack_items,
    tensor_outputs,
    text_output,
)


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
    ({"input_ids": [[5], [6]], "request_output_len": [[4], [4]]}, "batch size 2 exceeds"),
    ({"input_ids": 5, "request_output_len": [[4]]}, "'input_ids' needs a batch dimension"),
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


# ------------------------------------------------------------------ batches of several items


def _batch(**inputs: Any) -> list[Any]:
    return parse_requests(_request(**inputs), batching=True, tokenizer=None, eos_token_id=None,
                          exclude_input=True, max_batch_size=4)


def test_a_batch_splits_into_one_request_per_item() -> None:
    items = _batch(input_ids=np.array([[5, 6, 7], [8, 0, 0], [9, 10, 0]], np.int32),
                   input_lengths=np.array([[3], [1], [2]], np.int32),
                   request_output_len=np.array([[4], [5], [6]], np.int32),
                   end_id=np.array([[2], [-1], [3]], np.int32),
                   streaming=np.array([[True], [True], [True]]))
    requests = [item.request for item in items]
    assert [r.input_token_ids for r in requests] == [[5, 6, 7], [8], [9, 10]]
    assert [r.max_tokens for r in requests] == [4, 5, 6]
    assert [r.end_id for r in requests] == [2, None, 3]
    assert all(r.streaming for r in requests)


@pytest.mark.parametrize(("inputs", "named"), [
    # rows are padded to the longest: without input_lengths the padding would be prompt
    ({"input_ids": [[5, 6], [7, 0]], "request_output_len": [[4], [4]]}, "'input_lengths'"),
    # every input carries the batch (Triton's rule, as TensorRT-LLM slices every tensor)
    ({"input_ids": [[5], [6]], "input_lengths": [[1], [1]], "request_output_len": [[4]]},
     "'request_output_len': batch size 1 differs from input_ids's 2"),
    ({"input_ids": [[5]] * 5, "input_lengths": [[1]] * 5, "request_output_len": [[4]] * 5},
     "input 'input_ids': batch size 5 exceeds the model's max_batch_size 4"),
    ({"input_ids": [[5], [6]], "input_lengths": [[1], [1]], "request_output_len": [[4], [0]],
      "temperature": [[1.0], [float("nan")]]}, "batch item 1: input 'temperature'"),
    ({"input_ids": [[5], [6]], "input_lengths": [[1], [2]], "request_output_len": [[4], [4]]},
     "batch item 1: input 'input_lengths' = 2"),
    ({"input_ids": [[5], [6]], "input_lengths": [[1], [1]], "request_output_len": [[4], [4]],
      "streaming": [[True], [False]]}, "'streaming' must be the same for every batch item"),
])
def test_bad_batches_name_the_input(inputs: dict[str, Any], named: str) -> None:
    with pytest.raises(ShoalError) as caught:
        _batch(**inputs)
    assert named in caught.value.message


def test_a_text_batch_gives_one_prompt_per_row(tmp_path: pathlib.Path) -> None:
    from tokenizers import Tokenizer

    write_tokenizer(tmp_path, "byte_level", 512)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    prompts = ["Hello", "one two", "Zürich"]
    items = parse_requests(
        _request(text_input=np.array([[p.encode()] for p in prompts], dtype=object),
                 max_tokens=np.array([[3], [4], [5]], np.int32)),
        batching=True, tokenizer=tokenizer, eos_token_id=2, exclude_input=True,
        max_batch_size=8)
    assert [i.request.input_token_ids for i in items] == [tokenizer.encode(p).ids
                                                          for p in prompts]
    assert [i.request.max_tokens for i in items] == [3, 4, 5]
    assert all(i.text_form and i.request.end_id == 2 for i in items)


def test_stacked_items_pad_with_each_items_pad_id() -> None:
    first = Result(is_final=True, output_token_ids=[[4, 5, 6], [7]],
                   finish_reasons=[FinishReason.LENGTH] * 2)
    second = Result(is_final=True, output_token_ids=[[8]], finish_reasons=[FinishReason.END_ID])
    items = [tensor_outputs(first, batching=False, pad_id=2),
             tensor_outputs(second, batching=False, pad_id=0)]
    outputs = {t.name: t.array for t in stack_items(items, [2, 0])}
    assert outputs["output_ids"].tolist() == [[[4, 5, 6], [7, 2, 2]], [[8, 0, 0], [0, 0, 0]]]
    assert outputs["sequence_length"].tolist() == [[3, 1], [1, 0]]  # a beam it lacks: 0
    assert outputs["output_log_probs"].shape == (2, 2, 0)
    texts = stack_items([text_output("a", batching=False), text_output("bc", batching=False)],
                        [0, 0])
    assert texts[0].array.tolist() == [[b"a"], [b"bc"]]
    index = batch_index_output(range(3), batching=True)
    assert (index.name, index.datatype, index.array.tolist()) == (
        "batch_index", "INT32", [[0], [1], [2]])
    assert batch_index_output([1], batching=True).array.shape == (1, 1)


def test_seed_is_read_under_trtllms_stock_name_too() -> None:
    """TensorRT-LLM's stock config declares ``seed``; ``random_seed`` wins when both come."""
    def seed(**extra: Any) -> int | None:
        return parse_request(_request(input_ids=np.array([5, 6], np.int32),
                                      request_output_len=np.array([4]), **extra),
                             batching=False, tokenizer=None, eos_token_id=2,
                             exclude_input=False).request.sampling_config.seed

    assert seed(seed=np.array([7], np.uint64)) == 7
    assert seed(seed=np.array([7], np.uint64), random_seed=np.array([9], np.uint64)) == 9
    assert seed() is None


@pytest.mark.parametrize(("given", "named"), [
    ({"seed": np.array([-1], np.int64)}, "seed"),
    ({"random_seed": np.array([-1], np.int64)}, "random_seed"),
    ({"seed": np.array([1], np.int64), "random_seed": np.array([-1], np.int64)}, "random_seed"),
])
def test_a_bad_seed_is_reported_under_the_input_it_came_in(given: dict[str, Any],
                                                           named: str) -> None:
    parsed = parse_request(_request(input_ids=np.array([5, 6], np.int32),
                                    request_output_len=np.array([4]), **given),
                           batching=False, tokenizer=None, eos_token_id=2, exclude_input=False)
    problem = request_error(parsed.request, Limits(vocab_size=100, max_beam_width=1,
                                                   max_seq_len=64, num_blocks=8,
                                                   tokens_per_block=8))
    assert problem is not None
    assert client_message(problem, parsed.field_names) == f"{named} must be >= 0, got -1"
