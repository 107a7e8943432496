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
// One shape crossing a light background in a straight line, from one cell of a 3 x 3 grid
// to another: the content of the preset's video clips.
struct Motion {
  int h = 0, w = 0, colour = 0, shape = 0, side = 0;
  int from_row = 0, from_col = 0, to_row = 0, to_col = 0;
  cv::Scalar background;
};
// An h x w clip's motion (sides >= 32); start and end cells differ.
Motion make_motion(Rng& rng, int h, int w);
// The frame at time t in [0, 1]: the shape at the point t of the way between the cells'
// centres.
cv::Mat render_motion(const Motion& m, double t);
// "a red circle moves from the top left to the bottom right."
std::string motion_caption(const Motion& m);

// Every word of the grammar once, for tokenizer training.
std::string grammar_words();

}  // namespace dhp
