"""What an output layout is: the one class every layout module implements.

A layout names how a detector lays out its first output tensor and turns a
batch of it into candidate boxes. Each layout is one module in this package
(``yolov5``, ``yolov8``, ``nms``) that owns everything about it: its shape
check, how it orients an ambiguous shape, its class count and its decode.
:mod:`app.postprocess.layouts` registers them; nothing else names a layout.

Shapes come from the ONNX file or from an output array. Dimensions may be
symbolic (``"batch"``, ``"boxes"``) or unknown (``None``, ``-1``); those are
never held against a layout, and never used to guess one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import numpy as np

Dim = int | str | None
Shape = Sequence[Dim]


class Candidates(NamedTuple):
    """Boxes of a whole batch above the confidence threshold, before NMS; all arrays have length ``n``.

    ``frame_idx`` ``(n,)`` is the frame each box belongs to, ascending;
    ``xyxy`` ``(n, 4)`` float32 is in input pixels; ``scores`` ``(n,)``;
    ``class_ids`` ``(n,)`` integers.
    """

    frame_idx: np.ndarray
    xyxy: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray


def fixed(dim: Dim) -> int | None:
    """A dimension's size when the shape fixes it; None when it is symbolic or unknown."""
    return dim if isinstance(dim, int) and dim >= 0 else None


def rows_and_columns(shape: Shape) -> tuple[int | None, int | None] | None:
    """``(shape[1], shape[2])`` as fixed sizes for a rank-3 ``[N, rows, columns]`` shape, else None."""
    if len(shape) != 3:
        return None
    return fixed(shape[1]), fixed(shape[2])


def show(shape: Shape) -> str:
    """``[batch, 2535, 85]``: a shape as people write it (unknown dimensions as ``?``)."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    """``(n, 4)`` centre/size boxes → corner boxes."""
    half = boxes[:, 2:4] / 2
    return np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1)


class Layout(ABC):
    """One output layout. Subclass it in a module of its own and register an instance.

    Three shape questions, from most to least trusting:

    * :meth:`fits`: can the shape hold this layout at all? Asked when the user
      names the layout (``model.format``) and before every decode.
    * :meth:`oriented`: does it also lie the way models of this layout make it
      (a detector proposes more boxes than it has values per box)? Asked when
      the file's metadata names the layout.
    * :meth:`implied_by`: does the shape alone say this layout? Asked when
      nothing names one; a layout is inferred only when exactly one says yes.
    """

    name: ClassVar[str]
    """What ``model.format`` and the ``detstream.layout`` metadata key say."""
    shape: ClassVar[str]
    """The output shape as people write it, e.g. ``[N, boxes, 5+C]``."""
    suppressed: ClassVar[bool] = False
    """True when the model ran NMS itself: the decode then only thresholds and caps."""

    @abstractmethod
    def fits(self, shape: Shape) -> bool:
        """Whether ``shape`` can hold this layout (unknown dimensions are not held against it)."""

    def oriented(self, shape: Shape) -> bool:
        """Whether ``shape`` fits and lies as this layout's models produce it; :meth:`fits` unless overridden."""
        return self.fits(shape)

    @abstractmethod
    def implied_by(self, shape: Shape) -> bool:
        """Whether ``shape`` alone says this layout; only fixed dimensions may say so."""

    def class_count(self, shape: Shape) -> int | None:
        """C, the classes ``shape`` holds, or None when the shape does not say (the default)."""
        return None

    def expected_shape(self, classes: int) -> str:
        """The shape this layout has for ``classes`` classes, for error messages; :attr:`shape` by default."""
        return self.shape

    @abstractmethod
    def candidates(self, out: np.ndarray, conf_threshold: float) -> Candidates:
        """Boxes of ``out`` (one batch, ``[frames, ...]``) whose score may exceed ``conf_threshold``.

        Vectorised numpy over the whole batch: this runs for every batch. The
        caller applies the exact ``score > conf_threshold`` test and the class
        filter afterwards, so a layout may return a superset. Returned arrays
        must not be views of ``out`` (the engine reuses that buffer).
        """
