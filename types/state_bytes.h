// What one rank holds for the model's parameters between steps, as the engine allocates it:
// model/model.h carves the fp32 master weights of every parameter, a working copy in the
// storage dtype when that is narrower (bf16 on GPUs: the passes read it), and the fp32
// gradients of the trainable parameters; trainer/optimizer.h adds AdamW's two fp32 moments
// of the trainable parameters and, under ZeRO-1 over N ranks, keeps those for its block of
// n / N elements and the remainder n mod N that every rank updates (the block's gradients are
// summed in place, in the gradient arena; under ZeRO-2 into a buffer of their own, beside a
// gradient window of two decoder layers and the parameters outside the layers). With a working copy and N > 1 the master is
// sharded as the moments are (the distributed optimizer, model/shard.h): a rank keeps fp32
// master weights for its block and the remainder only, and frozen parameters exist in the
// working copy alone. Under ZeRO-3 the master is sharded in fp32 runs too, and the working copy
// (in fp32 too) is a window of the rest and two decoder layers (model/layer_window.h). The
// planner's memory model prices exactly this
// (parallel/memory_model.h) and a
// test compares it with the bytes the engine's buffers hold, on every profile's storage dtype.
#pragma once

#include <cstdint>

namespace dhp {

struct StateBytes {
  int64_t master = 0;      // fp32 weights, every parameter
  int64_t working = 0;     // the working copy in the storage dtype (none when it is fp32)
  int64_t gradients = 0;   // fp32, trainable parameters
  int64_t moments = 0;     // AdamW m and v this rank holds
  int64_t total() const { return master + working + gradients + moments; }
};

// `storage_bytes`: bytes of an element in the storage dtype (4 fp32, 2 bf16); `shards`: the
// ranks the optimizer state is split over (1: replicated); `grad_window`: under ZeRO-2, the
// elements of the model's gradient window (model/layer_window.h: the rest and two layers' slots),
// beside which each rank holds the summed gradients of its block and the remainder
// (trainer/grad_reducer.h); 0 otherwise. `weight_window`: under ZeRO-3, the elements of the
// working copy's window (the weights outside the decoder layers and two layers' slots); 0
// otherwise.
inline StateBytes state_bytes(int64_t params, int64_t trainable, int storage_bytes, int64_t shards,
                              int64_t grad_window = 0, int64_t weight_window = 0) {
  StateBytes s;
  const int64_t block = trainable / shards, held = shards > 1 ? block + trainable % shards : trainable;
  const bool windowed = weight_window > 0 && shards > 1;
  const bool working = storage_bytes < 4 || windowed;
  s.master = 4 * (working && shards > 1 ? held : params);
  s.working = working ? storage_bytes * (windowed ? weight_window : params) : 0;
  s.gradients = 4 * (grad_window > 0 && shards > 1 ? grad_window + held : trainable);
  s.moments = 2 * 4 * held;
  return s;
}

}  // namespace dhp
