"""Step 3 of the sentence_embedding ensemble: TOKEN_EMBEDDINGS (FP32 [rows, tokens, 384]) and
ATTENTION_MASK (INT64 [rows, tokens]) -> EMBEDDING (FP32 [rows, 384]).

The same arithmetic as all-MiniLM-L6-v2's sentence-transformers modules: ``Pooling`` with
``pooling_mode_mean_tokens`` (sum of the token vectors where the mask is 1, divided by the number
of such tokens, at least 1e-9) then ``Normalize`` (divide by the L2 norm, at least 1e-12) when
the config parameter ``normalize`` is "true" (the default).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

FloatArray = npt.NDArray[np.float32]


def mean_pool(token_embeddings: FloatArray, attention_mask: npt.NDArray[Any]) -> FloatArray:
    """Mean of each row's token vectors over the tokens whose mask is nonzero."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (token_embeddings * mask).sum(axis=1)
    counts = np.maximum(mask.sum(axis=1), np.float32(1e-9))
    mean: FloatArray = (summed / counts).astype(np.float32)
    return mean


def l2_normalize(vectors: FloatArray) -> FloatArray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: FloatArray = (vectors / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
    return unit


def check_shapes(token_embeddings: npt.NDArray[Any], attention_mask: npt.NDArray[Any]) -> None:
    """ValueError naming both inputs unless they describe the same rows and tokens."""
    if token_embeddings.ndim != 3 or token_embeddings.shape[:2] != attention_mask.shape:
        raise ValueError(f"input 'TOKEN_EMBEDDINGS' has shape {list(token_embeddings.shape)}, "
                         f"which does not match input 'ATTENTION_MASK' of shape "
                         f"{list(attention_mask.shape)} (expected [rows, tokens, dim] and "
                         "[rows, tokens])")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameter = config.get("parameters", {}).get("normalize", {})
        self.normalize = str(parameter.get("string_value", "true")).lower() != "false"

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._pool(request) for request in requests]

    def _pool(self, request: Any) -> Any:
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKEN_EMBEDDINGS").as_numpy()
        mask = pb_utils.get_input_tensor_by_name(request, "ATTENTION_MASK").as_numpy()
        try:
            check_shapes(tokens, mask)
        except ValueError as exc:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG))
        embedding = mean_pool(tokens, mask)
        if self.normalize:
            embedding = l2_normalize(embedding)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", embedding)])
