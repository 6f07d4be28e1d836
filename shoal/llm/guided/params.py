"""Guided decoding's request and executor settings, named as TensorRT-LLM's
``tensorrt_llm.bindings.executor`` (``GuidedDecodingParams``, ``GuidedDecodingConfig``).

``GuidedDecodingParams`` rides on ``Request.guided_decoding_params``: ``guide_type`` says what
``guide`` is (JSON needs no guide: any JSON value; JSON_SCHEMA a JSON schema text; REGEX a
regular expression; EBNF_GRAMMAR a GBNF / EBNF grammar whose start rule is ``root``;
STRUCTURAL_TAG an xgrammar structural tag, or TensorRT-LLM's ``{"structures": [...],
"triggers": [...]}`` form). ``GuidedDecodingConfig`` rides on ``ExecutorConfig`` and describes
the tokenizer the grammars are compiled against. No import of xgrammar here: these are plain
values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class GuideType(enum.Enum):
    JSON = "json"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF_GRAMMAR = "ebnf_grammar"
    STRUCTURAL_TAG = "structural_tag"


@dataclass(frozen=True)
class GuidedDecodingParams:
    guide_type: GuideType
    guide: str | None = None


class GuidedDecodingBackend(enum.Enum):
    XGRAMMAR = "xgrammar"


@dataclass(frozen=True)
class GuidedDecodingConfig:
    """``encoded_vocab[i]`` is token ``i`` as the tokenizer's vocabulary spells it (byte-level
    BPE: ``Ġ`` for a space ...); an empty string marks a special token, which guided output
    never contains. ``tokenizer_str`` (the ``tokenizer.json`` text) tells xgrammar how the
    vocabulary is encoded. ``stop_token_ids``: tokens that end a guided output when the request
    has no ``end_id`` of its own (TensorRT-LLM's field; shoal requires ``end_id``)."""

    backend: GuidedDecodingBackend
    encoded_vocab: list[str] | None = None
    tokenizer_str: str | None = None
    stop_token_ids: list[int] | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer,
                       stop_token_ids: list[int] | None) -> GuidedDecodingConfig:
        """The config for a ``tokenizers.Tokenizer`` (a checkpoint's ``tokenizer.json``):
        its vocabulary by id, special added tokens blanked."""
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        vocab = [""] * size
        for text, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
            if 0 <= token_id < size:
                vocab[token_id] = text
        for token_id, added in tokenizer.get_added_tokens_decoder().items():
            if added.special and 0 <= token_id < size:
                vocab[token_id] = ""
        return cls(GuidedDecodingBackend.XGRAMMAR, encoded_vocab=vocab,
                   tokenizer_str=tokenizer.to_str(), stop_token_ids=stop_token_ids)
