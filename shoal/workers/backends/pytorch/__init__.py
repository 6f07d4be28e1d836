"""The ``pytorch`` backend: TorchScript (``model.pt``), PyTorch 2 exported programs and
AOTInductor packages (``model.pt2``); see ``backend.py``."""

from shoal.workers.backends.pytorch.backend import PytorchBackend

__all__ = ["PytorchBackend"]
