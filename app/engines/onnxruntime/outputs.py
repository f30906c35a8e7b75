"""OrtEngine's preallocated output sets, viewed at each input size, and the IO bindings made per size.

Why: a model with dynamic height and width gives outputs whose size follows
the input (``(batch, boxes, 85)`` with fewer boxes at 320×416 than at
416×416). Allocating output sets per input size would multiply their memory
by the number of camera aspect ratios; instead each set is one flat buffer
per output, sized for the nominal (largest) input, and every input size gets
``(rows, *trailing)`` views of the first bytes. Nothing is freed when a size
stops being used, so no handle can ever refer to released memory.

What is kept per input size (:class:`ShapeEntry`): the output views of every
set and the IO bindings made against them. At most :data:`MAX_SHAPES` sizes
are kept, least recently used dropped first; dropping one only forgets
bindings (a job still running holds its own reference to its binding, and the
memory stays), so a size that comes back costs one shape inference and new
bindings, nothing else.

Threads: :meth:`OutputSets.entry` runs on the engine thread
(``detstream.engine``) only.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MAX_SHAPES = 8
"""Input sizes whose views and bindings are kept; in practice one per camera aspect ratio."""

Trailing = list[tuple[int, ...] | None]
"""Per output: its shape without the batch dim, or None when ONNX Runtime must allocate it per run."""


class ShapeEntry:
    """What depends on one input size ``hw``: output views per set (None: allocated per run) and bindings per set.

    ``bindings[s]`` maps a key the engine chooses (a job index, a batch size,
    a chunk) to an ``onnxruntime.IOBinding`` whose outputs point into set ``s``.
    ``job_shape`` is the input shape of one job, ``(chunk, 3, h, w)``.
    """

    __slots__ = ("_first", "bindings", "hw", "job_shape", "outputs")

    def __init__(self, hw: tuple[int, int], chunk: int, outputs: list[list[np.ndarray]] | None, sets: int) -> None:
        self.hw = hw
        self.job_shape = (chunk, 3, *hw)
        self.outputs = outputs
        self.bindings: list[dict[int, Any]] = [{} for _ in range(sets)]
        self._first: list[dict[int, list[np.ndarray]]] = [{} for _ in range(sets)]

    def first_rows(self, s: int, n: int) -> list[np.ndarray] | None:
        """Set ``s``'s outputs cut to ``n`` rows (the views made once), or None when allocated per run."""
        if self.outputs is None:
            return None
        views = self._first[s].get(n)
        if views is None:
            views = self._first[s][n] = [out[:n] for out in self.outputs[s]]
        return views


class OutputSets:
    """``count`` output sets of ``rows`` rows, sized for the nominal input; views per input size (see module docstring).

    ``chunk`` is the rows one job runs (1, or the model's fixed batch).

    ``resolve(hw)`` returns the trailing output shapes at input size ``hw``
    (shape inference); it is called once per size that is not cached.
    """

    def __init__(self, count: int, rows: int, chunk: int, nominal: tuple[int, int], trailing: Trailing,
                 dtypes: list[np.dtype], resolve: Callable[[tuple[int, int]], Trailing]) -> None:
        self.count = count
        self.rows = rows
        self._chunk = chunk
        self._resolve = resolve
        self._dtypes = dtypes
        self._capacity: list[int] = []  # elements per row of each output
        self._buffers: list[list[np.ndarray]] = []
        if all(shape is not None for shape in trailing):
            self._capacity = [math.prod(shape) for shape in trailing if shape is not None]
            self._buffers = [[np.zeros(rows * size, dtype) for size, dtype in zip(self._capacity, dtypes, strict=True)]
                             for _ in range(count)]
        self._entries: OrderedDict[tuple[int, int], ShapeEntry] = OrderedDict()
        self._entries[nominal] = self._make(nominal, trailing)

    @property
    def preallocated(self) -> bool:
        """Whether outputs at the nominal size are bound to preallocated arrays (False: data-dependent sizes)."""
        return bool(self._buffers)

    def entry(self, hw: tuple[int, int]) -> ShapeEntry:
        """The views and bindings for input size ``hw``, made on first use (runs on the engine thread)."""
        found = self._entries.get(hw)
        if found is not None:
            self._entries.move_to_end(hw)
            return found
        made = self._entries[hw] = self._make(hw, self._resolve(hw))
        if len(self._entries) > MAX_SHAPES:
            dropped, _ = self._entries.popitem(last=False)
            logger.debug("output views for input %dx%d dropped (more than %d sizes in use)", *dropped, MAX_SHAPES)
        return made

    def _make(self, hw: tuple[int, int], trailing: Trailing) -> ShapeEntry:
        if not self._buffers or any(shape is None for shape in trailing):
            return ShapeEntry(hw, self._chunk, None, self.count)
        sizes = [math.prod(shape) for shape in trailing if shape is not None]
        if any(size > cap for size, cap in zip(sizes, self._capacity, strict=True)):
            logger.warning("outputs at input %dx%d (%s) exceed those at the nominal size; allocated per run",
                           hw[0], hw[1], trailing)
            return ShapeEntry(hw, self._chunk, None, self.count)
        views = [[buffer[: self.rows * size].reshape(self.rows, *shape)
                  for buffer, size, shape in zip(buffers, sizes, trailing, strict=True)]
                 for buffers in self._buffers]
        return ShapeEntry(hw, self._chunk, views, self.count)
