// Packing samples (or pieces of them) into the model's micro-batch.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sample.h"
#include "types/batch.h"
#include "types/image_geometry.h"

namespace dhp {

// Lays the samples end to end as documents 0, 1, ... of one Batch: targets[t] = tokens[t+1]
// when t+1 is in the same document and has loss_mask 1 (else -1); pos restarts per
// document; image_slot numbers the merged image tokens in the order images x row-major
// merged grid; patches are concatenated in image order. A sample loaded without its images
// (Sample::images_elsewhere) gets image_slot -1 on its image tokens: the caller places them.
Batch pack(const std::vector<const Sample*>& samples, const ImageGeometry& v);

// Appends an image for the pack's encoder: its patches after the pack's, and its entry in
// Batch::images (whose merged tokens follow those of the images before it).
void append_image(Batch& b, const PreparedImage& im, const ImageGeometry& v);

}  // namespace dhp
