"""Guided decoding in the ``llm`` backend: the model parameter that turns it on, and the request
inputs that ask for it.

Model parameter ``guided_decoding_backend`` (TensorRT-LLM's backend name): ``xgrammar`` (the
default) builds the executor's ``GuidedDecodingConfig`` from the checkpoint's ``tokenizer.json``
at load, with the checkpoint's ``eos_token_id`` as stop token; ``none`` turns guided decoding
off. Without a ``tokenizer.json``, or with the ``xgrammar`` package missing, the default is off
(logged) and guided requests are refused; naming ``xgrammar`` then fails the load.

Request inputs, the same in the tensor and the text form (TensorRT-LLM backend names, BYTES
[1]): ``guided_decoding_guide_type`` (``json``, ``json_schema``, ``regex``, ``ebnf_grammar`` or
``structural_tag``) and ``guided_decoding_guide`` (the schema / regex / grammar / tag text; not
needed for ``json``).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from shoal.errors import invalid_arg
from shoal.llm.guided import GuidedDecodingConfig, GuidedDecodingParams, GuideType

logger = logging.getLogger(__name__)

PARAMETER: Final = "guided_decoding_backend"
TYPE_INPUT: Final = "guided_decoding_guide_type"
GUIDE_INPUT: Final = "guided_decoding_guide"
# executor field -> input name, for executor validation messages (interface.client_message)
FIELD_NAMES: Final = {"guided_decoding_params.guide": GUIDE_INPUT,
                      "guided_decoding_params": TYPE_INPUT}
_TYPES: Final = {t.value: t for t in GuideType}
# The largest guide a request may send. Compiling a guide (xgrammar, on the executor's thread)
# grows faster than its size: a 60 KB JSON schema took 0.14 s here, a 310 KB one 3 s and a
# 1.3 MB one 87 s, stalling every generation of the instance meanwhile.
MAX_GUIDE_BYTES: Final = 64 * 1024


def guided_decoding_config(parameters: dict[str, str], checkpoint_dir: Path,
                           eos_token_id: int | None) -> GuidedDecodingConfig | None:
    """The executor's guided decoding config for this model, or None (off)."""
    from shoal.llm.checkpoint import load_tokenizer

    raw = parameters.get(PARAMETER, "").strip().lower()
    if raw not in ("", "xgrammar", "none"):
        raise invalid_arg(f"llm backend: {PARAMETER} must be xgrammar or none, got '{raw}'")
    if raw == "none":
        return None
    missing = None
    if importlib.util.find_spec("xgrammar") is None:
        missing = "the xgrammar package is not installed"
    tokenizer = load_tokenizer(checkpoint_dir)
    if tokenizer is None:
        missing = "the checkpoint has no tokenizer.json"
    if missing is not None:
        if raw == "xgrammar":
            raise invalid_arg(f"llm backend: {PARAMETER} xgrammar: {missing}")
        logger.info("llm backend: guided decoding is off: %s", missing)
        return None
    assert tokenizer is not None
    stops = [] if eos_token_id is None else [eos_token_id]
    return GuidedDecodingConfig.from_tokenizer(tokenizer, stops)


def guided_params(inputs: dict[str, npt.NDArray[Any]]) -> GuidedDecodingParams | None:
    """The request's guide, or None when it sends no ``guided_decoding_guide_type``. Raises
    INVALID_ARG naming the input."""
    guide_type = _one_string(inputs, TYPE_INPUT, 64)
    guide = _one_string(inputs, GUIDE_INPUT, MAX_GUIDE_BYTES)
    if guide_type is None:
        if guide is not None:
            raise invalid_arg(f"input '{GUIDE_INPUT}' needs input '{TYPE_INPUT}' (json, "
                              f"json_schema, regex, ebnf_grammar or structural_tag)")
        return None
    kind = _TYPES.get(guide_type.strip().lower())
    if kind is None:
        raise invalid_arg(f"input '{TYPE_INPUT}' must be one of {', '.join(_TYPES)}, got "
                          f"'{guide_type[:64]}'")
    if kind is not GuideType.JSON and not guide:
        raise invalid_arg(f"input '{GUIDE_INPUT}' is required with {TYPE_INPUT} "
                          f"'{kind.value}' (the {kind.value.replace('_', ' ')})")
    return GuidedDecodingParams(kind, guide or None)


def _one_string(inputs: dict[str, npt.NDArray[Any]], name: str, max_bytes: int) -> str | None:
    array = inputs.get(name)
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    if flat.size != 1:
        raise invalid_arg(f"input '{name}' must hold one string, got shape "
                          f"{list(np.asarray(array).shape)}")
    item = flat[0]
    raw = item if isinstance(item, bytes) else str(item).encode()
    if len(raw) > max_bytes:
        raise invalid_arg(f"input '{name}' is {len(raw)} bytes, over the limit of {max_bytes} "
                          f"bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_arg(f"input '{name}' is not valid UTF-8") from None
