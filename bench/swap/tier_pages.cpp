// The disk tier's bandwidth from buffers of small pages against transparent huge pages, measured
// in one run. An O_DIRECT transfer pins its buffer's pages and hands the device a list of
// physically contiguous segments: from 4 KiB pages a request may be cut at every page, from a
// huge page it is cut every 2 MiB at most. The swapper's buffers are the caching CPU allocator's
// blocks, which ask for huge pages (common/cpu_runtime.h); this shows what that is worth on the
// disk at hand.
//
//   build/starling_tier_pages --dir /path/on/the/disk [--mb 1024] [--piece-mb 4] [--in-flight 12]
//                             [--reps 3]
//
// Per repetition and page size it writes --mb through one fresh tier file in --piece-mb transfers,
// --in-flight at a time (the swapper's optimizer keeps 12 staging chunks of about 4 MB), then
// writes it again and reads it back, timing the second write and the read. Prints each
// repetition and the medians, huge pages against small ones.
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <string>
#include <vector>

#include "starling/swap/disk_tier.h"

namespace {

using starling::swap::DiskTier;
using starling::swap::Ticket;

constexpr size_t kHuge = size_t{2} << 20;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One buffer of `bytes` on huge pages or kept on small ones, touched so its pages exist.
struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
  Buffer(size_t n, bool huge) : bytes(n) {
    if (posix_memalign(&data, kHuge, n) != 0) throw std::bad_alloc();
    ::madvise(data, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(data, 1, n);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// AnonHugePages of this process, kB: whether the kernel gave the huge pages asked for.
long anon_huge_kb() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;
  long value = -1;
  while (std::getline(f, line))
    if (std::sscanf(line.c_str(), "AnonHugePages: %ld", &value) == 1) return value;
  return -1;
}

struct Rates {
  double write_gbs, read_gbs;
};

Rates measure(const std::string& dir, size_t total, size_t piece, int in_flight, bool huge,
              long* huge_kb) {
  std::vector<std::unique_ptr<Buffer>> buffers;
  for (int i = 0; i < in_flight; ++i) buffers.push_back(std::make_unique<Buffer>(piece, huge));
  *huge_kb = anon_huge_kb();
  DiskTier tier(dir);
  const uint64_t key = tier.reserve(total);
  auto pass = [&](bool write) {
    const double t0 = now_s();
    std::deque<Ticket> queue;
    for (size_t i = 0; i < total / piece; ++i) {
      if (static_cast<int>(queue.size()) >= in_flight) {
        tier.wait(queue.front());
        queue.pop_front();
      }
      void* b = buffers[i % buffers.size()]->data;
      queue.push_back(write ? tier.write(key, i * piece, b, piece)
                            : tier.read(key, i * piece, b, piece));
    }
    for (Ticket t : queue) tier.wait(t);
    return static_cast<double>(total) / (now_s() - t0) / 1e9;
  };
  pass(true);  // allocates the file's blocks
  const double w = pass(true);
  return {w, pass(false)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"disk tier bandwidth: small pages against transparent huge pages"};
  std::string dir;
  int mb = 1024, piece_mb = 4, in_flight = 12, reps = 3;
  app.add_option("--dir", dir, "a directory on the disk to measure")->required();
  app.add_option("--mb", mb, "MiB moved per pass")->check(CLI::Range(16, 1 << 20));
  app.add_option("--piece-mb", piece_mb, "MiB per transfer")->check(CLI::Range(1, 256));
  app.add_option("--in-flight", in_flight, "transfers in flight")->check(CLI::Range(1, 64));
  app.add_option("--reps", reps, "repetitions of each page size")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  const size_t piece = static_cast<size_t>(piece_mb) << 20;
  const size_t total = (static_cast<size_t>(mb) << 20) / piece * piece;
  std::vector<double> small_w, small_r, huge_w, huge_r;
  try {
    for (int r = 0; r < reps; ++r)
      for (bool huge : {false, true}) {
        long huge_kb = 0;
        const Rates x = measure(dir, total, piece, in_flight, huge, &huge_kb);
        (huge ? huge_w : small_w).push_back(x.write_gbs);
        (huge ? huge_r : small_r).push_back(x.read_gbs);
        std::printf("rep %d  %-11s write %5.2f GB/s  read %5.2f GB/s  (AnonHugePages %ld kB)\n",
                    r + 1, huge ? "huge pages" : "small pages", x.write_gbs, x.read_gbs, huge_kb);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "starling_tier_pages: %s\n", e.what());
    return 1;
  }
  std::printf(
      "median of %d, %d MiB in %d MiB transfers, %d in flight under %s:\n"
      "  small pages: write %.2f GB/s, read %.2f GB/s\n"
      "  huge pages:  write %.2f GB/s, read %.2f GB/s\n"
      "  huge / small: write %.2fx, read %.2fx\n",
      reps, static_cast<int>(total >> 20), piece_mb, in_flight, dir.c_str(), median(small_w),
      median(small_r), median(huge_w), median(huge_r), median(huge_w) / median(small_w),
      median(huge_r) / median(small_r));
  return 0;
}
