// Which rank of a ring group encodes each of the group's images and where every merged image
// token travels (design.md §4: vision inside a group). Fixed from the plan and the images'
// token spans alone (no pixels), so every rank derives the same routing on its own and the
// two ends of every pair agree on the order of their rows without exchanging any index:
// rows go in (sequence, position) order. ImageExchange (image_exchange.h) moves the rows.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "parallel/plan.h"
#include "types/image_span.h"

namespace dhp {

// An image of a ring group.
struct GroupImage {
  int32_t doc = 0;      // the group's sequence index
  int64_t sample = 0;   // dataset index
  ImageSpan span;       // where its merged tokens lie in the sequence
  int encoder = 0;      // ring index of the rank that encodes it
};

// One ring group's routing as one member sees it.
struct ImageRouting {
  std::vector<GroupImage> images;  // every image of the group, by (doc, position)
  std::vector<int> encode;         // the images this member encodes (indices into `images`)
  // Per ring member, the rows this member sends it: (index into `encode`, row of that image).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> send;
  std::vector<int64_t> recv;  // per ring member, rows this member receives from it
  // Received row of each token of this member's ranges (in the plan's order), or -1.
  std::vector<int32_t> slot;

  bool empty() const { return images.empty(); }
  int64_t rows_received() const;
  // The send lists of ImageExchange::prepare, given where the rows of each encoded image
  // start among the member's encoded tokens (-1: the image did not load; its rows go as
  // zeros).
  std::vector<std::vector<int32_t>> send_rows(const std::vector<int64_t>& first_row) const;
};

// The image spans of a dataset sample (Dataset::image_spans).
using ImageSpansOf = std::function<std::vector<ImageSpan>(int64_t sample)>;

// The routing of group g of `plan` for its ring member `me` (ring index, not world rank);
// empty when the group holds no image.
ImageRouting route_images(const Plan& plan, int g, int me, const ImageSpansOf& spans_of);

}  // namespace dhp
