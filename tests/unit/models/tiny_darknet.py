"""A tiny darknet network for converter tests, and an independent numpy forward pass of it.

The reference follows darknet's C code (``forward_convolutional_layer``,
``forward_maxpool_layer``, ``forward_yolo_layer`` + ``get_yolo_box``) and reads
the parameters from the arrays this module wrote, never through the
converter's parser: a wrong read order, BN formula, padding or decode shows up
as a numeric difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BN_EPS = 1e-5

# Every block the converter supports: conv with and without BN, maxpool stride 2
# and darknet's size-2 stride-1 pooling, shortcut, route of one and of two layers
# (relative and absolute), upsample, and two [yolo] heads on different grids.
TINY_CFG = """[net]
# a comment, and blanks the parser must ignore
batch=1
width={width}
height={height}
channels=3

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=6
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=1

[convolutional]
batch_normalize=1
filters=6
size=1
stride=1
pad=1
activation=linear

[shortcut]
from=-3
activation=linear

[convolutional]
size=1
stride=1
pad=1
filters=14
activation=linear

[yolo]
mask = 2,3
anchors = 4,6,  9,8,  14,20,  30,28
classes=2
num=4

[route]
layers = -4

[convolutional]
batch_normalize=1
filters=4
size=1
stride=1
pad=1
activation=leaky

[upsample]
stride=2

[route]
layers = -1, 0

[convolutional]
size=3
stride=1
pad=1
filters=14
activation=linear

[yolo]
mask = 0,1
anchors = 4,6,  9,8,  14,20,  30,28
classes=2
num=4
"""

NAMES = ("cat", "dog")


@dataclass
class ConvParams:
    weight: np.ndarray
    bias: np.ndarray
    bn: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # gamma, mean, var


@dataclass
class TinyNet:
    cfg: Path
    weights: Path
    names: Path
    height: int
    width: int
    convs: dict[int, ConvParams] = field(default_factory=dict)


# (layer index, in channels, filters, size, batch_normalize) in file order
CONV_LAYERS = ((0, 3, 4, 3, True), (2, 4, 6, 3, False), (4, 6, 6, 1, True), (6, 6, 14, 1, False),
               (9, 6, 4, 1, True), (12, 8, 14, 3, False))


def write_tiny_net(folder: Path, height: int = 32, width: int = 32, seed: int = 0, major: int = 0, minor: int = 2,
                   extra_floats: int = 0) -> TinyNet:
    """cfg, weights (random, in darknet order) and names files; ``extra_floats`` may be negative."""
    rng = np.random.default_rng(seed)
    net = TinyNet(folder / "tiny.cfg", folder / "tiny.weights", folder / "tiny.names", height, width)
    net.cfg.write_text(TINY_CFG.format(height=height, width=width))
    net.names.write_text("\n".join(NAMES) + "\n")
    chunks: list[np.ndarray] = []
    for index, cin, filters, size, bn in CONV_LAYERS:
        bias = rng.normal(0, 0.1, filters).astype(np.float32)
        weight = rng.normal(0, 0.4, (filters, cin, size, size)).astype(np.float32)
        if bn:
            gamma = rng.uniform(0.5, 1.5, filters).astype(np.float32)
            mean = rng.normal(0, 0.2, filters).astype(np.float32)
            var = rng.uniform(0.3, 2.0, filters).astype(np.float32)
            chunks += [bias, gamma, mean, var, weight.ravel()]
            net.convs[index] = ConvParams(weight, bias, (gamma, mean, var))
        else:
            chunks += [bias, weight.ravel()]
            net.convs[index] = ConvParams(weight, bias)
    payload = np.concatenate(chunks).astype("<f4")
    if extra_floats > 0:
        payload = np.concatenate([payload, np.zeros(extra_floats, "<f4")])
    elif extra_floats < 0:
        payload = payload[:extra_floats]
    seen = np.array([12345], "<i8" if major * 10 + minor >= 2 else "<i4")
    header = np.array([major, minor, 0], "<i4").tobytes() + seen.tobytes()
    net.weights.write_bytes(header + payload.tobytes())
    return net


def parameter_count() -> int:
    """float32 values the cfg consumes: biases (+ scales, means, variances with BN) and weights per conv."""
    return sum(f * (4 if bn else 1) + f * c * s * s for _, c, f, s, bn in CONV_LAYERS)


# -- the reference forward pass (batch of one image, CHW float64) ----------------------------------------------------

def ref_conv(x: np.ndarray, p: ConvParams, leaky: bool) -> np.ndarray:
    filters, _, size, _ = p.weight.shape
    pad = size // 2
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    h, w = x.shape[1:]
    out = np.zeros((filters, h, w))
    for ky in range(size):
        for kx in range(size):
            patch = xp[:, ky:ky + h, kx:kx + w]  # (cin, h, w)
            out += np.einsum("fc,chw->fhw", p.weight[:, :, ky, kx].astype(np.float64), patch)
    if p.bn is not None:  # darknet: normalize, scale, then add the BN bias
        gamma, mean, var = (a.astype(np.float64) for a in p.bn)
        out = (out - mean[:, None, None]) / np.sqrt(var[:, None, None] + BN_EPS) * gamma[:, None, None]
    out += p.bias.astype(np.float64)[:, None, None]
    return np.where(out > 0, out, 0.1 * out) if leaky else out


def ref_maxpool(x: np.ndarray, size: int, stride: int) -> np.ndarray:
    """darknet's forward_maxpool_layer: padding = size - 1, offset -padding/2, out-of-image cells skipped."""
    padding = size - 1
    c, h, w = x.shape
    out_h, out_w = (h + padding - size) // stride + 1, (w + padding - size) // stride + 1
    offset = -(padding // 2)
    out = np.full((c, out_h, out_w), -np.inf)
    for i in range(out_h):
        for j in range(out_w):
            for n in range(size):
                for m in range(size):
                    y, xx = offset + i * stride + n, offset + j * stride + m
                    if 0 <= y < h and 0 <= xx < w:
                        out[:, i, j] = np.maximum(out[:, i, j], x[:, y, xx])
    return out


def ref_yolo(x: np.ndarray, mask: tuple[int, ...], anchors: list[float], classes: int, net_h: int,
             net_w: int) -> np.ndarray:
    """Rows (cx, cy, w, h in input pixels, objectness, class probs), ordered anchor, row, column."""
    _, lh, lw = x.shape
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    rows = []
    for a, n in enumerate(mask):
        block = x[a * (5 + classes):(a + 1) * (5 + classes)]
        for j in range(lh):
            for i in range(lw):
                t = block[:, j, i]
                rows.append([(i + sig(t[0])) / lw * net_w, (j + sig(t[1])) / lh * net_h,
                             np.exp(t[2]) * anchors[2 * n], np.exp(t[3]) * anchors[2 * n + 1],
                             *sig(t[4:])])
    return np.array(rows)


def reference_forward(net: TinyNet, image: np.ndarray) -> np.ndarray:
    """``(boxes, 5 + classes)`` for one ``(3, H, W)`` image, the layers of :data:`TINY_CFG` by hand."""
    anchors = [4, 6, 9, 8, 14, 20, 30, 28]
    c = net.convs
    out: dict[int, np.ndarray] = {}
    out[0] = ref_conv(image.astype(np.float64), c[0], leaky=True)
    out[1] = ref_maxpool(out[0], 2, 2)
    out[2] = ref_conv(out[1], c[2], leaky=True)
    out[3] = ref_maxpool(out[2], 2, 1)
    out[4] = ref_conv(out[3], c[4], leaky=False)
    out[5] = out[4] + out[2]
    out[6] = ref_conv(out[5], c[6], leaky=False)
    head1 = ref_yolo(out[6], (2, 3), anchors, 2, net.height, net.width)
    out[8] = out[4]
    out[9] = ref_conv(out[8], c[9], leaky=True)
    out[10] = out[9].repeat(2, axis=1).repeat(2, axis=2)
    out[11] = np.concatenate([out[10], out[0]], axis=0)
    out[12] = ref_conv(out[11], c[12], leaky=False)
    head2 = ref_yolo(out[12], (0, 1), anchors, 2, net.height, net.width)
    return np.concatenate([head1, head2])
