"""The decode rows' keys and values, kept between iterations in one slot per sequence.

A decoding row attends to every cached key of its sequence. Gathering those from the paged pool
(``attention._gather_blocks``) copies all of them, per layer and iteration, and reorders them for
the batched matmuls. ``DecodeKvCopy`` keeps each layer's gathered keys (transposed,
[C, Hkv, D, W]) and values ([C, Hkv, W, D]) from one iteration to the next, one slot (of C) per
decoding sequence and W tokens per slot:

- a sequence that decodes again, one token further, with its earlier blocks unchanged, keeps its
  slot: the iteration only writes its new token's key and value there (as into the pool);
- a sequence seen for the first time (new, resumed, forked), or whose earlier blocks changed
  (a copied shared block), gets a free slot filled from the pool; a sequence that does not
  decode in an iteration gives its slot back;
- more rows or a longer row than the slots hold grow them (the kept keys are copied over);
  mostly idle slots or mostly unused width start over (everything is gathered again).

So joining and leaving sequences, which in a served load happen nearly every iteration, cost
only their own rows. The attention runs over all C slots and W keys (a slot's keys past its
length, and idle slots, are masked or dropped), so the result is not bitwise the one over the
gathered rows (the reductions run over more, masked, keys) but agrees to float32 rounding.
Owned by the engine; executor loop thread only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from collections.abc import Sequence

KEEP_DECODE_KV_MAX_BYTES = 256 * 2**20  # larger kept copies are not kept between iterations
SLOT_GRANULE = 8  # slots grow in steps of this many rows


@dataclass(frozen=True)
class SlotPlan:
    """Where one iteration's decode rows live in the kept copy."""

    slots: torch.Tensor  # [Bd] slot of each decode row (row order)
    positions: torch.Tensor  # [Bd] position (= key index) of each row's new token
    gather_rows: torch.Tensor | None  # decode rows whose slot is filled from the pool now
    gather_slots: torch.Tensor | None  # ... and their slots
    capacity: int  # C, slots of every layer's tensors this iteration
    width: int  # W, tokens per slot
    identity: bool  # slots == arange(Bd) and C == Bd: no reordering in or out
    masks: dict[int, torch.Tensor | None] = field(default_factory=dict)  # by id(row mask)


@dataclass
class _Slot:
    owner: object
    table: tuple[int, ...]
    cached: int  # tokens before this iteration's one


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule


class DecodeKvCopy:
    def __init__(self, bytes_per_token: int, width_growth: float = 1.0) -> None:
        """``bytes_per_token``: the key and value of one token over all layers.
        ``width_growth``: when a row needs more width than the slots have, they grow to this many
        times the larger of the row's and their own width (1: just enough; more suits an
        attention that reads only each row's own keys, for which spare width costs nothing but
        memory, and saves copying the slots at every block boundary)."""
        self.bytes_per_token = bytes_per_token
        self.width_growth = width_growth
        # layer -> keys transposed [C, Hkv, D, W], values [C, Hkv, W, D]
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._slots: list[_Slot | None] = []
        self._slot_of: dict[int, int] = {}  # id(owner) -> slot
        self._width = 0

    def plan(self, owners: Sequence[object | None], cached: Sequence[int],
             tables: Sequence[Sequence[int]], row_width: int,
             device: torch.device | str) -> SlotPlan | None:
        """One iteration's decode rows (their sequences, cached tokens and block tables;
        ``row_width``: the batch's padded decode width in tokens): the plan, or None when the
        copy would be too large to keep (the layers then gather every iteration)."""
        count = len(owners)
        capacity = max(len(self._slots), _round_up(count, SLOT_GRANULE))
        width = self._width
        growth = self.width_growth
        if row_width > width:  # with headroom: each growth copies every layer's slots
            width = max(int(row_width * growth), int(width * growth))
        restart = not self.layers
        if count * 2 < capacity and capacity > SLOT_GRANULE:  # mostly idle slots
            capacity, restart = _round_up(count, SLOT_GRANULE), True
        if row_width * 2 * growth * growth <= width and width > row_width:  # mostly unused
            width, restart = int(row_width * growth), True
        if capacity * width * self.bytes_per_token > KEEP_DECODE_KV_MAX_BYTES:
            self.forget()
            return None
        if restart:
            self.forget()
        self._slots += [None] * (capacity - len(self._slots))
        self._width = width
        present = {id(owner) for owner in owners if owner is not None}
        for index, slot in enumerate(self._slots):
            if slot is not None and id(slot.owner) not in present:
                self._slots[index] = None
                del self._slot_of[id(slot.owner)]
        free = (index for index, slot in enumerate(self._slots) if slot is None)
        slots: list[int] = []
        gather: list[int] = []
        for row, (owner, done, blocks) in enumerate(zip(owners, cached, tables, strict=True)):
            table = tuple(blocks)
            known = self._slot_of.get(id(owner)) if owner is not None else None
            slot = self._slots[known] if known is not None else None
            if (restart or slot is None or slot.owner is not owner or slot.cached + 1 != done
                    or table[:len(slot.table)] != slot.table):
                gather.append(row)
            index = known if known is not None else next(free)
            if owner is not None:
                self._slots[index] = _Slot(owner, table, done)
                self._slot_of[id(owner)] = index
            else:  # not matched again: the slot is free for the next iteration
                self._slots[index] = None
            slots.append(index)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return SlotPlan(
            slots=tensor(slots), positions=tensor(list(cached)),
            gather_rows=tensor(gather) if gather else None,
            gather_slots=tensor([slots[row] for row in gather]) if gather else None,
            capacity=capacity, width=width,
            identity=capacity == count and slots == list(range(count)))

    def forget(self) -> None:
        self.layers.clear()
        self._slots = []
        self._slot_of.clear()
        self._width = 0

    def tensors(self, layer: int, plan: SlotPlan, kv_heads: int, dim: int, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's kept keys (transposed) and values, grown to the plan's slots and width
        (what they held is kept; new room is zeros, so every key is finite)."""
        kept = self.layers.get(layer)
        if kept is None:
            kept = (torch.zeros((plan.capacity, kv_heads, dim, plan.width), dtype=dtype,
                                device=device),
                    torch.zeros((plan.capacity, kv_heads, plan.width, dim), dtype=dtype,
                                device=device))
        else:
            keys_t, values = kept
            more_rows, more_keys = plan.capacity - keys_t.shape[0], plan.width - keys_t.shape[3]
            if more_rows or more_keys:
                kept = (F.pad(keys_t, (0, more_keys, 0, 0, 0, 0, 0, more_rows)),
                        F.pad(values, (0, 0, 0, more_keys, 0, 0, 0, more_rows)))
        self.layers[layer] = kept
        return kept

    @staticmethod
    def slot_mask(plan: SlotPlan, row_mask: torch.Tensor | None, lengths: Sequence[int],
                  dtype: torch.dtype) -> torch.Tensor | None:
        """The additive mask [C, 1, 1, W] of the slots: each row's ``row_mask`` ([Bd, 1, 1,
        Wb] of the batch, or None when every row attends to all Wb keys) widened with -inf to
        W; idle slots attend to everything (finite values; their output is dropped). None
        when no key of any slot is masked. Built once per iteration and row mask."""
        key = id(row_mask) if row_mask is not None else 0
        if key in plan.masks:
            return plan.masks[key]
        rows = plan.slots.shape[0]
        row_width = row_mask.shape[-1] if row_mask is not None else max(lengths)
        device = plan.slots.device
        if row_mask is None and row_width == plan.width and plan.identity:
            plan.masks[key] = None
            return None
        widened = torch.full((rows, 1, 1, plan.width), float("-inf"), dtype=dtype,
                             device=device)
        if row_mask is None:
            widened[..., :row_width] = 0
        else:
            widened[..., :row_width] = row_mask
        mask = widened if plan.identity else torch.zeros(
            (plan.capacity, 1, 1, plan.width), dtype=dtype, device=device).index_copy_(
                0, plan.slots, widened)
        plan.masks[key] = mask
        return mask
