"""The ``pytorch`` backend: TorchScript (``model.pt``), PyTorch 2 exported programs and
AOTInductor packages (``model.pt2``); see ``backend.py`` (``PytorchBackend``). The package
imports nothing itself, so its catalog entry (``entry.py``) is cheap to read."""
