#include "kernels/cpu/load.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

namespace dhp::cpu {

int threads_for_free_cores(int configured, double cores, double others_busy) {
  const double free_cores = cores - std::max(0.0, others_busy);
  return std::clamp(int(std::floor(free_cores + 0.5)), 1, std::max(1, configured));
}

LoadMonitor::LoadMonitor() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cores_.push_back(c);
  last_ = Clock::now();
  ok_ = !cores_.empty() && sample(&last_busy_, &last_own_);
}

bool LoadMonitor::sample(double* busy_s, double* own_s) const {
  std::ifstream in("/proc/stat");
  if (!in) return false;
  const double tick = double(sysconf(_SC_CLK_TCK));
  double busy = 0.0;
  size_t seen = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(uint8_t(line[3]))) continue;
    std::istringstream f(line.substr(3));
    int id = -1;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    f >> id >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    if (!f || !std::binary_search(cores_.begin(), cores_.end(), id)) continue;
    busy += user + nice + system + irq + softirq + steal;
    ++seen;
  }
  if (seen != cores_.size()) return false;
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  *busy_s = busy / tick;
  *own_s = double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  return true;
}

int LoadMonitor::threads_for(int configured) {
  if (current_ == 0) current_ = configured;
  if (!ok_) return configured;
  const auto now = Clock::now();
  const double dt = std::chrono::duration<double>(now - last_).count();
  if (dt < kMinInterval) return current_;
  double busy = 0.0, own = 0.0;
  if (!sample(&busy, &own)) return current_;
  const double others = std::max(0.0, (busy - last_busy_) - (own - last_own_)) / dt;
  // Half-weight smoothing: one noisy interval moves the estimate halfway, two confirm it.
  others_ = 0.5 * others_ + 0.5 * others;
  last_ = now;
  last_busy_ = busy;
  last_own_ = own;
  current_ = threads_for_free_cores(configured, double(cores_.size()), others_);
  return current_;
}

}  // namespace dhp::cpu
