// The shapes scenes behind `dhp data synth`, shared by the demo set (synth.cpp) and the
// length presets (synth_presets.cpp). Internal to data/.
#pragma once

#include <opencv2/core.hpp>

#include <array>
#include <string>
#include <vector>

#include "core/rng.h"

namespace dhp {

// A run of `count` identical shapes inside one cell of the rows x cols grid.
struct Group {
  int colour = 0, shape = 0, count = 1, row = 0, col = 0;
};

struct Scene {
  int h = 0, w = 0, rows = 1, cols = 1;
  std::vector<Group> groups;  // ordered by cell, row-major: the caption's order
};

extern const std::array<const char*, 3> kPrompts;

// Sides drawn from [min_side, max_side], then make_scene_of_size (the demo's draw order).
Scene make_scene(Rng& rng, int min_side, int max_side);
// 1-3 groups of shapes in distinct cells of an h x w image (sides >= 32).
Scene make_scene_of_size(Rng& rng, int h, int w);
// Light background, lightly noisy in half the images when allow_noise (the draw from rng is
// made either way, so the stream of random numbers does not depend on it), then the shapes.
cv::Mat render(const Scene& s, Rng& rng, bool allow_noise);
// "two red circles at the top left and a blue square on the right."
std::string caption(const Scene& s);
// Every word of the grammar once, for tokenizer training.
std::string grammar_words();

}  // namespace dhp
