"""The cache key of an inference request: a 256-bit BLAKE2b digest over the model name and
version, every input's name, datatype, shape and bytes (in the request's order), the requested
output names with their parameters, and the request's own (custom) parameters. Every piece is
length-prefixed, so two different requests never frame to the same byte stream; the digest
makes a collision practically impossible (Triton uses a 64-bit hash).

The request parameters are part of the key (Triton leaves them out): a model that reads them
may answer differently, and a wrong answer from the cache is worse than a miss.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Final

import orjson

from shoal.messages import InferRequest, Params, TensorRef

_LENGTH: Final = struct.Struct("<Q")
_SIGNED: Final = struct.Struct("<q")
_DIGEST_BYTES: Final = 32

# Where an input's bytes are read from; None when they cannot be read here (a CUDA region):
# such a request is not cached.
InputReader = Callable[[TensorRef], "bytes | memoryview | None"]


def _params_bytes(parameters: Params) -> bytes:
    return orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS) if parameters else b""


def request_key(request: InferRequest, read_input: InputReader) -> bytes | None:
    """The key of ``request``, or None when an input's bytes cannot be read."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)

    def piece(data: bytes | memoryview) -> None:
        digest.update(_LENGTH.pack(len(data)))
        digest.update(data)

    piece(request.model.encode())
    digest.update(_SIGNED.pack(request.version))
    digest.update(_LENGTH.pack(len(request.inputs)))
    for tensor in request.inputs:
        data = read_input(tensor)
        if data is None:
            return None
        piece(tensor.name.encode())
        piece(tensor.datatype.encode())
        piece(_shape_bytes(tensor.shape))
        piece(data)
    digest.update(_LENGTH.pack(len(request.outputs)))
    for output in request.outputs:
        piece(output.name.encode())
        piece(_params_bytes(output.parameters))
    piece(_params_bytes(request.parameters))
    return digest.digest()


def _shape_bytes(shape: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(shape)}q", *shape)
