#!/usr/bin/python3
"""Pillow's side of the tiling check (tests/test_resample.cpp, InternVlTiling): InternVL's own
dynamic_preprocess (hf_internvl_ref.py's transcription of internvl/train/dataset.py, Pillow's
bicubic throughout) on crops of real images of varied sizes and aspect ratios, and its grid
choice alone on many sizes.

Usage: internvl_tiles.py OUT_DIR. Writes OUT_DIR/src_i.png (the crop, lossless), OUT_DIR/tiles_i.rgb
(every tile, S x S x 3 raw RGB rows, one after another, the thumbnail last), OUT_DIR/cases.json:
[{"w", "h", "size", "min", "max", "thumbnail", "grid": [cols, rows], "tiles"}], and
OUT_DIR/grids.json: [{"w", "h", "size", "min", "max", "grid"}] for sizes from 1 px to 20000 px.
The real images are pil_resize.py's (matplotlib's sample photo and scans).
"""
import json
import os
import sys

import numpy as np

from hf_internvl_ref import dynamic_preprocess, target_grid
from pil_resize import sources


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(11)
    srcs = sources()
    cases = []
    for i in range(60):
        s = srcs[i % len(srcs)]
        sw, sh = s.size
        # A crop of 8 px to the whole image, any aspect ratio (strips included), and InternVL3's
        # tile side (448) or smaller ones, with InternVL3's tile counts and others.
        w = int(rng.integers(8, sw + 1))
        h = int(rng.integers(8, sh + 1))
        if i % 7 == 3:
            h = int(rng.integers(8, 24))  # a wide strip
        if i % 7 == 5:
            w = int(rng.integers(8, 24))  # a tall one
        x0, y0 = int(rng.integers(0, sw - w + 1)), int(rng.integers(0, sh - h + 1))
        crop = s.crop((x0, y0, x0 + w, y0 + h))
        # InternVL3's 448 px tiles on every tenth crop (up to 6 + 1 tiles, so that the fixture
        # stays small), smaller tiles with InternVL3's 12 and other counts elsewhere.
        lo, hi = [(1, 12), (1, 6), (2, 9), (1, 1), (1, 40)][i % 5]
        size = 448 if i % 10 == 1 else int(rng.choice([56, 112])) if hi > 12 else int(rng.choice([56, 112, 224]))
        thumbnail = i % 6 != 1
        crop.save(os.path.join(out, f"src_{i}.png"))
        tiles = dynamic_preprocess(crop, lo, hi, size, thumbnail)
        with open(os.path.join(out, f"tiles_{i}.rgb"), "wb") as f:
            for t in tiles:
                assert t.size == (size, size) and t.mode == "RGB"
                f.write(t.tobytes())
        cases.append({"w": w, "h": h, "size": size, "min": lo, "max": hi, "thumbnail": thumbnail,
                      "grid": list(target_grid(w, h, lo, hi, size)), "tiles": len(tiles)})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f)
    grids = []
    for _ in range(4000):
        w, h = (int(x) for x in np.exp(rng.uniform(0, np.log(20000), 2)))
        size = int(rng.choice([448, 56, 14]))
        lo, hi = [(1, 12), (1, 6), (3, 24), (1, 36)][len(grids) % 4]
        grids.append({"w": w, "h": h, "size": size, "min": lo, "max": hi,
                      "grid": list(target_grid(w, h, lo, hi, size))})
    with open(os.path.join(out, "grids.json"), "w") as f:
        json.dump(grids, f)


if __name__ == "__main__":
    main()
