"""Regenerate the mypy stub of tritonclient's ModelConfig protobuf (``model_config_pb2.pyi``).

tritonclient ships the compiled module but not its ``.proto``, so the ``CodeGeneratorRequest``
that protoc would send a plugin is built from the module's own descriptor and fed to
mypy-protobuf's ``protoc-gen-mypy`` on stdin; the ``.pyi`` it answers is written under
``typings/`` (``mypy_path`` in pyproject.toml). Run it after upgrading tritonclient::

    .venv/bin/python typings/generate.py

The two ``__init__.pyi`` above it are written by hand: their module ``__getattr__`` leaves the
rest of tritonclient ``Any``. Needs the ``test`` extra (mypy-protobuf, types-protobuf). The stub
is committed; nothing in the build or the lint runs this script.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from tritonclient.grpc import model_config_pb2

HERE = Path(__file__).resolve().parent


def _plugin() -> str:
    """protoc-gen-mypy next to this interpreter (the venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "protoc-gen-mypy"
    if beside.exists():
        return str(beside)
    found = shutil.which("protoc-gen-mypy")
    if found is None:
        sys.exit("protoc-gen-mypy not found: pip install mypy-protobuf (the test extra)")
    return found


def main() -> None:
    proto = descriptor_pb2.FileDescriptorProto()
    model_config_pb2.DESCRIPTOR.CopyToProto(proto)
    request = plugin_pb2.CodeGeneratorRequest()
    request.proto_file.append(proto)  # model_config.proto imports no other file
    request.file_to_generate.append(proto.name)
    answer = subprocess.run(
        [_plugin()], input=request.SerializeToString(), capture_output=True, check=True,
    ).stdout
    response = plugin_pb2.CodeGeneratorResponse.FromString(answer)
    if response.error:
        sys.exit(f"protoc-gen-mypy: {response.error}")
    for generated in response.file:
        # the descriptor's name is "model_config.proto": the module is tritonclient.grpc's
        name = os.path.basename(generated.name)
        target = HERE / "tritonclient" / "grpc" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(generated.content)
        print(f"wrote {target.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
