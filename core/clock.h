// CPU time: busy time that other processes sharing the cores, and more ranks than cores, do
// not inflate (waiting and being descheduled do not count).
#pragma once

#include <time.h>

namespace dhp {

// This thread's.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// This process's, all its threads together.
inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace dhp
