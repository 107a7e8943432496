#include "data/resample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace dhp {

namespace {

constexpr int kBits = 32 - 8 - 2;  // fixed-point fraction: headroom for 8-bit sums of taps

double cubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// The taps of each output pixel along one axis: the first input pixel, how many, and their
// fixed-point weights (`size` per output pixel, the unused ones 0).
struct Taps {
  int size = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weight;
};

Taps taps(int in, int out) {
  Taps t;
  const double scale = double(in) / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;  // the cubic's support is 2
  const double inv = 1.0 / filter_scale;
  t.size = int(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out));
  t.count.resize(size_t(out));
  t.weight.assign(size_t(out) * size_t(t.size), 0);
  std::vector<double> k(size_t(t.size));
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    // Truncation toward zero, as C's cast: the bounds are rounded, then clamped.
    const int lo = std::max(0, int(center - support + 0.5));
    const int hi = std::min(in, int(center + support + 0.5));
    const int n = hi - lo;
    double sum = 0.0;
    for (int x = 0; x < n; ++x) {
      k[size_t(x)] = cubic((double(x + lo) - center + 0.5) * inv);
      sum += k[size_t(x)];
    }
    for (int x = 0; x < n; ++x) {
      const double w = sum != 0.0 ? k[size_t(x)] / sum : k[size_t(x)];
      t.weight[size_t(o) * size_t(t.size) + size_t(x)] =
          int32_t(w < 0 ? -0.5 + w * (1 << kBits) : 0.5 + w * (1 << kBits));
    }
    t.first[size_t(o)] = lo;
    t.count[size_t(o)] = n;
  }
  return t;
}

uint8_t to_8bit(int32_t acc) {
  return uint8_t(std::clamp(acc >> kBits, 0, 255));  // an arithmetic shift: the floor
}

}  // namespace

cv::Mat pil_resize_bicubic(const cv::Mat& rgb, int out_w, int out_h) {
  DHP_CHECK(rgb.type() == CV_8UC3 && !rgb.empty() && out_w > 0 && out_h > 0,
            "pil_resize_bicubic: an 8-bit 3-channel image and a positive size");
  cv::Mat src = rgb;
  if (out_w != src.cols) {
    const Taps t = taps(src.cols, out_w);
    cv::Mat dst(src.rows, out_w, CV_8UC3);
    for (int y = 0; y < src.rows; ++y) {
      const uint8_t* in = src.ptr<uint8_t>(y);
      uint8_t* out = dst.ptr<uint8_t>(y);
      for (int o = 0; o < out_w; ++o) {
        const int32_t* w = &t.weight[size_t(o) * size_t(t.size)];
        const uint8_t* p = in + 3 * t.first[size_t(o)];
        int32_t a0 = 1 << (kBits - 1), a1 = a0, a2 = a0;
        for (int x = 0; x < t.count[size_t(o)]; ++x, p += 3) {
          a0 += p[0] * w[x];
          a1 += p[1] * w[x];
          a2 += p[2] * w[x];
        }
        out[3 * o] = to_8bit(a0), out[3 * o + 1] = to_8bit(a1), out[3 * o + 2] = to_8bit(a2);
      }
    }
    src = dst;
  }
  if (out_h != src.rows) {
    const Taps t = taps(src.rows, out_h);
    cv::Mat dst(out_h, src.cols, CV_8UC3);
    const int row = src.cols * 3;
    std::vector<int32_t> acc(static_cast<size_t>(row));
    for (int o = 0; o < out_h; ++o) {
      const int32_t* w = &t.weight[size_t(o) * size_t(t.size)];
      std::fill(acc.begin(), acc.end(), 1 << (kBits - 1));
      for (int y = 0; y < t.count[size_t(o)]; ++y) {
        const uint8_t* in = src.ptr<uint8_t>(t.first[size_t(o)] + y);
        for (int i = 0; i < row; ++i) acc[size_t(i)] += in[i] * w[y];
      }
      uint8_t* out = dst.ptr<uint8_t>(o);
      for (int i = 0; i < row; ++i) out[i] = to_8bit(acc[size_t(i)]);
    }
    src = dst;
  }
  return src.data == rgb.data ? rgb.clone() : src;
}

}  // namespace dhp
