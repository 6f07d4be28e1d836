"""Guided decoding (structured output) for the LLM executor, on xgrammar: a request's output is
held to a JSON schema, any JSON, a regular expression, an EBNF grammar or a structural tag.

``params.py``: ``GuidedDecodingParams`` / ``GuidedDecodingConfig`` (TensorRT-LLM's names; plain
values, importable without xgrammar). ``grammars.py``: guides compiled once per distinct guide
(an LRU). ``decoder.py``: ``GuidedDecoder``, the executor's validation and per-iteration token
masks. xgrammar is imported only when an executor has a ``guided_decoding_config``.
"""

from shoal.llm.guided.params import (
    GuidedDecodingBackend,
    GuidedDecodingConfig,
    GuidedDecodingParams,
    GuideType,
)

__all__ = ["GuideType", "GuidedDecodingBackend", "GuidedDecodingConfig", "GuidedDecodingParams"]
