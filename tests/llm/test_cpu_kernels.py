"""The compiled CPU kernels of the decoding step against the torch ops they replace, their
refusals of out-of-range indices, and how they are built and cached."""

from __future__ import annotations

import logging
import pathlib

import pytest
import torch
import torch.nn.functional as F

from shoal.llm import kernels
from shoal.llm.attention import decode_attention
from shoal.llm.kernels import CpuKernels, cpu_kernels, usable_rows
from shoal.llm.models.layers import rms_norm
from shoal.llm.models.rope import RotaryTable, inverse_frequencies

HEADS, KV_HEADS, DIM = 8, 4, 32


@pytest.fixture(scope="module")
def compiled() -> CpuKernels:
    loaded = cpu_kernels()
    if loaded is None:
        pytest.skip("the LLM CPU kernels cannot be built here (no C compiler?)")
    return loaded


def test_rms_norm_and_fused_residual_agree_with_torch(compiled: CpuKernels) -> None:
    generator = torch.Generator().manual_seed(0)
    wide = torch.randn(7, 300, generator=generator) * 5  # a strided 2-D view, odd width
    hidden = wide[:, :259]
    weight = torch.randn(259, generator=generator)
    assert torch.allclose(compiled.rms_norm(hidden, weight, 1e-6),
                          rms_norm(hidden, weight, 1e-6), rtol=1e-5, atol=1e-6)
    total = hidden.contiguous()
    delta = torch.randn(7, 259, generator=generator)
    normed = compiled.add_rms_norm(total, delta, weight, 1e-5)
    expected_sum = hidden + delta
    assert torch.equal(total, expected_sum)  # the residual sum itself is exact
    assert torch.allclose(normed, rms_norm(expected_sum, weight, 1e-5), rtol=1e-5, atol=1e-6)


def test_rotary_is_bitwise_torchs_and_leaves_the_values_alone(compiled: CpuKernels) -> None:
    table = RotaryTable(inverse_frequencies(DIM, 10000.0, None), 512, torch.float32, "cpu")
    generator = torch.Generator().manual_seed(1)
    qkv = torch.randn(9, (HEADS + 2 * KV_HEADS) * DIM, generator=generator)
    positions = torch.randint(0, 512, (9,), generator=generator)
    rotated_heads = (HEADS + KV_HEADS) * DIM
    expected = table.rotate(qkv[:, :rotated_heads].view(9, HEADS + KV_HEADS, DIM),
                            table.at(positions))
    values = qkv[:, rotated_heads:].clone()
    compiled.rotary_(qkv, HEADS + KV_HEADS, DIM, positions, table.cos, table.signed_sin)
    assert torch.equal(qkv[:, :rotated_heads], expected.reshape(9, -1))
    assert torch.equal(qkv[:, rotated_heads:], values)
    with pytest.raises(IndexError, match="outside the 512 positions"):
        compiled.rotary_(qkv, HEADS + KV_HEADS, DIM, torch.tensor([0] * 8 + [512]), table.cos,
                         table.signed_sin)
    assert torch.equal(qkv[:, :rotated_heads], expected.reshape(9, -1))  # nothing written


def test_silu_mul_agrees_with_torch_over_the_whole_range(compiled: CpuKernels) -> None:
    gate = torch.cat([torch.linspace(-200, 200, 4001), torch.tensor([-1e30, 1e30, 0.0])])
    up = torch.linspace(-3, 3, gate.numel())
    gate_up = torch.cat([gate, up])[None]
    got = compiled.silu_mul(gate_up)[0]
    expected = F.silu(gate) * up
    assert torch.isfinite(got).all()
    assert torch.allclose(got, expected, rtol=2e-6, atol=1e-30)


def test_store_kv_writes_the_pool_like_index_copy(compiled: CpuKernels) -> None:
    generator = torch.Generator().manual_seed(2)
    qkv = torch.randn(5, (HEADS + 2 * KV_HEADS) * DIM, generator=generator)
    key = qkv[:, HEADS * DIM:(HEADS + KV_HEADS) * DIM].view(5, KV_HEADS, DIM)
    value = qkv[:, (HEADS + KV_HEADS) * DIM:].view(5, KV_HEADS, DIM)
    slots = torch.tensor([7, 0, 3, 12, 9])
    cache = torch.zeros(2, 16, KV_HEADS, DIM)
    expected = cache.clone()
    expected[0].index_copy_(0, slots, key)
    expected[1].index_copy_(0, slots, value)
    compiled.store_kv(key, value, slots, cache)
    assert torch.equal(cache, expected)
    with pytest.raises(IndexError, match="outside the layer's 16 slots"):
        compiled.store_kv(key, value, torch.tensor([0, 1, 2, 3, 16]), torch.zeros_like(cache))


def _reference_attention(query: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor,
                         slots: torch.Tensor, positions: torch.Tensor, window: int,
                         scale: float) -> torch.Tensor:
    """SDPA of each row over its own keys [lo, p] (the kept copy already holds the new ones)."""
    rows = []
    for row in range(query.shape[0]):
        slot, position = int(slots[row]), int(positions[row])
        first = max(0, position + 1 - window) if window else 0
        keys = keys_t[slot, :, :, first:position + 1].transpose(1, 2)
        vals = values[slot, :, first:position + 1]
        rows.append(F.scaled_dot_product_attention(
            query[row][None, :, None], keys[None], vals[None], scale=scale,
            enable_gqa=True)[0, :, 0])
    return torch.stack(rows)


@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("dim", [32, 48, 64])  # 48: the kernel's generic, not unrolled, path
def test_decode_attention_writes_the_new_keys_and_agrees_with_sdpa(
        compiled: CpuKernels, window: int, dim: int) -> None:
    generator = torch.Generator().manual_seed(3)
    capacity, width, rows = 12, 150, 9
    keys_t = torch.randn(capacity, KV_HEADS, dim, width, generator=generator)
    values = torch.randn(capacity, KV_HEADS, width, dim, generator=generator)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * dim, generator=generator) * 3
    query = qkv[:, :HEADS * dim].view(rows, HEADS, dim)  # rows strided, as in the model
    key = qkv[:, HEADS * dim:(HEADS + KV_HEADS) * dim].view(rows, KV_HEADS, dim)
    value = qkv[:, (HEADS + KV_HEADS) * dim:].view(rows, KV_HEADS, dim)
    assert usable_rows(query, key, value)
    slots = torch.randperm(capacity, generator=generator)[:rows]
    positions = torch.tensor([0, 1, 15, 16, 63, 64, 100, 148, 149])
    expected_keys, expected_values = keys_t.clone(), values.clone()
    expected_keys[slots, :, :, positions] = key
    expected_values[slots, :, positions] = value
    scale = dim ** -0.5
    got = compiled.decode_attention(query, key, value, keys_t, values, slots, positions, window,
                                    scale)
    assert torch.equal(keys_t, expected_keys) and torch.equal(values, expected_values)
    expected = _reference_attention(query, expected_keys, expected_values, slots, positions,
                                     window, scale)
    assert torch.allclose(got, expected, rtol=1e-5, atol=2e-6)


def test_decode_attention_agrees_with_the_torch_kernel_on_full_rows(compiled: CpuKernels) -> None:
    """Where every slot is full, the batched-matmul path and the compiled one see the same keys."""
    generator = torch.Generator().manual_seed(4)
    rows, width = 6, 64
    keys_t = torch.randn(rows, KV_HEADS, DIM, width, generator=generator)
    values = torch.randn(rows, KV_HEADS, width, DIM, generator=generator)
    query = torch.randn(rows, HEADS, DIM, generator=generator)
    positions = torch.full((rows,), width - 1)
    key = keys_t[:, :, :, -1].clone()
    value = values[:, :, -1].clone()
    expected = decode_attention(query, keys_t, values, None, DIM ** -0.5)
    got = compiled.decode_attention(query, key, value, keys_t, values, torch.arange(rows),
                                    positions, 0, DIM ** -0.5)
    assert torch.allclose(got, expected, rtol=1e-5, atol=2e-6)


def test_decode_attention_refuses_slots_and_positions_outside_the_copy(
        compiled: CpuKernels) -> None:
    keys_t, values = torch.zeros(2, KV_HEADS, DIM, 8), torch.zeros(2, KV_HEADS, 8, DIM)
    query, key = torch.zeros(1, HEADS, DIM), torch.ones(1, KV_HEADS, DIM)
    for slots, positions in (([2], [0]), ([0], [8]), ([-1], [0]), ([0], [-1])):
        with pytest.raises(ValueError, match="outside the kept copy"):
            compiled.decode_attention(query, key, key, keys_t, values, torch.tensor(slots),
                                      torch.tensor(positions), 0, 1.0)
    assert not keys_t.any() and not values.any()


def test_usable_rows_needs_float32_heads_contiguous_within_a_row() -> None:
    packed = torch.zeros(4, 3 * DIM * 2)
    assert usable_rows(packed[:, :2 * DIM].view(4, 2, DIM))
    assert not usable_rows(packed.view(4, 6, DIM)[:, ::2])  # heads not adjacent
    assert not usable_rows(torch.zeros(4, 2, DIM, dtype=torch.bfloat16))
    assert not usable_rows(torch.zeros(4, DIM, 2).transpose(1, 2))


def test_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ENABLE_ENV, "0")
    assert cpu_kernels() is None


def test_built_once_into_the_cache_and_loaded_from_it(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One build (a few seconds) into the cache, replacing an earlier source's; a second call
    finds it."""
    if cpu_kernels() is None:
        pytest.skip("no C compiler here")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cpu_kernels-0123.so").write_bytes(b"an earlier build")
    monkeypatch.setenv(kernels.CACHE_ENV, str(cache))
    compiler = kernels.shutil.which("cc") or kernels.shutil.which("gcc")
    assert compiler is not None
    built = kernels._build(compiler)
    assert built.parent == cache and built.suffix == ".so"
    assert [p.name for p in cache.iterdir()] == [built.name]  # no partial, no stale file
    stamp = built.stat().st_mtime_ns
    assert kernels._build(compiler) == built and built.stat().st_mtime_ns == stamp


def test_a_failed_build_leaves_the_torch_ops(tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'no such compiler today' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    monkeypatch.setenv(kernels.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(kernels.ENABLE_ENV, raising=False)
    kernels._loaded.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=kernels.__name__):
            assert cpu_kernels() is None
        assert "no such compiler today" in caplog.text
        assert list((tmp_path / "cache").iterdir()) == []  # the partial output is removed
    finally:
        kernels._loaded.cache_clear()
