// Checkpoint save and load on 1, 2 and 3 ranks (threads of one process: one machine, one
// disk): every rank writing its part of the moments (CheckpointManager) against rank 0
// gathering the moments and writing the whole checkpoint alone (save_checkpoint, the one-file
// format), side by side in one run, against the disk's own sequential write speed measured in
// the same run (a file of the checkpoint's size written in 64 MiB blocks and fsynced). Loads
// read cold files: every file is dropped from the page cache (fsync, then
// posix_fadvise DONTNEED) before it is loaded. The ranks share one model (the weights a save
// reads), each has its own optimizer, sharded (ZeRO-1) or replicated. Then the arrays'
// checksum against FNV-1a, and background saves (checkpoint.async_save): how long training is
// held and when the checkpoint is complete. Prints markdown; asserts nothing.
// The ranks are threads of one process, each loading into a model of its own: the default shape
// (0.2 B parameters, 2.4 GB a checkpoint) keeps 3 of them within this machine's 23 GB (the
// one-file format's load, which holds every moment on every rank, is what runs out first).
//   bench_checkpoint [--dir /tmp/dhp_bench_checkpoint] [--dim 768] [--layers 16] [--repeats 2]
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/timing.h"
#include "core/check.h"
#include "core/clock.h"
#include "core/hash.h"
#include "model/model.h"
#include "parallel/threaded_comm.h"
#include "trainer/checkpoint.h"
#include "trainer/config.h"
#include "trainer/optimizer.h"

namespace {

using namespace dhp;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Evicts a file's pages from the page cache, so that the next read comes from the disk.
void drop_cached(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_folder(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) drop_cached(e.path());
}

// Seconds to write `bytes` sequentially in 64 MiB blocks and fsync them.
double disk_write_seconds(const fs::path& dir, int64_t bytes) {
  const fs::path p = dir / "sequential.bin";
  std::vector<char> block(size_t(64) << 20, 1);
  const auto t0 = Clock::now();
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  DHP_CHECK(fd >= 0, "cannot create '{}'", p.string());
  for (int64_t left = bytes; left > 0; left -= int64_t(block.size())) {
    const size_t n = size_t(std::min<int64_t>(left, int64_t(block.size())));
    DHP_CHECK(::write(fd, block.data(), n) == ssize_t(n), "writing '{}' failed", p.string());
  }
  ::fsync(fd);
  ::close(fd);
  const double s = seconds(t0);
  fs::remove(p);
  return s;
}

int64_t folder_bytes(const fs::path& dir) {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) n += int64_t(e.file_size());
  return n;
}

struct Timing {
  std::vector<double> save, load;
  int64_t bytes = 0;
};

// The arrays' checksum against the FNV-1a it replaced, side by side over one 256 MiB buffer of
// fp32 values (thread CPU time, median of 5 each).
void checksum_table() {
  std::vector<float> x(size_t(64) << 20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 9973) * 0.001f;
  const size_t bytes = x.size() * sizeof(float);
  uint64_t sink = 0;
  auto rate = [&](auto&& hash) {
    std::vector<double> t;
    for (int rep = 0; rep < 5; ++rep) {
      const double c0 = thread_cpu_seconds();
      sink ^= hash();
      t.push_back(thread_cpu_seconds() - c0);
    }
    return std::pair{double(bytes) / bench::median(t) / 1e9,
                     double(bytes) / *std::max_element(t.begin(), t.end()) / 1e9};
  };
  const auto fnv = rate([&] { return fnv1a(x.data(), bytes); });
  const auto wide = rate([&] { return wide_hash(x.data(), bytes); });
  fmt::print("checksum of {} MiB, thread CPU time, median of 5 (slowest): FNV-1a {:.2f} GB/s ({:.2f}), wide_hash "
             "{:.2f} GB/s ({:.2f}): {:.1f}x{}\n\n",
             bytes >> 20, fnv.first, fnv.second, wide.first, wide.second, wide.first / fnv.first, sink == 1 ? " " : "");
}

// The name of a save variant in the tables: its ranks and who writes.
std::string variant_name(int world, bool parts) {
  return fmt::format("{} rank{}, {}", world, world > 1 ? "s" : "", parts ? "every rank its part" : "rank 0 alone");
}

// A save's configuration on `world` ranks: its own folder under `dir`, the moments sharded
// where there are ranks to shard them over.
Config save_config(const Config& cfg, const std::string& dir, const std::string& folder, int world) {
  Config c = cfg;
  c.checkpoint.dir = (fs::path(dir) / folder).string();
  c.parallel.zero = world > 1 ? 1 : 0;
  return c;
}

// Seeded weights, one model for the ranks of a save (only rank 0 reads them).
std::unique_ptr<Model> seeded_model(const ModelConfig& m, Backend& backend) {
  auto model = std::make_unique<Model>(m, backend);
  model->initialise(1);
  return model;
}

// A rank about to save: its shard of the moments after one step, and its checkpoint manager.
struct SavingRank {
  AdamW opt;
  CheckpointManager checkpoints;
  TrainState st;
  SavingRank(const Model& model, const Config& c, Backend& backend, Communicator& comm)
      : opt(model.table(), c.optim, backend, OptimizerShard{comm.rank(), comm.size()}), checkpoints(c, comm) {
    opt.set_steps_taken(1);
    st.step = 1;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Checkpoint save and load: every rank its part against rank 0 alone");
  std::string dir = (fs::temp_directory_path() / "dhp_bench_checkpoint").string();
  int dim = 768, layers = 16, repeats = 2;
  std::vector<int> worlds = {1, 2, 3};
  app.add_option("--dir", dir, "folder on the disk to measure (emptied)")->capture_default_str();
  app.add_option("--dim", dim, "decoder width")->capture_default_str();
  app.add_option("--layers", layers, "decoder layers")->capture_default_str();
  app.add_option("--repeats", repeats, "saves and loads per variant")->capture_default_str();
  app.add_option("--worlds", worlds, "ranks")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  Config cfg;
  ModelConfig& m = cfg.model;
  m.dim = dim, m.layers = layers, m.heads = dim / 128, m.kv_heads = dim / 128, m.ffn = 4 * dim;
  m.vocab_size = 32000;
  cfg.parallel.timeout_s = 1.0;  // far below a save: the parts' save waits under its own limit
  cfg.checkpoint.keep = 2;
  fs::remove_all(dir);
  fs::create_directories(dir);

  auto backend = make_cpu_backend({1});
  const int64_t n = ParamTable(m).total();
  struct statvfs sv {};
  ::statvfs(dir.c_str(), &sv);
  fmt::print("# Checkpoint save and load\n\nmodel: {} parameters (dim {}, {} layers, vocab {}), fp32 weights and "
             "AdamW moments: {:.2f} GB per checkpoint; folder {} ({:.0f} GB free)\n\n",
             n, dim, layers, m.vocab_size, 12.0 * double(n) / 1e9, dir, double(sv.f_bavail) * double(sv.f_frsize) / 1e9);

  checksum_table();
  std::map<std::string, Timing> results;
  std::vector<double> disk;
  for (const int world : worlds) {
    for (const bool parts : {false, true}) {
      if (world == 1 && parts) continue;  // one rank writes one file either way
      Timing& t = results[variant_name(world, parts)];
      for (int rep = 0; rep < repeats; ++rep) {
        const Config c = save_config(cfg, dir, fmt::format("w{}_{}_{}", world, parts, rep), world);
        std::string path;
        double save_s = 0;
        // The ranks of a save share one model; each loads into its own.
        auto model = seeded_model(m, *backend);
        run_threaded(world, [&](Communicator& comm) {
          comm.set_timeout(parts ? c.parallel.timeout_s : 3600.0);  // the baseline at its best
          SavingRank r(*model, c, *backend, comm);
          comm.barrier();
          const auto t0 = Clock::now();
          if (parts) {
            path = r.checkpoints.save(*model, r.opt, r.st, true);
          } else {
            r.opt.gather_moments(comm);
            if (comm.rank() == 0) path = save_checkpoint(c, *model, &r.opt, r.st);
            comm.barrier();
          }
          if (comm.rank() == 0) save_s = seconds(t0);
        });
        model.reset();
        t.save.push_back(save_s);
        t.bytes = folder_bytes(c.checkpoint.dir);
        drop_folder(c.checkpoint.dir);
        double load_s = 0;
        run_threaded(world, [&](Communicator& comm) {
          comm.set_timeout(3600.0);
          Model loaded(m, *backend);
          AdamW opt(loaded.table(), c.optim, *backend, OptimizerShard{comm.rank(), comm.size()});
          comm.barrier();
          const auto t0 = Clock::now();
          load_checkpoint(path, loaded, &opt);
          comm.barrier();
          if (comm.rank() == 0) load_s = seconds(t0);
        });
        t.load.push_back(load_s);
        fs::remove_all(c.checkpoint.dir);
        disk.push_back(disk_write_seconds(dir, t.bytes));
      }
    }
  }
  // Background saves (checkpoint.async_save): how long the ranks are held before training may
  // go on (the state copied to the host, the parts' checksums agreed), and how long until the
  // checkpoint is complete, polled every 50 ms as a step would poll it.
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> background;
  for (const int world : worlds) {
    for (int rep = 0; rep < repeats; ++rep) {
      Config c = save_config(cfg, dir, fmt::format("async_w{}_{}", world, rep), world);
      c.checkpoint.async_save = true;
      auto model = seeded_model(m, *backend);
      double held = 0, complete = 0;
      run_threaded(world, [&](Communicator& comm) {
        SavingRank r(*model, c, *backend, comm);
        comm.barrier();
        const auto t0 = Clock::now();
        r.checkpoints.save(*model, r.opt, r.st, false);
        if (comm.rank() == 0) held = seconds(t0);
        std::string path;
        while (r.checkpoints.saving()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          path = r.checkpoints.poll();
        }
        DHP_CHECK(!path.empty(), "the background save failed");
        if (comm.rank() == 0) complete = seconds(t0);
      });
      background[world].first.push_back(held), background[world].second.push_back(complete);
      fs::remove_all(c.checkpoint.dir);
    }
  }
  const double disk_s = bench::median(disk);
  const int64_t bytes = results.begin()->second.bytes;
  fmt::print("disk: sequential write of {:.2f} GB in 64 MiB blocks + fsync: median {:.1f} s ({:.0f} MB/s, {} runs "
             "between the saves, spread {:.1f}–{:.1f} s)\n\n",
             double(bytes) / 1e9, disk_s, double(bytes) / disk_s / 1e6, disk.size(),
             *std::min_element(disk.begin(), disk.end()), *std::max_element(disk.begin(), disk.end()));
  fmt::print("| ranks, writer | bytes | save s (median, spread) | save MB/s | of the disk's | load s (cold, median) | "
             "load MB/s |\n|---|---|---|---|---|---|---|\n");
  for (const auto& [name, t] : results) {
    const double s = bench::median(t.save), l = bench::median(t.load);
    fmt::print("| {} | {:.2f} GB | {:.2f} ({:.2f}–{:.2f}) | {:.0f} | {:.2f}× | {:.2f} | {:.0f} |\n", name,
               double(t.bytes) / 1e9, s, *std::min_element(t.save.begin(), t.save.end()),
               *std::max_element(t.save.begin(), t.save.end()), double(t.bytes) / s / 1e6,
               (double(t.bytes) / s) / (double(bytes) / disk_s), l, double(t.bytes) / l / 1e6);
  }
  fmt::print("\nBackground saves (checkpoint.async_save), polled every 50 ms:\n\n| ranks | training held s (median) | "
             "complete after s (median) | held ÷ the save at once |\n|---|---|---|---|\n");
  for (const auto& [world, times] : background) {
    const double held = bench::median(times.first);
    fmt::print("| {} | {:.2f} | {:.2f} | {:.2f} |\n", world, held, bench::median(times.second),
               held / bench::median(results.at(variant_name(world, world > 1)).save));
  }
  fs::remove_all(dir);
  return 0;
}
