"""Device memory admission (docs/architecture.md §6): two models that each fit on a GPU alone
must not run it out of memory together.

The broker keeps one ``DeviceLedger``: per visible GPU, its capacity, the share of it loads may
reserve (``--model-load-device-limit <id>:<fraction>``, Triton's ``--model-load-gpu-limit``; the
whole device by default) and the bytes each loaded model generation reserves there. A load asks
``device_needs`` what its KIND_GPU instances take per device, then ``admit``; a refusal is a
message naming the device, the need, what is free and who holds the rest. CPU instances are not
limited. The need of one instance is an estimate, not a measurement of the running worker:

    weights   the model config parameter ``shoal_device_memory_bytes`` ("2GiB", "512MiB",
              "1073741824") when given, else the size of the files in the version directory
              (an ``llm``-backend model: its checkpoint's weights, ``backends/llm/device_need.py``)
    + kv_pool  an ``llm``-backend model's KV cache pool, as its executor sizes it
    + the device workspace pool the worker reserves (``shoal.workers.workspace``)
    + ``--model-load-device-margin-bytes`` (CUDA context, allocator slack, activations)

Each reservation keeps these parts per device (``DeviceHolder.parts``: ``weights``,
``kv_pool``, ``workspace``, ``margin``) for where the ledger is shown (``/metrics``).

Capacities come from ``nvidia-smi`` (``discover_capacities``); the broker never imports torch or
creates a CUDA context. Ascend NPUs are not queried: a device whose capacity is unknown is
admitted unchecked (its reservations are still recorded). Under SHOAL_DEVICE_INVENTORY (declared
devices, ``shoal.process.devices.declared_gpus``) the declared sizes are the capacities and
nvidia-smi is not asked.

Threads: ``DeviceLedger`` is pure (no clock, no I/O) and single-threaded (the broker loop).
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config import instance_names
from shoal.errors import invalid_arg
from shoal.messages import DeviceMemory, DeviceMemoryHolder
from shoal.process.devices import (
    cuda_visible_entries,
    declared_gpus,
    parse_byte_size,
    visible_gpu_count,
)
from shoal.settings import BrokerSettings

logger = logging.getLogger(__name__)

DEVICE_MEMORY_PARAMETER: Final = "shoal_device_memory_bytes"
LIMIT_FLAG: Final = "--model-load-device-limit"
_NVIDIA_SMI: Final = ("nvidia-smi", "--query-gpu=uuid,memory.total",
                      "--format=csv,noheader,nounits")
_NVIDIA_SMI_TIMEOUT_S: Final = 5.0
_MIB: Final = 1 << 20
_GIB: Final = 1 << 30


# ------------------------------------------------------------------ what a model needs


def device_needs(config: ModelConfig, version_dirs: Sequence[str], margin_bytes: int,
                 workspace_bytes: int, *, gpu_count: int = 0,
                 instance_parts: Mapping[str, int] | None = None) -> dict[int, int]:
    """Bytes of device memory per device id that every KIND_GPU instance of ``config`` (a
    normalized config) takes, summed over ``version_dirs`` (each loaded version runs its own
    instances). Devices with no GPU instance are absent; a CPU-only model needs ``{}``.

    Per instance: the declared ``shoal_device_memory_bytes`` or the size of the version
    directory's files, plus ``workspace_bytes`` (``device_workspace_bytes``) and
    ``margin_bytes``. KIND_MODEL instances count on device 0 when ``gpu_count`` > 0 (the
    worker then places them on the accelerator), else nothing. INVALID_ARG for a bad
    ``shoal_device_memory_bytes``. ``instance_parts`` (an llm-backend model's ``weights`` and
    ``kv_pool``) replace the files' size; a declared size still replaces ``weights``."""
    return {device: sum(parts.values()) for device, parts in device_need_parts(
        config, version_dirs, margin_bytes, workspace_bytes, gpu_count=gpu_count,
        instance_parts=instance_parts).items()}


def device_need_parts(config: ModelConfig, version_dirs: Sequence[str], margin_bytes: int,
                      workspace_bytes: int, *, gpu_count: int = 0,
                      instance_parts: Mapping[str, int] | None = None
                      ) -> dict[int, dict[str, int]]:
    """``device_needs`` per device, split into its parts (``weights``, ``kv_pool``,
    ``workspace``, ``margin``)."""
    instances = device_instances(config, gpu_count=gpu_count)
    if not instances:
        return {}
    declared = declared_device_bytes(config)
    needs: dict[int, dict[str, int]] = {}
    for version_dir in version_dirs:
        parts = dict(instance_parts) if instance_parts is not None \
            else {"weights": model_files_bytes(version_dir)}
        if declared is not None:
            parts["weights"] = declared
        parts.update(workspace=workspace_bytes, margin=margin_bytes)
        for device, count in instances.items():
            held = needs.setdefault(device, {})
            for part, nbytes in parts.items():
                held[part] = held.get(part, 0) + count * nbytes
    return needs


def device_instances(config: ModelConfig, versions: int = 1, *,
                     gpu_count: int = 0) -> dict[int, int]:
    """Instances per device id of ``versions`` loaded versions of ``config``, counting what
    ``device_needs`` counts (for ``DeviceLedger.admit(..., instances=...)``)."""
    counts: dict[int, int] = {}
    for _name, kind, device, _group in instance_names(config):
        if kind == "GPU" or (kind == "MODEL" and gpu_count > 0):
            counts[device] = counts.get(device, 0) + versions
    return counts


def declared_device_bytes(config: ModelConfig) -> int | None:
    """The ``shoal_device_memory_bytes`` parameter in bytes; None when absent or empty."""
    if DEVICE_MEMORY_PARAMETER not in config.parameters:
        return None
    text = str(config.parameters[DEVICE_MEMORY_PARAMETER].string_value)
    if not text.strip():
        return None
    try:
        return parse_byte_size(text)
    except ValueError:
        raise invalid_arg(f"model '{config.name}': parameters.{DEVICE_MEMORY_PARAMETER}: "
                          f"'{text}' is not a byte size (e.g. 1073741824, 512MiB, 2GiB)") from None


def model_files_bytes(version_dir: str) -> int:
    """Total size of the regular files under ``version_dir`` (symlinked files count at their
    target's size; __pycache__ is skipped; unreadable entries count 0)."""
    total = 0
    for root, dirs, files in os.walk(version_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


# ------------------------------------------------------------------ the ledger


@dataclass(frozen=True)
class DeviceHolder:
    owner: str
    model: str
    nbytes: int
    parts: tuple[tuple[str, int], ...] = ()  # what the bytes are (weights, kv_pool, ...)


@dataclass(frozen=True)
class DeviceUsage:
    """One device's row for metrics and the dashboard. Bytes throughout; ``capacity`` and
    ``limit`` are None when the capacity is unknown (admission is then unchecked)."""
    device: int
    capacity: int | None
    limit: int | None
    reserved: int
    holders: tuple[DeviceHolder, ...]


@dataclass(frozen=True)
class _Reservation:
    model: str
    needs: dict[int, int]
    parts: dict[int, dict[str, int]]


class DeviceLedger:
    """Device memory reserved per owner. ``capacities`` lists every visible device id (bytes,
    or None when unknown); ``limits`` the fraction in (0, 1] of a device loads may reserve
    (1.0 when absent). An owner is an opaque string (the broker uses one per loaded model
    generation; during a reload the old and new generations hold memory at once)."""

    def __init__(self, capacities: Mapping[int, int | None], limits: Mapping[int, float]) -> None:
        for device, fraction in limits.items():
            if not 0.0 < fraction <= 1.0:
                raise ValueError(f"limit of GPU {device} must be in (0, 1], got {fraction}")
        self._capacities = dict(capacities)
        self._limits = dict(limits)
        self._reservations: dict[str, _Reservation] = {}

    def admit(self, owner: str, model: str, needs: Mapping[int, int], *,
              instances: Mapping[int, int] | None = None,
              parts: Mapping[int, Mapping[str, int]] | None = None) -> str | None:
        """Reserve ``needs`` (bytes per device id) for ``owner`` and return None, or return why
        not and reserve nothing. ``instances`` (per device) only enriches the message;
        ``parts`` (per device, what the bytes are) is kept for ``usage``. An owner holds at
        most one reservation: ValueError if it already holds one."""
        if owner in self._reservations:
            raise ValueError(f"owner '{owner}' already holds a device reservation")
        wanted = {device: nbytes for device, nbytes in sorted(needs.items()) if nbytes}
        if any(nbytes < 0 for nbytes in wanted.values()):
            raise ValueError(f"negative device need for '{model}': {dict(needs)}")
        problems = [problem for device, nbytes in wanted.items()
                    if (problem := self._refusal(device, nbytes, (instances or {}).get(device)))]
        if problems:
            return f"device memory admission refused loading '{model}': " + "; ".join(problems)
        if wanted:
            self._reservations[owner] = _Reservation(
                model, wanted, {device: dict((parts or {}).get(device, {})) for device in wanted})
        return None

    def release(self, owner: str) -> None:
        """Forget ``owner``'s reservation; a no-op for an owner that holds none."""
        self._reservations.pop(owner, None)

    def usage(self) -> list[DeviceUsage]:
        """Every visible device, by id."""
        return [DeviceUsage(device, capacity, self.limit_bytes(device),
                            self.reserved_bytes(device), self._holders(device))
                for device, capacity in sorted(self._capacities.items())]

    def limit_bytes(self, device: int) -> int | None:
        capacity = self._capacities.get(device)
        if capacity is None:
            return None
        return int(capacity * self._limits.get(device, 1.0))

    def reserved_bytes(self, device: int) -> int:
        return sum(r.needs.get(device, 0) for r in self._reservations.values())

    def _holders(self, device: int) -> tuple[DeviceHolder, ...]:
        return tuple(DeviceHolder(owner, r.model, r.needs[device],
                                  tuple(sorted(r.parts.get(device, {}).items())))
                     for owner, r in self._reservations.items() if device in r.needs)

    def _refusal(self, device: int, nbytes: int, instances: int | None) -> str | None:
        if device not in self._capacities:
            return f"GPU {device} is not visible"
        limit = self.limit_bytes(device)
        if limit is None:
            return None
        free = max(limit - self.reserved_bytes(device), 0)
        if nbytes <= free:
            return None
        count = "" if instances is None else f" ({_plural(instances, 'instance')})"
        capacity = self._capacities[device]
        assert capacity is not None
        fraction = self._limits.get(device)
        if fraction is None:
            of_what = f"of its {format_bytes(limit)}"
            context = ""
        else:
            of_what = f"of its {format_bytes(limit)} limit"
            context = f"{LIMIT_FLAG} {device}:{fraction:g} of {format_bytes(capacity)}; "
        return (f"GPU {device} needs {format_bytes(nbytes)}{count} but only "
                f"{format_bytes(free)} {of_what} is free ({context}held: "
                f"{self._held_text(device)})")

    def _held_text(self, device: int) -> str:
        by_model: dict[str, int] = {}
        for holder in self._holders(device):
            by_model[holder.model] = by_model.get(holder.model, 0) + holder.nbytes
        if not by_model:
            return "nothing"
        ordered = sorted(by_model.items(), key=lambda item: (-item[1], item[0]))
        return ", ".join(f"'{model}' {format_bytes(nbytes)}" for model, nbytes in ordered)


def device_memory(ledger: DeviceLedger) -> list[DeviceMemory]:
    """The ledger as it crosses to the frontends (``StatsReply.devices``): per device, the bytes
    reserved per model and part (the generations of a model being reloaded summed)."""
    rows: list[DeviceMemory] = []
    for usage in ledger.usage():
        held: dict[tuple[str, str], int] = {}
        for holder in usage.holders:
            for part, nbytes in holder.parts or (("model", holder.nbytes),):
                held[(holder.model, part)] = held.get((holder.model, part), 0) + nbytes
        rows.append(DeviceMemory(
            usage.device, -1 if usage.capacity is None else usage.capacity,
            -1 if usage.limit is None else usage.limit, usage.reserved,
            [DeviceMemoryHolder(model, part, nbytes)
             for (model, part), nbytes in sorted(held.items())]))
    return rows


def format_bytes(nbytes: int) -> str:
    """"1.50 GiB" from 100 MiB up, "12.00 MiB" from 1 MiB, else "512 bytes"."""
    if nbytes >= 100 * _MIB:
        return f"{nbytes / _GIB:.2f} GiB"
    if nbytes >= _MIB:
        return f"{nbytes / _MIB:.2f} MiB"
    return f"{nbytes} bytes"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# ------------------------------------------------------------------ capacities


def discover_capacities(environ: Mapping[str, str] = os.environ, *,
                        query: Callable[[], str] | None = None) -> dict[int, int]:
    """Bytes of memory per visible GPU id, without torch or CUDA: the sizes SHOAL_DEVICE_INVENTORY
    declares when set (INVALID_ARG when it fails), else ``nvidia-smi`` (``query`` replaces the
    call in tests) numbered as CUDA_VISIBLE_DEVICES makes the CUDA runtime number them. A GPU
    whose size is unknown (a MIG instance, "[N/A]") is absent; any failure gives {}.

    nvidia-smi lists GPUs in PCI bus order, the CUDA runtime fastest first unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID; when the two may differ and the visible GPUs differ in size,
    every GPU gets the smallest size (admission may then refuse, but never over-commits)."""
    declared = declared_gpus(environ)
    if declared is not None:
        return declared
    try:
        rows = _parse_nvidia_smi((query or _query_nvidia_smi)())
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        logger.debug("GPU memory sizes unknown (nvidia-smi: %s); device admission unchecked", exc)
        return {}
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        sizes = [size for _uuid, size in rows]
    else:
        sizes = [_visible_size(entry, rows) for entry in cuda_visible_entries(visible, len(rows))]
    found = {device: size for device, size in enumerate(sizes) if size is not None}
    if environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and len(set(found.values())) > 1:
        logger.debug("GPU sizes differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID; admission "
                     "assumes the smallest (%d bytes) for every GPU", min(found.values()))
        return dict.fromkeys(found, min(found.values()))
    return found


def _query_nvidia_smi() -> str:
    done = subprocess.run(_NVIDIA_SMI, capture_output=True, text=True, check=True,
                          timeout=_NVIDIA_SMI_TIMEOUT_S)
    return done.stdout


def _parse_nvidia_smi(text: str) -> list[tuple[str, int | None]]:
    """Lines "GPU-<uuid>, <MiB>" -> [(uuid, bytes or None when not a number)], in order."""
    rows: list[tuple[str, int | None]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        uuid, sep, mib = line.partition(",")
        if not sep:
            raise ValueError(f"unexpected nvidia-smi line '{line}'")
        size = mib.strip()
        rows.append((uuid.strip(), int(size) * _MIB if size.isdigit() else None))
    return rows


def _visible_size(entry: str, rows: Sequence[tuple[str, int | None]]) -> int | None:
    """The size of the GPU a CUDA_VISIBLE_DEVICES entry names (an index or a GPU UUID prefix,
    as the CUDA runtime accepts); None for a MIG instance or no unique match."""
    if entry.isdigit():
        return rows[int(entry)][1]
    matches = [size for uuid, size in rows if entry.startswith("GPU-") and uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None


def ledger_from_settings(settings: BrokerSettings, *, device_count: int | None = None,
                         environ: Mapping[str, str] = os.environ) -> DeviceLedger:
    """The broker's ledger: GPUs 0..device_count-1 (default ``visible_gpu_count()``, the count
    the broker normalizes instance groups with), their discovered capacities and the
    ``--model-load-device-limit`` fractions. A limit on a device that is not visible, or whose
    size is unknown, cannot be enforced and is logged as a warning."""
    count = visible_gpu_count(environ=environ) if device_count is None else device_count
    found = discover_capacities(environ)
    capacities: dict[int, int | None] = {device: found.get(device) for device in range(count)}
    limits = dict(settings.model_control.device_limits)
    for device, fraction in sorted(limits.items()):
        if device not in capacities:
            logger.warning("%s %d:%g names GPU %d, which is not visible; ignored",
                           LIMIT_FLAG, device, fraction, device)
        elif capacities[device] is None:
            logger.warning("%s %d:%g cannot be enforced: the memory size of GPU %d is unknown",
                           LIMIT_FLAG, device, fraction, device)
    known = {device: fraction for device, fraction in limits.items() if device in capacities}
    return DeviceLedger(capacities, known)

