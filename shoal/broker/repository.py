"""Model repository scanning: which models exist, which versions, and their completed configs.

Layout (Triton's): ``<repository>/<model>/config.pbtxt`` (optional when the backend can be
inferred and auto-complete fills the rest) and ``<repository>/<model>/<version>/<files>``.
Everything here is synchronous filesystem work for the broker's load path; nothing is cached.
Error messages name the model and the repository-relative config file, never absolute paths
(except ``discover_models``, whose repositories are the operator's own flags).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelVersionPolicy

from shoal.config.model_config import load_config_file, normalize_config
from shoal.errors import ErrorCode, ShoalError, invalid_arg

logger = logging.getLogger(__name__)

CONFIG_FILENAME: Final = "config.pbtxt"
CUSTOM_CONFIG_FOLDER: Final = "configs"
_MAX_VERSION: Final = 2**63 - 1

# Files that identify a backend when neither 'backend' nor 'platform' is configured, in Triton's
# order of detection (core AutoCompleteBackendFields).
_BACKEND_BY_MODEL_FILE: Final = (
    ("model.plan", "tensorrt"),
    ("model.onnx", "onnxruntime"),
    ("model.pt", "pytorch"),
    ("model.pt2", "pytorch"),  # the backend loads model.pt2 when model.pt is absent
    ("model.py", "python"),
)

# TensorFlow's model files -> platform (Triton checks them first, and sets the platform, since
# the tensorflow backend serves two; model.savedmodel is a directory)
_TENSORFLOW_PLATFORM_BY_MODEL_FILE: Final = (
    ("model.savedmodel", "tensorflow_savedmodel"),
    ("model.graphdef", "tensorflow_graphdef"),
)

AutoComplete = Callable[[str, ModelConfig], ModelConfig]
"""(model_dir, partial config) -> completed config; a backend's ``auto_complete_config``."""


@dataclass(frozen=True)
class ModelSource:
    """One model as found in a repository, with its completed and normalized config."""

    name: str
    repository: str  # the --model-repository path it came from
    model_dir: str  # <repository>/<name>
    config: ModelConfig  # completed + normalized; callers must not mutate it
    versions: list[int]  # selected by version_policy, ascending
    config_source: str  # e.g. "add_sub/config.pbtxt" (relative, for messages)


def discover_models(repositories: Sequence[str]) -> dict[str, str]:
    """Model name -> model dir for every directory of every repository, sorted by name. Hidden
    directories are skipped. A name present in two repositories is an error (Triton makes such a
    model unavailable: a name must be unique across all model repositories)."""
    found: dict[str, str] = {}
    origin: dict[str, str] = {}
    for repository in repositories:
        try:
            with os.scandir(repository) as entries:
                names = sorted(e.name for e in entries if _is_visible_dir(e))
        except OSError as exc:
            raise invalid_arg(
                f"model repository '{repository}' cannot be read: {exc.strerror}") from None
        for name in names:
            if name in found:
                raise invalid_arg(
                    f"model '{name}' is not unique across all model repositories: it is in "
                    f"both '{origin[name]}' and '{repository}'")
            found[name] = os.path.join(repository, name)
            origin[name] = repository
    return dict(sorted(found.items()))


def _is_visible_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return not entry.name.startswith(".") and entry.is_dir()
    except OSError:
        return False


def available_versions(model_dir: str) -> list[int]:
    """Numeric version directories of a model, ascending. As in Triton (core VersionsToLoad),
    non-numeric names and numeric names with a leading zero ("01") are ignored with a warning;
    "0" itself is version 0."""
    model_name = os.path.basename(os.path.normpath(model_dir))
    try:
        with os.scandir(model_dir) as entries:
            names = sorted(e.name for e in entries if _is_visible_dir(e))
    except OSError as exc:
        raise invalid_arg(f"model '{model_name}': directory cannot be read: {exc.strerror}") \
            from None
    versions: list[int] = []
    for name in names:
        if not (name.isascii() and name.isdigit()) or int(name) > _MAX_VERSION:
            if name not in ("configs", "warmup", "initial_state"):
                logger.warning("model '%s': ignoring version directory '%s' (not an integral "
                               "number)", model_name, name)
            continue
        if len(name) > 1 and name.startswith("0"):
            logger.warning("model '%s': ignoring version directory '%s' (leading zeros)",
                           model_name, name)
            continue
        versions.append(int(name))
    return sorted(versions)


def select_versions(available: Sequence[int], policy: ModelVersionPolicy) -> list[int]:
    """The versions a policy loads, ascending: ``latest{num_versions}`` (the highest N),
    ``all``, or ``specific{versions}`` (each must exist). A policy with no choice set is Triton's
    ``all``; a missing policy should have been normalized to ``latest{1}``."""
    present = sorted(set(available))
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest":
        count = int(policy.latest.num_versions)
        return present[len(present) - count:] if count > 0 else []
    if choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in present]
        if missing:
            raise invalid_arg(
                f"version_policy.specific.versions: version {missing[0]} is specified but "
                f"its version directory is not present (available: {present or 'none'})")
        return wanted
    return present


class SourceError(ShoalError):
    """A model's load failed after its config was read: ``versions`` are the versions it
    would have loaded (its policy over the version directories present). Triton shows each of
    them UNAVAILABLE with the reason; a config that does not parse, or a model without version
    directories, fails before any version exists (Triton: "failed to poll", a bare entry)."""

    def __init__(self, code: ErrorCode, message: str, versions: list[int]) -> None:
        super().__init__(code, message)
        self.versions = versions


def policy_versions(available: Sequence[int], config: ModelConfig) -> list[int]:
    """The versions ``config``'s policy picks, as far as they can be told (a config not yet
    normalized has Triton's default, the latest one; a policy that cannot be met: none)."""
    if not config.HasField("version_policy"):
        return sorted(available)[-1:]
    try:
        return select_versions(available, config.version_policy)
    except ShoalError:
        return []


def load_model_source(name: str, model_dir: str, repository: str, *,
                      default_max_batch_size: int, gpu_count: int,
                      auto_complete: AutoComplete | None,
                      disable_auto_complete: bool = False,
                      config_name: str = "",
                      config_override: ModelConfig | None = None) -> ModelSource:
    """Read, complete and normalize one model's config and pick its versions.

    Order (Triton's): parse ``config.pbtxt`` (or ``configs/<config_name>.pbtxt`` when that file
    exists; a missing file means an empty config), find the version directories, fill the name
    and infer the backend from the model files when unset, run ``auto_complete`` (unless
    disabled), then normalize + validate and select versions by policy. ``config_override`` (a
    load request's ``config``) replaces the config file wholly, as in Triton.
    ``default_max_batch_size`` is passed to ``normalize_config`` (see there)."""
    config_source = f"{name}/{CONFIG_FILENAME}"
    config_path = os.path.join(model_dir, CONFIG_FILENAME)
    if config_name:
        custom_source = f"{name}/{CUSTOM_CONFIG_FOLDER}/{config_name}.pbtxt"
        custom_path = os.path.join(model_dir, CUSTOM_CONFIG_FOLDER, f"{config_name}.pbtxt")
        if os.path.isfile(custom_path):
            config_source, config_path = custom_source, custom_path
    if config_override is not None:
        config_source = f"{name} (config override)"
        config = ModelConfig()
        config.CopyFrom(config_override)
    else:
        config = load_config_file(config_path, source=config_source) or ModelConfig()
    available = available_versions(model_dir)
    if not available:
        raise invalid_arg(f"model '{name}': no version directory: put the model files in a "
                          f"numeric version directory such as '{name}/1/'")
    try:
        return _complete_source(name, model_dir, repository, config, available, config_source,
                                default_max_batch_size=default_max_batch_size,
                                gpu_count=gpu_count, auto_complete=auto_complete,
                                disable_auto_complete=disable_auto_complete)
    except ShoalError as exc:
        raise SourceError(exc.code, exc.message, policy_versions(available, config)) from None


def _complete_source(name: str, model_dir: str, repository: str, config: ModelConfig,
                     available: list[int], config_source: str, *, default_max_batch_size: int,
                     gpu_count: int, auto_complete: AutoComplete | None,
                     disable_auto_complete: bool) -> ModelSource:
    """``load_model_source`` once the config is parsed and version directories exist."""
    if not config.name:
        config.name = name
    _infer_backend(config, model_dir, available, config_source)
    if auto_complete is not None and not disable_auto_complete:
        config = _run_auto_complete(auto_complete, model_dir, config, name)
    config = normalize_config(config, model_name=name, source=config_source,
                              default_max_batch_size=default_max_batch_size,
                              gpu_count=gpu_count)
    try:
        versions = select_versions(available, config.version_policy)
    except ShoalError as exc:
        raise ShoalError(exc.code, f"{config_source}: {exc.message}") from None
    if not versions:
        raise invalid_arg(f"{config_source}: version_policy: at least one version must be "
                          f"available under the version policy of model '{name}'")
    return ModelSource(name=name, repository=repository, model_dir=model_dir, config=config,
                       versions=versions, config_source=config_source)


def _infer_backend(config: ModelConfig, model_dir: str, versions: Sequence[int],
                   config_source: str) -> None:
    """Fill ``config.backend`` from the model files when neither backend nor platform is set
    (Triton's AutoCompleteBackendFields): ``default_model_filename`` if given, else the first
    known model file in a version directory (lowest version first), else a model named
    ``<model>.<backend>``. TensorFlow's files come first and set the platform too."""
    _infer_tensorflow_platform(config, model_dir, versions)
    if config.backend or config.platform:
        return
    by_file = dict(_BACKEND_BY_MODEL_FILE)
    if config.default_model_filename:
        config.backend = by_file.get(config.default_model_filename, "")
    else:
        for version in versions:
            version_dir = os.path.join(model_dir, str(version))
            backend = next((b for f, b in _BACKEND_BY_MODEL_FILE
                            if _is_model_file(os.path.join(version_dir, f), b)), "")
            if backend:
                config.backend = backend
                break
    model_name = config.name
    if not config.backend and not config.default_model_filename and "." in model_name:
        config.backend = model_name.split(".", 1)[1]
        config.default_model_filename = f"model.{config.backend}"
    if not config.backend:
        raise invalid_arg(
            f"{config_source}: backend: cannot determine the backend of model '{model_name}': "
            f"set it in {config_source} (e.g. backend: \"python\"), or provide "
            f"<version>/model.py, <version>/model.pt, <version>/model.pt2 or "
            f"<version>/model.onnx")


def _infer_tensorflow_platform(config: ModelConfig, model_dir: str,
                               versions: Sequence[int]) -> None:
    """Triton's AutoCompleteBackendFields for TensorFlow: with no platform and a backend that is
    unset or ``tensorflow``, the platform (and backend ``tensorflow``) of
    ``default_model_filename`` if it is a TensorFlow file name, else of the first version
    directory holding a ``model.savedmodel`` directory or a ``model.graphdef`` file."""
    if config.platform or config.backend not in ("", "tensorflow"):
        return
    platforms = dict(_TENSORFLOW_PLATFORM_BY_MODEL_FILE)
    platform = platforms.get(config.default_model_filename, "")
    for version in versions if not config.default_model_filename else ():
        version_dir = os.path.join(model_dir, str(version))
        platform = next((p for f, p in _TENSORFLOW_PLATFORM_BY_MODEL_FILE
                         if _is_tensorflow_model(os.path.join(version_dir, f), p)), "")
        if platform:
            break
    if platform:
        config.platform = platform
        config.backend = "tensorflow"


def _is_tensorflow_model(path: str, platform: str) -> bool:
    """A SavedModel is a directory, a GraphDef a file."""
    return os.path.isdir(path) if platform == "tensorflow_savedmodel" else os.path.isfile(path)


def _is_model_file(path: str, backend: str) -> bool:
    """A model file, or for ONNX also a directory (a model with external data, as Triton's
    onnxruntime backend takes it)."""
    return os.path.isfile(path) or (backend == "onnxruntime" and os.path.isdir(path))


def _run_auto_complete(auto_complete: AutoComplete, model_dir: str, config: ModelConfig,
                       name: str) -> ModelConfig:
    partial = ModelConfig()
    partial.CopyFrom(config)
    try:
        return auto_complete(model_dir, partial)
    except ShoalError:
        raise
    except Exception as exc:  # user code (e.g. a Python model's auto_complete_config)
        raise invalid_arg(f"model '{name}': auto-complete of the model configuration failed: "
                          f"{type(exc).__name__}: {exc}") from exc
