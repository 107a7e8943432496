#!/usr/bin/python3
"""Pillow's side of the image-processor check (tests/test_resample.cpp).

Cuts real images into crops of varied sizes and aspect ratios and resizes them with Pillow's
Image.resize(size, Image.BICUBIC), as Hugging Face's image processors do, and runs the three
processor pipelines dhp implements, written here from transformers' code:
  - clip: CLIPImageProcessor: the short side to `size` (the long side int(size * long / short)),
    bicubic, then a centre crop of size x size at ((h - size) // 2, (w - size) // 2);
  - siglip: SiglipImageProcessor: resized to size x size, bicubic;
  - pad_square: LLaVA's expand2square (the image pasted at ((side - w) // 2, (side - h) // 2) on a
    square of its longer side filled with tuple(int(255 * m) for m in image_mean)), then the
    CLIP processor (a square: resized to size x size).
The real images are those a fresh machine of this project has: matplotlib's sample photo
(grace_hopper.jpg, python3-matplotlib) and its sample scans (an MRI slice, two elevation maps),
shown as images.

Usage: pil_resize.py OUT_DIR. Writes OUT_DIR/src_i.png (the crop, lossless), OUT_DIR/resized_i.rgb
(Pillow's resize to the case's size, raw RGB rows) and, per mode, OUT_DIR/<mode>_i.rgb, and
OUT_DIR/cases.json: [{"w", "h", "out_w", "out_h", "size"}]; and OUT_DIR/fmt_* (WebP and GIF
files of one crop, for the format test).
"""
import gzip
import json
import os
import sys

import numpy as np
from PIL import Image

SAMPLES = "/usr/share/matplotlib/mpl-data/sample_data"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)


def to_rgb(a):
    a = np.asarray(a, dtype=np.float64)
    a = (a - a.min()) / max(a.max() - a.min(), 1e-12)
    # A simple colour ramp, so that the three channels differ.
    r, g, b = a, np.sqrt(a), a * a
    return Image.fromarray((np.stack([r, g, b], axis=-1) * 255 + 0.5).astype(np.uint8), "RGB")


def sources():
    out = [Image.open(os.path.join(SAMPLES, "grace_hopper.jpg")).convert("RGB")]
    with gzip.open(os.path.join(SAMPLES, "s1045.ima.gz")) as f:
        out.append(to_rgb(np.frombuffer(f.read(), np.uint16).astype(np.float64).reshape(256, 256)))
    with np.load(os.path.join(SAMPLES, "jacksboro_fault_dem.npz")) as d:
        out.append(to_rgb(d["elevation"]))
    with np.load(os.path.join(SAMPLES, "topobathy.npz")) as d:
        out.append(to_rgb(d["topo"]))
    return out


def clip(img, size):
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    r = img.resize((new_w, new_h), Image.BICUBIC)
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return r.crop((left, top, left + size, top + size))


def pad_square(img, size):
    w, h = img.size
    fill = tuple(int(x * 255) for x in CLIP_MEAN)
    if w != h:
        side = max(w, h)
        sq = Image.new("RGB", (side, side), fill)
        sq.paste(img, ((side - w) // 2, (side - h) // 2))
        img = sq
    return img.resize((size, size), Image.BICUBIC)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    srcs = sources()
    cases = []
    for i in range(60):
        s = srcs[i % len(srcs)]
        sw, sh = s.size
        # A crop of 16 px to the whole image, any aspect ratio, then a target from a fifth to
        # three times its size per axis (shrinking and enlarging, and one axis each way).
        w = int(rng.integers(16, sw + 1))
        h = int(rng.integers(16, sh + 1))
        x0, y0 = int(rng.integers(0, sw - w + 1)), int(rng.integers(0, sh - h + 1))
        crop = s.crop((x0, y0, x0 + w, y0 + h))
        out_w = max(1, int(w * rng.uniform(0.2, 3.0)))
        out_h = max(1, int(h * rng.uniform(0.2, 3.0)))
        size = int(rng.choice([28, 56, 224, 336]))
        crop.save(os.path.join(out, f"src_{i}.png"))
        with open(os.path.join(out, f"resized_{i}.rgb"), "wb") as f:
            f.write(crop.resize((out_w, out_h), Image.BICUBIC).tobytes())
        for mode, fn in (("clip", clip), ("siglip", lambda im, n: im.resize((n, n), Image.BICUBIC)),
                         ("pad_square", pad_square)):
            with open(os.path.join(out, f"{mode}_{i}.rgb"), "wb") as f:
                f.write(fn(crop, size).tobytes())
        cases.append({"w": w, "h": h, "out_w": out_w, "out_h": out_h, "size": size})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f)
    # The other formats LLaVA data sets hold, from one crop (its PNG is fmt_src.png): WebP lossless,
    # lossy and extended (VP8X, with an ICC profile), an animated WebP and a GIF.
    img = srcs[0].crop((40, 30, 40 + 123, 30 + 77))
    img.save(os.path.join(out, "fmt_src.png"))
    img.save(os.path.join(out, "fmt_lossless.webp"), lossless=True)
    img.save(os.path.join(out, "fmt_lossy.webp"), quality=80)
    img.save(os.path.join(out, "fmt_extended.webp"), lossless=True, icc_profile=b"\0" * 128)
    img.save(os.path.join(out, "fmt_anim.webp"), save_all=True, append_images=[img.rotate(180)], duration=100)
    img.save(os.path.join(out, "fmt.gif"))


if __name__ == "__main__":
    main()
