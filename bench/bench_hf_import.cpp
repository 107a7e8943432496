// Importing a Hugging Face checkpoint (trainer/hf_checkpoint.h) against reading its bytes.
// Writes a random bf16 checkpoint of TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32 heads,
// 4 kv heads, ffn 5632, vocab 32000: ~2.2 GB) into --dir, then, each in a child process of its
// own so that its peak resident memory is its own:
//   read    — the file's bytes read front to back (16 MiB preads), the floor of any import;
//   import  — import_hf_weights into an fp32 arena on the CPU backend;
// once with the file evicted from the page cache (cold, posix_fadvise DONTNEED) and once with
// it cached (warm). Peak RSS (getrusage) is compared with the arena plus the largest tensor in
// fp32. The checkpoint is deleted at the end unless --keep.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/timing.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "kernels/backend.h"
#include "model/params.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/safetensors.h"

namespace {

namespace fs = std::filesystem;
using namespace dhp;
using Clock = std::chrono::steady_clock;

ModelConfig tinyllama() {
  ModelConfig m;
  m.dim = 2048;
  m.layers = 22;
  m.heads = 32;
  m.kv_heads = 4;
  m.ffn = 5632;
  m.vocab_size = 32000;
  m.rms_norm_eps = 1e-5;
  m.rope_theta = 10000.0;
  // The smallest vision path: the arena is the decoder's, as in the figure.
  m.vision.layers = 0;
  m.vision.dim = 16;
  m.vision.heads = 4;
  m.vision.ffn = 16;
  m.vision.merge = 1;
  return m;
}

void write_checkpoint(const fs::path& dir, const ModelConfig& m) {
  fs::create_directories(dir);
  nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", m.dim}, {"intermediate_size", m.ffn},
                      {"num_hidden_layers", m.layers}, {"num_attention_heads", m.heads},
                      {"num_key_value_heads", m.kv_heads}, {"hidden_act", "silu"},
                      {"rms_norm_eps", m.rms_norm_eps}, {"rope_theta", m.rope_theta},
                      {"rope_scaling", nullptr}, {"tie_word_embeddings", false},
                      {"vocab_size", m.vocab_size}, {"torch_dtype", "bfloat16"},
                      {"max_position_embeddings", 2048}};
  std::ofstream(dir / "config.json") << c.dump(2);
  const ParamTable table(m);
  std::vector<SafetensorsOut> out;
  uint64_t seed = 1;
  for (const auto& b : hf_name_map(m)) {
    const ParamSpec& s = table.get(b.dhp);
    out.push_back({b.hf, "BF16", s.shape, [n = s.numel(), sd = seed++](char* dst) {
                     Rng rng(sd);
                     for (int64_t i = 0; i < n; ++i) {
                       const uint16_t h = bf16_from_float(float((rng.uniform() - 0.5) * 0.04));
                       std::memcpy(dst + 2 * i, &h, 2);
                     }
                   }});
  }
  write_safetensors((dir / "model.safetensors").string(), out, {{"format", "pt"}});
}

void evict(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct Child {
  double seconds = 0;
  double peak_rss_bytes = 0;
};

// Runs `f` in a child process: the seconds it reports (written back through a pipe) and its
// peak RSS.
template <class F>
Child in_child(F f) {
  int p[2];
  if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    const double s = f();
    if (::write(p[1], &s, sizeof(s)) != sizeof(s)) ::_exit(2);
    ::_exit(0);
  }
  ::close(p[1]);
  Child c;
  if (::read(p[0], &c.seconds, sizeof(c.seconds)) != sizeof(c.seconds)) c.seconds = -1;
  ::close(p[0]);
  int status = 0;
  struct rusage ru {};
  ::wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("child failed");
  c.peak_rss_bytes = double(ru.ru_maxrss) * 1024.0;
  return c;
}

void read_all(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY);
  std::vector<char> buf(size_t(16) << 20);
  uint64_t sum = 0;
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n <= 0) break;
    sum += uint8_t(buf[0]);  // keeps the read from being optimised away
    at += n;
  }
  ::close(fd);
  if (sum == 1) std::fputs("", stderr);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Import of a TinyLlama-sized Hugging Face checkpoint against a plain read");
  std::string dir = (fs::temp_directory_path() / "dhp_bench_hf").string();
  bool keep = false, reuse = false;
  int repeat = 3;
  app.add_option("--repeat", repeat, "Runs of each measurement; the median is shown (a shared "
                 "machine's load makes single runs noisy)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--dir", dir, "Where the checkpoint is written")->capture_default_str();
  app.add_flag("--keep", keep, "Keep the checkpoint afterwards");
  app.add_flag("--reuse", reuse, "Use the checkpoint an earlier --keep left in --dir");
  CLI11_PARSE(app, argc, argv);
  const ModelConfig m = tinyllama();
  const fs::path file = fs::path(dir) / "model.safetensors";
  auto t0 = Clock::now();
  if (!reuse || !fs::exists(file)) write_checkpoint(dir, m);
  const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const ParamTable table(m);
  int64_t largest = 0;
  for (const auto& s : table.specs()) largest = std::max(largest, s.numel());
  const double arena = double(table.total()) * 4, tensor = double(largest) * 4;
  const double bytes = double(fs::file_size(file));
  fmt::print("checkpoint: {:.2f} GB bf16 ({} tensors) written in {:.1f} s; arena {:.2f} GB fp32, "
             "largest tensor {:.3f} GB fp32\n\n",
             bytes / 1e9, hf_name_map(m).size(), write_s, arena / 1e9, tensor / 1e9);
  // The arena exists before the import, zeroed, as a Model's is (Model::Model): its pages are
  // not the import's cost.
  auto import = [&] {
    auto backend = make_cpu_backend({2});
    DeviceBuffer buf(*backend, size_t(table.total()) * sizeof(float));
    backend->zero(buf.data(), buf.bytes());
    const auto t0 = Clock::now();
    import_hf_weights(dir, m, table, host_arena_writer(buf.as<float>()));
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto read = [&] {
    const auto t0 = Clock::now();
    read_all(file);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  fmt::print("{:<8} {:<6} {:>9} {:>10} {:>14} {:>22}\n", "what", "cache", "time s", "GB/s",
             "peak RSS GB", "RSS / (arena+tensor)");
  using bench::median;
  for (const bool cold : {true, false}) {
    std::vector<double> rs, is;
    double rss_read = 0, rss_import = 0;
    for (int k = 0; k < repeat; ++k) {
      if (cold) evict(file);
      else read_all(file);
      const Child r = in_child(read);
      if (cold) evict(file);
      const Child i = in_child(import);
      rs.push_back(r.seconds);
      is.push_back(i.seconds);
      rss_read = std::max(rss_read, r.peak_rss_bytes);
      rss_import = std::max(rss_import, i.peak_rss_bytes);
    }
    const double r = median(rs), i = median(is);
    const char* cache = cold ? "cold" : "warm";
    fmt::print("{:<8} {:<6} {:>9.3f} {:>10.2f} {:>14.3f} {:>22}\n", "read", cache, r, bytes / r / 1e9,
               rss_read / 1e9, "-");
    fmt::print("{:<8} {:<6} {:>9.3f} {:>10.2f} {:>14.3f} {:>22.3f}\n", "import", cache, i, bytes / i / 1e9,
               rss_import / 1e9, rss_import / (arena + tensor));
    fmt::print("{:<8} {:<6} import / read = {:.2f}x (medians of {})\n", "", cache, i / r, repeat);
  }
  if (!keep) fs::remove_all(dir);
  return 0;
}
