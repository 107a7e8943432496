#!/usr/bin/python3
"""Hugging Face's M-RoPE position ids for a document with images (tests/test_data_loader.cpp,
MRope.*), written from the public definition of Qwen3VLModel.get_rope_index (Qwen2-VL's rule):
the text before each image counts on from the last position + 1; an image of llm grid
(t, h / merge, w / merge) takes, from st_idx + text_len, its temporal index (0 for an image),
row and column; after the last image the text counts on again.

Usage: rope_index_ref.py CASES.json OUT.json. CASES: a list of {"ids": [...], "vision_start": id,
"image_token": id, "merge": m, "grids": [[t, h, w], ...] (in patches)}. OUT: per case
[[t...], [h...], [w...]] over its tokens.
"""
import json
import sys

import torch


def rope_index(ids, vision_start, image_token, merge, grids):
    input_ids = torch.tensor(ids)
    vision_start_indices = torch.argwhere(input_ids == vision_start).squeeze(1)
    vision_tokens = input_ids[vision_start_indices + 1]
    image_nums = int((vision_tokens == image_token).sum())
    input_tokens = input_ids.tolist()
    llm_pos_ids_list = []
    st = 0
    image_index = 0
    for _ in range(image_nums):
        ed = input_tokens.index(image_token, st)
        t, h, w = grids[image_index]
        image_index += 1
        llm_grid_t, llm_grid_h, llm_grid_w = t, h // merge, w // merge
        text_len = ed - st
        st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
        llm_pos_ids_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)
        t_index = torch.arange(llm_grid_t).view(-1, 1).expand(-1, llm_grid_h * llm_grid_w).flatten()
        h_index = torch.arange(llm_grid_h).view(1, -1, 1).expand(llm_grid_t, -1, llm_grid_w).flatten()
        w_index = torch.arange(llm_grid_w).view(1, 1, -1).expand(llm_grid_t, llm_grid_h, -1).flatten()
        llm_pos_ids_list.append(torch.stack([t_index, h_index, w_index]) + text_len + st_idx)
        st = ed + llm_grid_t * llm_grid_h * llm_grid_w
    if st < len(input_tokens):
        st_idx = llm_pos_ids_list[-1].max() + 1 if len(llm_pos_ids_list) > 0 else 0
        text_len = len(input_tokens) - st
        llm_pos_ids_list.append(torch.arange(text_len).view(1, -1).expand(3, -1) + st_idx)
    return torch.cat(llm_pos_ids_list, dim=1).reshape(3, -1)


def main():
    out = []
    for c in json.load(open(sys.argv[1])):
        out.append(rope_index(c["ids"], c["vision_start"], c["image_token"], c["merge"], c["grids"]).tolist())
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
