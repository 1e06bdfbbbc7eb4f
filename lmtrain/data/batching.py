"""TBPTT batching: B contiguous streams cut into windows of T tokens, served in stream order.

``batchify`` lays a 1-D id stream out as (B, L) (row b = tokens [b*L, (b+1)*L), the tail dropped);
window i of :class:`WindowDataset` is columns [i*T, i*T + T) as inputs and the same shifted by one
as targets, so the hidden state at the end of window i is the right start for window i + 1 (with variable lengths,
``lmtrain.data.window_lengths``, window i starts where window i - 1 ended).
:class:`StreamSampler` yields window indices in order from a settable start (mid-epoch resume).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from lmtrain.data.errors import DataError
from lmtrain.data.window_lengths import fixed_lengths


def batchify(ids: Tensor, batch_size: int, split: str = "data") -> Tensor:
    """(L_total,) -> (B, L): B contiguous rows of L = L_total // B tokens (the last L_total % B dropped)."""
    if batch_size < 1:
        raise DataError(f"batch size {batch_size} for {split} is not positive: set it to 1 or more.")
    length = ids.numel() // batch_size
    if length < 2:
        raise DataError(
            f"the {split} split has {ids.numel()} tokens, too few for {batch_size} rows of at least 2 "
            "tokens: lower the batch size or use more data."
        )
    return ids[: length * batch_size].view(batch_size, length)


def shard_rows(data: Tensor, rank: int, world_size: int, what: str = "batch_size") -> Tensor:
    """This rank's contiguous block of rows of a (B, L) layout; B must be divisible by the world size."""
    rows = data.shape[0]
    if rows % world_size:
        raise DataError(
            f"{what}={rows} is not divisible by the {world_size} processes: set data.{what} to a multiple of "
            f"{world_size} (it is the global batch, split into equal blocks of rows)."
        )
    per_rank = rows // world_size
    return data[rank * per_rank : (rank + 1) * per_rank]


class WindowDataset(Dataset):
    """Map-style dataset of TBPTT windows over a (B, L) layout; item i = (inputs, targets), each (B, T_i).

    T_i = bptt except for the last window, which holds the remaining L - 1 - i*bptt positions; or, given
    ``lengths`` (adding up to L - 1), T_i = lengths[i], each window starting where the one before ended.
    """

    def __init__(self, data: Tensor, bptt: int, lengths: list[int] | None = None) -> None:
        if bptt < 1:
            raise DataError(f"bptt is {bptt}: set data.bptt to a positive window length.")
        self.data, self.bptt = data, bptt
        positions = data.shape[1] - 1
        if lengths is None:
            lengths = fixed_lengths(positions, bptt)
        self.starts = list(itertools.accumulate(lengths, initial=0))  # window i: [starts[i], starts[i + 1])
        if self.starts[-1] != positions:
            raise ValueError(f"window lengths add up to {self.starts[-1]}, not the layout's {positions} positions")
        self.num_windows = len(lengths)

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not 0 <= index < self.num_windows:
            raise IndexError(f"window {index} out of range [0, {self.num_windows})")
        start, end = self.starts[index], self.starts[index + 1]
        inputs = self.data[:, start:end].contiguous()  # (B, T_i)
        targets = self.data[:, start + 1 : end + 1].contiguous()  # (B, T_i), shifted by one
        return inputs, targets


class StreamSampler(Sampler[int]):
    """Window indices in stream order, from ``start``; the start applies to the next pass only.

    ``len()`` is always the full ``num_windows``; a pass from ``start`` yields ``num_windows - start``.

    A loader that prefetches (Lightning does, one batch) runs ahead of the training step, so resume
    from the loop's own batch counter: ``set_start(batch_idx + 1)``.
    """

    def __init__(self, num_windows: int, start: int = 0) -> None:
        self.num_windows = num_windows
        self.start = 0
        self.set_start(start)

    def set_start(self, window_index: int) -> None:
        """Make the next pass begin at ``window_index`` (0 <= index <= num_windows)."""
        if not 0 <= window_index <= self.num_windows:
            raise DataError(
                f"resume window {window_index} is outside this epoch's 0..{self.num_windows} windows: "
                "resume with the same data, batch_size and bptt."
            )
        self.start = int(window_index)

    def __len__(self) -> int:
        # the full epoch, also while a resumed pass yields only num_windows - start: Lightning reads the
        # length once per fit, and its resumed batch counter continues from the start window
        return self.num_windows

    def __iter__(self) -> Iterator[int]:
        # read once: a loader may stop by count without exhausting this generator (Lightning does when
        # it resumes mid-epoch), so the reset cannot wait for the end of the pass
        start, self.start = self.start, 0
        yield from range(start, self.num_windows)


class StreamLoader(DataLoader):
    """The training loader. Lightning calls a loader with ``state_dict`` / ``load_state_dict`` resumable, and warns
    on a mid-epoch resume of any other. The position itself is restored by ``lmtrain.run_folder.resume``
    (``StreamSampler.set_start`` from the training loop's own batch counter, because the loader runs a window
    ahead of training), so this state only records the layout and loading it changes nothing."""

    def state_dict(self) -> dict[str, Any]:
        return {"windows_per_epoch": len(self.sampler)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore here (see the class docstring)."""
