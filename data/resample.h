// Pillow's bicubic resize of 8-bit RGB images, bit for bit: what Hugging Face's CLIP, SigLIP
// and LLaVA image processors run (PIL.Image.resize(size, Image.BICUBIC)), so that a tower
// imported from a folder sees the pixels it was trained on. OpenCV's cubic is another filter
// (A = -0.75, a fixed 4-tap support): shrinking 512 to 336 px it differs from Pillow by up to
// 148 grey levels on a photo.
#pragma once

#include <opencv2/core.hpp>

namespace dhp {

// Pillow's algorithm: a separable convolution with the cubic kernel of A = -0.5, whose support
// widens by the downscale factor (so shrinking averages, without aliasing); per output pixel
// the taps from round(centre -+ support), their weights normalised to sum 1 and then made
// 22-bit fixed point (rounded half away from zero); rows first, each pass rounded to 8 bits
// (accumulator from 2^21, floor, clamp to 0..255). `rgb` is CV_8UC3 (any channel order: the
// channels are resized alike).
cv::Mat pil_resize_bicubic(const cv::Mat& rgb, int out_w, int out_h);

}  // namespace dhp
