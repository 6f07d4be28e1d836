"""A forest's scores (``forest.Forest``) to Triton FIL's ``output__0``, per row:

- ``output_class: false`` (regression): the scores as they are, ``[num_class]`` (``[1]``).
- ``predict_proba: true``: the class probabilities, ``[num_class]``; a binary model that scores
  the positive class only gives ``[1 - p, p]`` when the output has 2 values, ``[p]`` when 1.
- otherwise (class ids, as FP32): binary models, class 1 where the positive-class probability
  is above ``threshold`` (0.5 when unset); multi-class models, the most probable class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.errors import invalid_arg
from shoal.workers.backends.fil.params import OUTPUT_NAME, FilParams

Array = npt.NDArray[Any]
DEFAULT_THRESHOLD = 0.5


def output_width(params: FilParams, num_class: int, configured: int) -> int:
    """The values per row of ``output__0`` for this model; ``configured`` is the config's one
    output dim, accepted when it is one of the widths FIL gives. Raises INVALID_ARG."""
    if not params.output_class:
        allowed = [num_class]
    elif params.predict_proba:
        allowed = [1, 2] if num_class == 1 else [num_class]
    else:
        allowed = [1]
    if configured not in allowed:
        what = ("regression values" if not params.output_class else
                "class probabilities" if params.predict_proba else "class ids")
        raise invalid_arg(f"output '{OUTPUT_NAME}' has dims [{configured}], expected "
                          f"{' or '.join(f'[{w}]' for w in allowed)} for this model's {what} "
                          f"({num_class} score(s) per row; see the parameters 'output_class' "
                          "and 'predict_proba')")
    return configured


def fil_output(params: FilParams, scores: Array, width: int) -> Array:
    """FP32 ``[rows, width]`` from FP32 scores ``[rows, num_class]``."""
    if not params.output_class:
        return scores
    binary = scores.shape[1] <= 2
    positive = scores[:, -1]
    if params.predict_proba:
        if scores.shape[1] == 1 and width == 2:
            return np.stack([1.0 - positive, positive], axis=1).astype(np.float32)
        return scores
    if binary:
        threshold = DEFAULT_THRESHOLD if params.threshold is None else params.threshold
        return (positive > threshold).astype(np.float32).reshape(-1, 1)
    classes: Array = np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)
    return classes
