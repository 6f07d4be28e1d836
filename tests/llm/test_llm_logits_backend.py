"""The ``llm`` backend's logits pieces (``backends/llm/logits.py``): the model folder's
processors file, the request inputs, and the ``token_logprobs`` output."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import orjson
import pytest

from shoal.errors import ShoalError
from shoal.llm import Request, Result
from shoal.workers.backends.base import BackendRequest
from shoal.workers.backends.llm.interface import parse_request
from shoal.workers.backends.llm.logits import (
    TokenLogprobs,
    load_logits_post_processors,
    want_token_logprobs,
)

PROCESSORS = """
def ban_five(req_id, logits, ids, stream_ptr, client_id):
    logits[:, 5] = float("-inf")

def batched(req_ids, logits, ids, stream_ptr, client_ids):
    pass

processor_map = {"ban_five": ban_five}
processor_batched = batched
"""


def _load(folder: pathlib.Path, value: str) -> Any:
    return load_logits_post_processors({"logits_post_processors": value}, str(folder))


def test_the_processors_file_gives_named_and_batched_processors(tmp_path: pathlib.Path) -> None:
    (tmp_path / "processors.py").write_text(PROCESSORS)
    config = _load(tmp_path, "processors.py")
    assert config.names == {"ban_five", "batched"}
    assert load_logits_post_processors({}, str(tmp_path)) is None


@pytest.mark.parametrize(("files", "value", "message"), [
    ({}, "../outside.py", "outside the model's folder"),
    ({}, "missing.py", "is not a file"),
    ({"p.py": "raise RuntimeError('boom')"}, "p.py", "failed to import: RuntimeError: boom"),
    ({"p.py": "x = 1"}, "p.py", "defines neither processor_map"),
    ({"p.py": "processor_map = {'a': 3}"}, "p.py", "dict of name -> callable"),
    ({"p.py": "processor_map = {'batched': print}"}, "p.py", "reserved"),
])
def test_bad_processors_files_fail_the_load_naming_the_parameter(
        tmp_path: pathlib.Path, files: dict[str, str], value: str, message: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "outside.py").write_text(PROCESSORS)
    for name, text in files.items():
        (model / name).write_text(text)
    with pytest.raises(ShoalError, match="logits_post_processors") as info:
        _load(model, value)
    assert message in info.value.message


def _parse(**inputs: Any) -> Request:
    request = BackendRequest(1, {k: np.asarray(v) for k, v in inputs.items()}, {}, [], {})
    return parse_request(request, batching=False, tokenizer=None, eos_token_id=2,
                         exclude_input=False).request


def test_inputs_set_the_processor_name_penalties_and_top_count() -> None:
    request = _parse(input_ids=np.array([5, 6], np.int32), request_output_len=np.array([4]),
                     logits_post_processor_name=np.array([b"ban_five"], np.object_),
                     presence_penalty=np.array([0.5], np.float32),
                     frequency_penalty=np.array([1.5], np.float32),
                     num_top_log_probs=np.array([3], np.int32))
    assert request.logits_post_processor_name == "ban_five"
    assert request.sampling_config.presence_penalty == 0.5
    assert request.sampling_config.frequency_penalty == 1.5
    assert request.output_config.num_top_log_probs == 3
    assert want_token_logprobs(request, ["token_logprobs"])
    assert request.output_config.return_log_probs


@pytest.mark.parametrize(("name", "value", "message"), [
    ("num_top_log_probs", np.array([21], np.int32), "must be in 0..20"),
    ("presence_penalty", np.array([np.inf], np.float32), "must be finite"),
    ("logits_post_processor_name", np.array([b"\xff"], np.object_), "not valid UTF-8"),
])
def test_bad_inputs_are_named(name: str, value: Any, message: str) -> None:
    with pytest.raises(ShoalError, match=name) as info:
        _parse(input_ids=np.array([5], np.int32), request_output_len=np.array([1]),
               **{name: value})
    assert message in info.value.message


def test_token_logprobs_entries_carry_each_tokens_text_bytes_and_alternatives(
        tmp_path: pathlib.Path) -> None:
    from tokenizers import Tokenizer

    from shoal.llm.tiny_checkpoint import write_tokenizer

    write_tokenizer(tmp_path, "byte_level", 300)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "Café 日本"
    ids = tokenizer.encode(text).ids
    result = Result(is_final=True, output_token_ids=[[1, *ids]], finish_reasons=[],
                    log_probs=[[-0.5] * len(ids)],
                    top_log_probs=[[[(t, -0.5), (2, float("-inf"))] for t in ids]])
    entries = TokenLogprobs(tokenizer).entries(result)
    assert len(entries) == len(ids)
    assert bytes(b for e in entries for b in e["bytes"]) == text.encode()
    assert all(e["logprob"] == -0.5 and e["top_logprobs"][0]["token"] == e["token"]
               for e in entries)
    assert entries[0]["top_logprobs"][1] == {"token": "</s>", "bytes": list(b"</s>"),
                                             "logprob": -9999.0}
    output = TokenLogprobs(tokenizer).output(result, batching=True)
    assert output.name == "token_logprobs" and output.array.shape == (1, 1)
    assert orjson.loads(output.array[0, 0]) == entries
