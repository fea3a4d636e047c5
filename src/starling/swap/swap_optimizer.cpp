// The swapped optimizer step (Swapper::step_streamed): every parameter goes through AdamW in
// chunks, each operand (weight, gradient, two moments) read where it is: in place when resident,
// otherwise through a staging buffer loaded from the tier and, for the weight and moments,
// written back. Three sets of staging buffers pipeline the chunks: one computing, the next
// loading, the previous draining.
#include <ATen/ATen.h>

#include <array>
#include <cstdint>

#include "starling/graph/dag.h"
#include "starling/swap/swapper.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"

namespace starling::swap {
namespace {

constexpr int kSets = kStagingSets;
enum Operand { kWeight, kGrad, kMoment1, kMoment2, kOperands };

}  // namespace

void Swapper::step_streamed(double lr, const at::Tensor& coef) {
  auto& params = dag_.params().params();
  const train::AdamWOptions& options = optimizer_.options();
  const int64_t steps = optimizer_.steps();
  const int64_t chunk = plan_.everything_resident ? INT64_MAX : plan_.chunk_bytes / 4;

  struct Job {
    int p;
    int64_t begin, end;
    bool last;  // the parameter's last chunk
  };
  std::vector<Job> jobs;
  for (size_t p = 0; p < params.size(); ++p) {
    if (!grads_[p].tensor.defined()) continue;
    const int64_t n = params[p].value.numel();
    for (int64_t b = 0; b < n; b += chunk)
      jobs.push_back({static_cast<int>(p), b, std::min(n, b + chunk), b + chunk >= n});
  }
  auto slots_of = [&](int p) {
    return std::array<SwapSlot*, kOperands>{&values_[p], &grads_[p], &exp_avg_[p], &exp_avg_sq_[p]};
  };
  std::array<std::vector<Ticket>, kSets> reads, writes;
  auto wait_all = [&](std::vector<Ticket>& tickets) {
    for (Ticket t : tickets) tier_->wait(t);
    tickets.clear();
  };
  auto staging = [&](size_t j, int op) { return staging_[(j % kSets) * kOperands + op]; };
  auto issue = [&](size_t j) {
    const Job& job = jobs[j];
    auto slots = slots_of(job.p);
    const double t0 = train::now_s();
    wait_all(writes[j % kSets]);
    stats_.wait_s += train::now_s() - t0;
    for (int op = 0; op < kOperands; ++op) {
      SwapSlot& s = *slots[op];
      settle(s);
      if (s.resident()) continue;
      const size_t bytes = static_cast<size_t>(job.end - job.begin) * 4;
      reads[j % kSets].push_back(
          tier_->read(s.key, static_cast<size_t>(job.begin) * 4, staging(j, op), bytes));
      stats_.read_bytes += static_cast<int64_t>(align_up(bytes));
    }
  };

  if (!jobs.empty()) issue(0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (j + 1 < jobs.size()) issue(j + 1);
    const Job& job = jobs[j];
    auto slots = slots_of(job.p);
    const double t0 = train::now_s();
    wait_all(reads[j % kSets]);
    stats_.wait_s += train::now_s() - t0;
    const int64_t len = job.end - job.begin;
    std::array<at::Tensor, kOperands> t;
    for (int op = 0; op < kOperands; ++op) {
      SwapSlot& s = *slots[op];
      t[op] = s.resident() ? s.tensor.view({-1}).narrow(0, job.begin, len)
                           : at::from_blob(staging(j, op), {len}, at::kFloat);
    }
    if (coef.defined()) t[kGrad].mul_(coef);
    train::update_elements(t[kWeight], t[kGrad], t[kMoment1], t[kMoment2], lr, params[job.p].decay,
                           options, steps);
    for (int op : {kWeight, kMoment1, kMoment2}) {
      SwapSlot& s = *slots[op];
      if (s.resident()) {
        s.dirty = true;
        continue;
      }
      const size_t bytes = static_cast<size_t>(len) * 4;
      writes[j % kSets].push_back(
          tier_->write(s.key, static_cast<size_t>(job.begin) * 4, staging(j, op), bytes));
      stats_.write_bytes += static_cast<int64_t>(align_up(bytes));
    }
    if (job.last) {
      // The gradient is spent: the next step starts without one.
      SwapSlot& g = grads_[job.p];
      track(-g.held());
      if (g.resident()) release(g);
      params[job.p].value.mutable_grad().reset();
      g.tensor.reset();
      g.state = SwapSlot::State::kOut;
      norms_[job.p].reset();
    }
  }
  for (auto& w : writes) wait_all(w);
}

}  // namespace starling::swap
