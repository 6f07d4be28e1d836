# incomplete: only grpc.model_config_pb2 is stubbed (typings/generate.py); the rest is Any
from typing import Any

def __getattr__(name: str) -> Any: ...
