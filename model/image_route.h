// The seam between the vision encoder and the decoder when they run on different ranks.
// Inside a ring group every image is encoded on exactly one rank, while its merged tokens
// belong to whichever ranks hold their positions; a route moves the encoded rows to those
// ranks before the decoder and carries their gradients back after it
// (parallel/image_exchange.h). Without a route, a pack's image tokens are its own encoder's.
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp {

class ImageRoute {
 public:
  virtual ~ImageRoute() = default;
  // Image token rows this rank's decoder receives (what Batch::image_slot indexes).
  virtual int64_t rows() const = 0;
  // From this rank's encoded tokens (N, C) to the rows its decoder holds (rows(), C); the
  // result stays valid until backward() or the next forward(). Every rank of the group calls
  // it, also with nothing to send or receive.
  virtual CAct forward(CAct tokens, int64_t C) = 0;
  // From the gradient of the held rows (rows(), C) to the gradient of this rank's encoded
  // tokens, written (=) into dtokens (N, C).
  virtual void backward(Act dtokens, CAct drows, int64_t C) = 0;
};

}  // namespace dhp
