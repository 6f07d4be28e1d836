"""The ``llm`` backend's guided decoding: ``guided_decoding_guide_type`` /
``guided_decoding_guide`` in both request forms -> ``Request.guided_decoding_params``, refusals
naming the input, executor messages in the client's names, and the ``guided_decoding_backend``
model parameter."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from shoal.errors import ShoalError
from shoal.llm.guided import GuidedDecodingParams, GuideType
from shoal.llm.tiny_checkpoint import TinyLlamaSpec, build_tiny_llama
from shoal.workers.backends.base import BackendRequest
from shoal.workers.backends.llm.guided import guided_decoding_config
from shoal.workers.backends.llm.interface import client_message, parse_request


def _array(values: list[Any]) -> Any:
    """BYTES inputs as numpy object arrays (as the worker hands them over), numbers as is."""
    return np.array(values, dtype=np.object_ if isinstance(values[0], bytes) else None)


def _request(**inputs: list[Any]) -> BackendRequest:
    return BackendRequest(1, {k: _array(v) for k, v in inputs.items()}, {}, [], {})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("guided-inputs-llama")
    build_tiny_llama(path, TinyLlamaSpec(vocab_size=300, tokenizer="byte_level"))
    return path


@pytest.fixture(scope="module")
def tokenizer(checkpoint: pathlib.Path) -> Any:
    from shoal.llm.checkpoint import load_tokenizer

    return load_tokenizer(checkpoint)


def test_tensor_form_carries_the_guide() -> None:
    parsed = parse_request(_request(
        input_ids=[5, 6], request_output_len=[8], end_id=[2],
        guided_decoding_guide_type=[b"json_schema"], guided_decoding_guide=[b'{"type": "object"}']),
        batching=False, tokenizer=None, eos_token_id=None, exclude_input=False)
    assert parsed.request.guided_decoding_params == GuidedDecodingParams(
        GuideType.JSON_SCHEMA, '{"type": "object"}')


def test_text_form_carries_the_guide_and_json_needs_none(tokenizer: Any) -> None:
    parsed = parse_request(_request(text_input=[b"hi"], guided_decoding_guide_type=[b"JSON"]),
                           batching=False, tokenizer=tokenizer, eos_token_id=2,
                           exclude_input=False)
    assert parsed.request.guided_decoding_params == GuidedDecodingParams(GuideType.JSON)
    unguided = parse_request(_request(text_input=[b"hi"]), batching=False,
                             tokenizer=tokenizer, eos_token_id=2, exclude_input=False)
    assert unguided.request.guided_decoding_params is None


@pytest.mark.parametrize(("inputs", "named"), [
    ({"guided_decoding_guide_type": [b"xml"]}, "input 'guided_decoding_guide_type' must be"),
    ({"guided_decoding_guide_type": [b"regex"]}, "input 'guided_decoding_guide' is required"),
    ({"guided_decoding_guide": [b"a+"]}, "needs input 'guided_decoding_guide_type'"),
    ({"guided_decoding_guide_type": [b"regex", b"json"]}, "must hold one string"),
    ({"guided_decoding_guide_type": [b"regex"], "guided_decoding_guide": [b"\xff"]},
     "not valid UTF-8"),
    ({"guided_decoding_guide_type": [b"regex"], "guided_decoding_guide": [b"a" * 65537]},
     "input 'guided_decoding_guide' is 65537 bytes, over the limit of 65536 bytes"),
    ({"guided_decoding_guide_type": [b"r" * 65]}, "guided_decoding_guide_type' is 65 bytes"),
])
def test_malformed_guide_inputs_are_refused_by_name(inputs: dict[str, Any], named: str) -> None:
    with pytest.raises(ShoalError, match=named):
        parse_request(_request(input_ids=[5], request_output_len=[4], end_id=[2], **inputs),
                      batching=False, tokenizer=None, eos_token_id=None, exclude_input=False)


def test_executor_messages_use_the_input_names() -> None:
    parsed = parse_request(_request(input_ids=[5], request_output_len=[4]), batching=False,
                           tokenizer=None, eos_token_id=None, exclude_input=False)
    assert client_message("guided_decoding_params.guide: invalid regular expression: x",
                          parsed.field_names) == (
        "guided_decoding_guide: invalid regular expression: x")
    assert client_message("guided_decoding_params needs end_id", parsed.field_names) == (
        "guided_decoding_guide_type needs end_id")


def test_guided_decoding_backend_parameter(checkpoint: pathlib.Path,
                                           tmp_path: pathlib.Path) -> None:
    config = guided_decoding_config({}, checkpoint, 2)
    assert config is not None and config.stop_token_ids == [2]
    assert config.encoded_vocab is not None and config.encoded_vocab[:3] == ["", "", ""]
    assert guided_decoding_config({"guided_decoding_backend": "none"}, checkpoint, 2) is None
    assert guided_decoding_config({}, tmp_path, 2) is None  # no tokenizer.json: off
    with pytest.raises(ShoalError, match=r"no tokenizer\.json"):
        guided_decoding_config({"guided_decoding_backend": "xgrammar"}, tmp_path, 2)
    with pytest.raises(ShoalError, match="xgrammar or none"):
        guided_decoding_config({"guided_decoding_backend": "outlines"}, checkpoint, 2)
