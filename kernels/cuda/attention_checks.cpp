#include "kernels/cuda/attention_checks.h"

#include "core/check.h"

namespace dhp::cuda {

void check_attention_shape(const AttnShape& s, int64_t tile, bool head_dim_supported) {
  DHP_CHECK(s.Tq >= 0 && s.Tk >= 0, "attention: negative sequence length (Tq={}, Tk={})", s.Tq,
            s.Tk);
  DHP_CHECK(s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0,
            "attention: {} query heads cannot share {} kv heads evenly", s.Hq, s.Hkv);
  DHP_CHECK(head_dim_supported,
            "CUDA attention supports head dimensions 16, 32, 64, 80, 96 and 128, not {}; use "
            "the CPU backend or one of those dimensions",
            s.hd);
  DHP_CHECK(s.Hq <= 65535 && s.Tq / tile < (int64_t(1) << 31) && s.Tk / tile < (int64_t(1) << 31),
            "CUDA attention: shape too large for one launch (Tq={}, Tk={}, Hq={})", s.Tq, s.Tk,
            s.Hq);
}

void check_merge_shape(int64_t T, int H, int hd, int64_t blocks) {
  DHP_CHECK(T >= 0 && H > 0 && hd > 0, "attention_merge: bad shape T={} H={} hd={}", T, H, hd);
  DHP_CHECK(blocks < (int64_t(1) << 31), "attention_merge: {} rows are too many for one launch",
            T * H);
}

void unreachable(const char* what) { assert_fail(what, __FILE__, __LINE__); }

}  // namespace dhp::cuda
