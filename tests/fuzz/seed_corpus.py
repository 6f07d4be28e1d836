"""Seed corpora for the atheris harnesses, taken from the unit tests: runs the parsers' unit tests
with the parser entry points wrapped so that every input they see is written, in the harness's
input format, to ``.fuzz/<target>/corpus/<sha1>``.

Run: ``.venv/bin/python tests/fuzz/seed_corpus.py`` (the harnesses do it when their corpus is
empty). Formats (see each harness): json = one byte (model, header-length mode), an optional
2-byte header length, the body; config = one byte (GPU count), the config.pbtxt bytes; load =
a JSON document ``{"name", "parameters"}`` (``file:`` values base64, as over HTTP); grpc = a
serialized ModelInferRequest.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable
from typing import Any, Final

ROOT: Final = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ_DIR: Final = os.path.join(ROOT, ".fuzz")
UNIT_TESTS: Final = (
    "tests/frontend/http/test_codec.py", "tests/frontend/http/test_infer_app.py",
    "tests/frontend/http/test_shared_memory_http.py", "tests/frontend/http/test_validation.py",
    "tests/config/test_model_config.py", "tests/config/test_model_warmup_config.py",
    "tests/config/test_load_overrides.py", "tests/frontend/grpc/test_convert.py",
)
# header-length modes of the json format (low two bits of the first byte)
ABSENT, RAW, GIVEN = 0, 1, 2


def write_seed(target: str, data: bytes) -> None:
    directory = os.path.join(FUZZ_DIR, target, "corpus")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, hashlib.sha1(data).hexdigest()), "wb") as file:
        file.write(data)


def json_seed(body: bytes, header_length: str | None, model_index: int) -> bytes:
    """The json harness's input for (body, Inference-Header-Content-Length, model)."""
    if header_length is None:
        return bytes([model_index << 2 | ABSENT]) + body
    if header_length.strip() == "0":
        return bytes([model_index << 2 | RAW]) + body
    try:
        length = min(max(int(header_length), 0), 0xFFFF)
    except ValueError:
        length = 0xFFFF
    return bytes([model_index << 2 | GIVEN]) + struct.pack("<H", length) + body


def load_seed(name: str, parameters: dict[str, Any]) -> bytes:
    encoded = {key: base64.b64encode(value).decode() if isinstance(value, bytes) else value
               for key, value in parameters.items()}
    return json.dumps({"name": name, "parameters": encoded}).encode()


def _recording(record: Callable[..., None], function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(Exception):  # an unwritable seed does not fail the test
            record(*args, **kwargs)
        return function(*args, **kwargs)

    return wrapper


def pytest_configure(config: Any) -> None:
    """Wrap the entry points before any test module imports them."""
    import shoal.config.load_overrides as overrides
    import shoal.config.model_config as model_config
    import shoal.frontend.grpc.convert as convert
    import shoal.frontend.http.codec as codec

    def decode(body: Any, header_length: str | None, model: Any, *_: Any) -> None:
        write_seed("json", json_seed(bytes(body), header_length, len(model.name) % 5))

    def config_text(text: str, *_: Any, **__: Any) -> None:
        write_seed("config", b"\x00" + text.encode("utf-8", "surrogatepass"))

    def load_parameters(name: str, parameters: Any) -> None:
        write_seed("load", load_seed(name, dict(parameters)))

    def config_override(name: str, config_json: str) -> None:
        write_seed("load", load_seed(name, {"config": config_json}))

    def grpc_request(message: Any, *_: Any) -> None:
        write_seed("grpc", message.SerializeToString())

    codec.decode_infer_request = _recording(decode, codec.decode_infer_request)
    model_config.parse_config_text = _recording(config_text, model_config.parse_config_text)
    overrides.check_load_parameters = _recording(load_parameters,
                                                 overrides.check_load_parameters)
    overrides.parse_config_override = _recording(config_override,
                                                 overrides.parse_config_override)
    convert.decode_model_infer_request = _recording(grpc_request,
                                                    convert.decode_model_infer_request)


def main() -> int:
    import pytest

    sys.path.insert(0, ROOT)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "tests.fuzz.seed_corpus",
                        "--no-header", "-o", "addopts=", *UNIT_TESTS])
    for target in ("json", "config", "load", "grpc"):
        directory = os.path.join(FUZZ_DIR, target, "corpus")
        count = len(os.listdir(directory)) if os.path.isdir(directory) else 0
        print(f"seed corpus {target}: {count} inputs in {directory}")
    return 0 if code in (0, 1) else int(code)


if __name__ == "__main__":
    sys.exit(main())
