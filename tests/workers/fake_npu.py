"""A stand-in ``torch_npu`` package for tests on hosts without Ascend hardware: importing it
gives ``torch`` an ``npu`` namespace whose ``device_count()`` is the number written into the
package (what torch_npu's import does, minus the devices). Never on a production path."""

from __future__ import annotations

import pathlib
import textwrap

_PACKAGE = '''
import torch


class _FakeNpu:
    @staticmethod
    def is_available() -> bool:
        return {count} > 0

    @staticmethod
    def device_count() -> int:
        return {count}


torch.npu = _FakeNpu()
'''


def write_fake_torch_npu(directory: pathlib.Path, count: int) -> pathlib.Path:
    """Write the package under ``directory`` (put it on sys.path / PYTHONPATH); returns it."""
    package = directory / "torch_npu"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(textwrap.dedent(_PACKAGE.format(count=count)))
    return directory
