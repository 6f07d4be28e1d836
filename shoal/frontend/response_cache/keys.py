"""The cache key of an inference request: a 256-bit BLAKE2b digest over the model name,
version and the broker's runtime generation of that version (so a reload never answers from
entries of the model it replaced), every input's name, datatype, shape and bytes (in the
request's order), the requested output names with their parameters, and the request's own
(custom) parameters.

Framing: one msgpack document holds everything but the input bytes, each input's byte count
included, then the inputs' bytes follow in order; msgpack is self-delimiting and the counts
fix where each input ends, so two different requests never feed the same byte stream. The
digest makes a collision practically impossible (Triton uses a 64-bit hash).

The request parameters are part of the key (Triton leaves them out): a model that reads them
may answer differently, and a wrong answer from the cache is worse than a miss.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final

import msgspec

from shoal.messages import InferRequest, Params, TensorRef

_DIGEST_BYTES: Final = 32
_ENCODER: Final = msgspec.msgpack.Encoder()

# Where an input's bytes are read from; None when they cannot be read here (a CUDA region):
# such a request is not cached.
InputReader = Callable[[TensorRef], "bytes | memoryview | None"]


def _sorted(parameters: Params) -> list[tuple[str, str | int | float | bool]]:
    return sorted(parameters.items()) if parameters else []


def request_key(request: InferRequest, read_input: InputReader,
                generation: int = 0) -> bytes | None:
    """The key of ``request`` to a version's runtime ``generation`` (a reload's answers are
    keyed apart from the ones before it), or None when an input's bytes cannot be read."""
    data: list[bytes | memoryview] = []
    for tensor in request.inputs:
        found = read_input(tensor)
        if found is None:
            return None
        data.append(found)
    head = _ENCODER.encode((
        request.model, request.version, generation,
        [(t.name, t.datatype, t.shape, len(d)) for t, d in zip(request.inputs, data,
                                                               strict=True)],
        [(o.name, _sorted(o.parameters)) for o in request.outputs],
        _sorted(request.parameters)))
    digest = hashlib.blake2b(head, digest_size=_DIGEST_BYTES)
    for each in data:
        digest.update(each)
    return digest.digest()
