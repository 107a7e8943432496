#!/usr/bin/python3
"""transformers' smart_resize (Qwen2VLImageProcessor, which Qwen2-VL, Qwen2.5-VL and Qwen3-VL use;
tests/test_data.cpp, Image.QwenResizeIsTransformersSmartResize), written from its public source:
both sides rounded to multiples of `factor` by Python's round; above max_pixels both scaled by
beta = sqrt(h·w / max_pixels) and floored (at least factor); below min_pixels scaled by
sqrt(min_pixels / (h·w)) and ceiled; an aspect ratio above 200 refused.

Usage: smart_resize_ref.py CASES.json OUT.json. CASES: [[height, width, factor, min_pixels,
max_pixels], ...]; OUT: per case [h, w], or null when it is refused.
"""
import json
import math
import sys


def smart_resize(height, width, factor, min_pixels, max_pixels):
    if max(height, width) / min(height, width) > 200:
        raise ValueError("absolute aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def main():
    out = []
    for h, w, f, lo, hi in json.load(open(sys.argv[1])):
        try:
            out.append(list(smart_resize(h, w, f, lo, hi)))
        except ValueError:
            out.append(None)
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
