"""The output layouts detstream decodes, registered in one place.

===========  =======================  ===============================================
layout       output shape             rows
===========  =======================  ===============================================
``yolov5``   ``[N, boxes, 5 + C]``    cx, cy, w, h (input px), objectness, C class probs
``yolov8``   ``[N, 4 + C, boxes]``    cx, cy, w, h (input px), C class scores
``nms``      ``[N, max_det, 6]``      x1, y1, x2, y2 (input px), score, class id
===========  =======================  ===============================================

Each layout is one module (a :class:`~app.postprocess.layouts.base.Layout`
subclass and its ``LAYOUT`` instance). :data:`LAYOUTS` is the registry that
``model.format``, :func:`app.models.spec.load_model_spec` and
:func:`app.postprocess.yolo.decode_batch` read; adding a layout is a new
module plus its entry in ``_BUILTIN`` below (or one :func:`register` call
from outside the package). docs/models.md, "Adding an output layout", walks
through one.
"""

from __future__ import annotations

from app.postprocess.layouts import nms, yolov5, yolov8
from app.postprocess.layouts.base import Layout, Shape

_BUILTIN: tuple[Layout, ...] = (yolov5.LAYOUT, yolov8.LAYOUT, nms.LAYOUT)

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in _BUILTIN}
"""Every known layout by name, in registration order."""


def register(layout: Layout) -> Layout:
    """Add ``layout`` to :data:`LAYOUTS` under ``layout.name``; a name already taken by another layout is refused."""
    name = getattr(layout, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{layout!r}: a layout needs a non-empty name")
    if LAYOUTS.get(name, layout) is not layout:
        raise ValueError(f"layout name {name!r} is already registered")
    LAYOUTS[name] = layout
    return layout


def known() -> str:
    """The registered names, for messages: ``yolov5, yolov8, nms``."""
    return ", ".join(LAYOUTS)


def infer_layout(shape: Shape) -> str | None:
    """The one layout ``shape`` implies, or None when none or several do.

    ``[N, 300, 6]`` is nms; ``[N, 2535, 85]`` yolov5 (boxes outnumber the
    values per box); ``[N, 84, 8400]`` yolov8. With symbolic box counts the
    fixed dimension decides: ``[N, boxes, 85]`` is yolov5, ``[N, 84, boxes]``
    yolov8, ``[N, boxes, 6]`` stays ambiguous (nms or a 1-class yolov5).
    """
    implied = [name for name, layout in LAYOUTS.items() if layout.implied_by(shape)]
    return implied[0] if len(implied) == 1 else None


def fitting_layouts(shape: Shape) -> list[str]:
    """The names of every layout whose shape check ``shape`` passes, in registration order."""
    return [name for name, layout in LAYOUTS.items() if layout.fits(shape)]
