"""Compiled float32 CPU kernels for the LLM decoding step (``cpu_kernels.c``).

At the few rows of a decoding step, a Llama layer in plain torch is ~25 dispatched ops of
3-80 µs each around its four matrix products, and the attention of one query row per sequence
is two batched products of tiny matrices. These kernels do the same arithmetic in one call each:
RMSNorm, the residual sum fused with the next RMSNorm, rotary embeddings in place, SwiGLU's
``silu(gate) * up``, the paged KV write, and decode attention over the kept keys/values
(``decode_copy.py``) with the new tokens' keys and values written first. ``llama_step`` runs
a whole iteration of a Llama-family model in one call, its matrix products through the
BLAS ``sgemm`` torch itself uses (MKL's, found in ``libtorch_cpu.so``); elsewhere the matrix
products stay with torch.

Built at first use with the system C compiler (``$CC``, else ``cc`` or ``gcc``; ``-O3
-march=native``, ``-mcpu=native`` off x86-64) into ``$SHOAL_KERNEL_CACHE`` (default
``~/.cache/shoal/kernels``), one file per source, flags and CPU, written under a temporary name
and renamed into place, so concurrent workers never load a half-written file. Without a
compiler, on a failed build, or with ``SHOAL_LLM_CPU_KERNELS=0``, ``cpu_kernels()`` is None and
the models run their torch ops (the same results to float32 rounding; the oracle tests run
both).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# -ffp-contract stays GCC's default (fast: FMAs), but shoal_rotary turns it off for itself;
# -fno-strict-aliasing: exp_inplace reads floats' bits as int32; on x86-64 the 16-float vectors
# stay whole AVX-512 registers where the CPU has them (GCC prefers 256-bit ones otherwise)
_TARGET = (("-march=native", "-mprefer-vector-width=512")
           if platform.machine().lower() in ("x86_64", "amd64") else ("-mcpu=native",))
FLAGS = ("-O3", *_TARGET, "-fno-math-errno", "-fno-trapping-math", "-fno-strict-aliasing",
         "-shared", "-fPIC")
ENABLE_ENV = "SHOAL_LLM_CPU_KERNELS"
CACHE_ENV = "SHOAL_KERNEL_CACHE"

_i64 = ctypes.c_int64
_ptr = ctypes.c_void_p
_f32 = ctypes.c_float


def _cpu_identity() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [line for line in text.splitlines()
             if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(lines)))


def _cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shoal" / "kernels"


def _build(compiler: str) -> Path:
    """The compiled library's path, building it when the cache lacks it."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), compiler.encode(),
                                     _cpu_identity().encode()])).hexdigest()[:20]
    directory = _cache_dir()
    target = directory / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=directory)
    os.close(handle)
    try:
        subprocess.run([compiler, *FLAGS, "-o", partial, str(SOURCE), "-lm"], check=True,
                       capture_output=True, timeout=120)
        os.replace(partial, target)
        for stale in directory.glob("cpu_kernels-*.so"):  # builds of earlier sources or CPUs
            if stale != target:
                stale.unlink(missing_ok=True)  # a process that loaded it keeps its mapping
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


class CpuKernels:
    """Tensor-level calls of the compiled kernels. Every tensor is float32 on the CPU; the
    callers check the layouts each method names."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._rms_norm = library.shoal_rms_norm
        self._rms_norm.argtypes = [_ptr, _i64, _ptr, _ptr, _i64, _i64, _f32]
        self._rms_norm.restype = None
        self._add_rms_norm = library.shoal_add_rms_norm
        self._add_rms_norm.argtypes = [_ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32]
        self._add_rms_norm.restype = None
        self._rotary = library.shoal_rotary
        self._rotary.argtypes = [_ptr, _i64, _i64, _i64, _i64, _ptr, _i64, _ptr, _ptr]
        self._rotary.restype = ctypes.c_int
        self._silu_mul = library.shoal_silu_mul
        self._silu_mul.argtypes = [_ptr, _ptr, _i64, _i64]
        self._silu_mul.restype = None
        self._store_kv = library.shoal_store_kv
        self._store_kv.argtypes = [_ptr, _i64, _ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _i64]
        self._store_kv.restype = ctypes.c_int
        self._llama_step = library.shoal_llama_step
        self._llama_step.argtypes = (
            [_ptr] + [_i64] * 8 + [_ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _ptr,
                                   _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr, _f32, _f32,
                                   _ptr, _ptr, _i64, _ptr])
        self._llama_step.restype = ctypes.c_int
        self.sgemm = _blas_sgemm()  # address of the BLAS sgemm torch uses; None: not found
        self._attention = library.shoal_decode_attention
        self._attention.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr,
                                    _i64, _i64, _i64, _i64, _i64, _i64, _i64, _f32, _ptr]
        self._attention.restype = ctypes.c_int

    def rms_norm(self, hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``layers.rms_norm`` of a 2-D ``hidden`` whose last dimension is contiguous."""
        rows, size = hidden.shape
        out = torch.empty((rows, size), dtype=torch.float32)
        self._rms_norm(hidden.data_ptr(), hidden.stride(0), weight.data_ptr(), out.data_ptr(),
                       rows, size, eps)
        return out

    def add_rms_norm(self, hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """``hidden += delta`` (both contiguous [rows, n]; ``hidden`` updated in place), then
        the RMSNorm of the sum."""
        rows, size = hidden.shape
        out = torch.empty((rows, size), dtype=torch.float32)
        self._add_rms_norm(hidden.data_ptr(), delta.data_ptr(), weight.data_ptr(),
                           out.data_ptr(), rows, size, eps)
        return out

    def rotary_(self, packed: torch.Tensor, heads: int, head_dim: int, positions: torch.Tensor,
                cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        """Rotate, in place, the first ``heads`` heads of each row of ``packed`` ([T, >= heads *
        head_dim], rows contiguous) by ``positions`` (int64 [T]) with ``RotaryTable``'s
        tables (contiguous [positions, head_dim])."""
        if self._rotary(packed.data_ptr(), packed.stride(0), packed.shape[0], heads, head_dim,
                        positions.data_ptr(), cos.shape[0], cos.data_ptr(),
                        signed_sin.data_ptr()) != 0:
            raise IndexError(f"rotary embeddings: a position is outside the {cos.shape[0]} "
                             f"positions of the table")

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of a contiguous [rows, 2n] ``gate_up`` ([gate | up])."""
        rows, double = gate_up.shape
        out = torch.empty((rows, double // 2), dtype=torch.float32)
        self._silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, double // 2)
        return out

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor,
                 layer_cache: torch.Tensor) -> None:
        """``layer_cache[0][slot_mapping] = key; layer_cache[1][slot_mapping] = value``: key and
        value [T, Hkv, D] (``usable_rows``), ``layer_cache`` contiguous [2, slots, Hkv, D],
        ``slot_mapping`` int64 [T]."""
        rows, kv_heads, dim = key.shape
        slots = layer_cache.shape[1]
        if self._store_kv(key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0), rows,
                          kv_heads * dim, slot_mapping.data_ptr(), layer_cache[0].data_ptr(),
                          layer_cache[1].data_ptr(), slots) != 0:
            raise IndexError(f"KV write: a slot outside the layer's {slots} slots")

    def decode_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         keys_t: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                         positions: torch.Tensor, window: int, scale: float) -> torch.Tensor:
        """Writes each decode row's new key/value ([Bd, Hkv, D]) into its slot of the kept
        ``keys_t`` [C, Hkv, D, W] / ``values`` [C, Hkv, W, D] at its position, then returns
        the rows' attention [Bd, H, D] over keys [max(0, p + 1 - window), p] (window 0: all).
        query/key/value: heads and dims contiguous within a row (``usable_rows``)."""
        rows, heads, dim = query.shape
        out = torch.empty((rows, heads, dim), dtype=torch.float32)
        status = self._attention(
            query.data_ptr(), query.stride(0), key.data_ptr(), key.stride(0),
            value.data_ptr(), value.stride(0), keys_t.data_ptr(), values.data_ptr(),
            slots.data_ptr(), positions.data_ptr(), rows, heads, key.shape[1], dim,
            values.shape[0], values.shape[2], window, scale, out.data_ptr())
        if status != 0:
            raise ValueError("decode attention: a slot or position outside the kept copy")
        return out


    def llama_step(self, shape: DecodeShape, layer_ptrs: torch.Tensor, hidden: torch.Tensor,
                   positions: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                   slot_mapping: torch.Tensor, pool_slots: int, decode: KeptRows | None,
                   spans: torch.Tensor, logits_rows: torch.Tensor, final_norm: torch.Tensor,
                   lm_head: torch.Tensor, lm_head_nk: bool) -> torch.Tensor:
        """An iteration of a Llama-family model (``cpu_kernels.c`` ``shoal_llama_step``):
        ``hidden`` [rows, hidden_size] the embeddings (overwritten), ``layer_ptrs`` int64
        [layers, len(LAYER_FIELDS)], ``rotary`` the cos / signed sin tables, ``decode`` the
        decode rows and their kept slots (None: no decode row), ``spans`` int64 [n, 2] the
        context spans (packed [start, end), from position 0); returns float32 logits
        [len(logits_rows), vocab]. Needs ``self.sgemm``."""
        assert self.sgemm is not None
        rows = hidden.shape[0]
        cos, signed_sin = rotary
        logits = torch.empty((logits_rows.shape[0], shape.vocab), dtype=torch.float32)
        status = self._llama_step(
            self.sgemm, layer_ptrs.shape[0], rows, shape.hidden_size, shape.heads,
            shape.kv_heads, shape.head_dim, shape.intermediate, shape.vocab,
            layer_ptrs.data_ptr(), hidden.data_ptr(), positions.data_ptr(), cos.shape[0],
            cos.data_ptr(), signed_sin.data_ptr(), slot_mapping.data_ptr(), pool_slots,
            0 if decode is None else decode.index.shape[0],
            0 if decode is None else decode.index.data_ptr(),
            0 if decode is None else decode.slots.data_ptr(),
            0 if decode is None else decode.positions.data_ptr(),
            0 if decode is None else decode.capacity, 0 if decode is None else decode.width,
            spans.shape[0], spans.data_ptr(), logits_rows.shape[0], logits_rows.data_ptr(),
            shape.eps, shape.scale, final_norm.data_ptr(), lm_head.data_ptr(), int(lm_head_nk),
            logits.data_ptr())
        if status != 0:
            raise ValueError("LLM iteration: an index out of range, or no memory for scratch")
        return logits


@dataclass(frozen=True)
class KeptRows:
    """An iteration's decode rows for ``CpuKernels.llama_step``: their packed rows, kept slots
    and positions (int64 [Bd] each), and the kept copies' slots and width."""

    index: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    capacity: int
    width: int


@dataclass(frozen=True)
class DecodeShape:
    """What ``CpuKernels.llama_step`` needs of a model's configuration."""

    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    scale: float


# one row of llama_step's layer_ptrs (cpu_kernels.c enum L_*)
LAYER_FIELDS = ("input_norm", "qkv", "qkv_bias", "out", "out_bias", "post_norm", "gate_up",
                "gate_up_bias", "down", "down_bias", "keys_t", "values", "pool")


def _blas_sgemm() -> int | None:
    """The address of the Fortran BLAS ``sgemm_`` in torch's CPU library (MKL's on x86-64),
    so the compiled iteration multiplies with torch's own BLAS; None when torch exports none."""
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        function = ctypes.CDLL(str(library)).sgemm_
    except (OSError, AttributeError):
        return None
    address = ctypes.cast(function, ctypes.c_void_p).value
    return int(address) if address else None


def usable_rows(*tensors: torch.Tensor) -> bool:
    """[rows, heads, dim] tensors whose heads and dims are contiguous within a row (a row's
    start may be any stride apart), float32 on the CPU."""
    for tensor in tensors:
        _, heads, dim = tensor.shape
        if (tensor.dtype != torch.float32 or tensor.device.type != "cpu"
                or tensor.stride(2) != 1 or (heads > 1 and tensor.stride(1) != dim)):
            return False
    return True


def cpu_kernels() -> CpuKernels | None:
    """The loaded kernels, or None: disabled (``SHOAL_LLM_CPU_KERNELS=0``, read at every call,
    so a test can switch paths), no compiler, or the build failed (logged once)."""
    if os.environ.get(ENABLE_ENV, "1") == "0":
        return None
    return _loaded()


@functools.cache
def _loaded() -> CpuKernels | None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.info("no C compiler: the LLM decoding step runs on torch ops only")
        return None
    try:
        return CpuKernels(ctypes.CDLL(str(_build(compiler))))
    except (OSError, subprocess.SubprocessError, AttributeError) as error:
        detail = getattr(error, "stderr", b"") or b""
        logger.warning("LLM CPU kernels not built (%s %s): torch ops only", error,
                       detail.decode(errors="replace")[:500])
        return None
