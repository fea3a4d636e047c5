// Wire codec throughput, single thread: encode, decode and decode_add for every precision and
// every code path this CPU has, in GB/s of float32 input, with the ratio to a plain memcpy of the
// same float buffer timed in the same process (these machines are noisy; the ratio is the number
// to compare across runs).
//
//   starling_wire_codec_bench [MiB of float input, default 64] [repeats, default 9]
//
// Each figure is the median over the repeats; the memcpy baseline is re-timed inside every
// repeat, interleaved with the codec runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "starling/compress/wire_codec.h"

namespace {

using starling::compress::WirePrecision;
namespace detail = starling::compress::wire_codec_detail;

double seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  if (mib == 0 || repeats <= 0) {
    std::fprintf(stderr, "usage: %s [MiB > 0] [repeats > 0]\n", argv[0]);
    return 2;
  }
  const size_t n = mib * (size_t{1} << 20) / sizeof(float);
  const double gb = static_cast<double>(n * sizeof(float)) / 1e9;

  // Gradient-like values: normal, small, no specials.
  std::vector<float> src(n), acc(n, 0.0f), copy(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (float& v : src) v = normal(rng);
  std::vector<std::byte> wire(starling::compress::encoded_bytes(WirePrecision::fp32, n));
  std::memcpy(copy.data(), src.data(), n * sizeof(float));  // touch every page once

  std::printf("wire codec throughput, %zu MiB of float32, median of %d, single thread\n", mib,
              repeats);
  std::printf("%-10s %-5s %21s %21s %21s\n", "path", "prec", "encode GB/s (x memcpy)",
              "decode GB/s (x memcpy)", "decode_add GB/s (x)");
  const WirePrecision precisions[] = {WirePrecision::fp32, WirePrecision::fp16, WirePrecision::bf16,
                                      WirePrecision::int8};
  std::vector<double> all_base;
  for (detail::Isa isa : {detail::Isa::kPortable, detail::Isa::kAvx2F16c}) {
    if (!detail::isa_available(isa)) continue;
    for (WirePrecision p : precisions) {
      std::vector<double> base, enc, dec, add;
      for (int r = 0; r < repeats; ++r) {
        base.push_back(seconds([&] { std::memcpy(copy.data(), src.data(), n * sizeof(float)); }));
        enc.push_back(seconds([&] { detail::encode(isa, p, src.data(), n, wire.data()); }));
        dec.push_back(seconds([&] { detail::decode(isa, p, wire.data(), n, copy.data()); }));
        add.push_back(seconds([&] { detail::decode_add(isa, p, wire.data(), n, acc.data()); }));
      }
      all_base.insert(all_base.end(), base.begin(), base.end());
      const double b = median(base);
      auto cell = [&](const std::vector<double>& t) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%6.2f (%4.2f)", gb / median(t), b / median(t));
        return std::string(buf);
      };
      std::printf("%-10s %-5s %21s %21s %21s\n", std::string(detail::to_string(isa)).c_str(),
                  std::string(starling::compress::to_string(p)).c_str(), cell(enc).c_str(),
                  cell(dec).c_str(), cell(add).c_str());
    }
  }
  std::printf("memcpy baseline: %.2f GB/s (median over all rows)\n", gb / median(all_base));
  return 0;
}
