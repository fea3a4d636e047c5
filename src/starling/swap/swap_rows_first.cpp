// A table looked up by row (the token embedding) updated rows first. Its update cannot start
// before the step's gradient norm is known, which is only after the backward has reached the
// embedding, and the next forward starts by reading it: updated whole, its moments' round trip
// through the tier would stand between every step and the next. A lookup reads only its tokens'
// rows, though, and AdamW is elementwise: those rows are updated first (their moments read from
// the tier in spans around them), the lookup runs, and the rest of the table's chunks are spread
// through the stream between the later groups, finished before its next reader (GPT-2's tied head).
// The chunks keep the rows that went first as they are; their moments come out the same again, from
// the same operands, so the result is bit-identical to the whole update.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "starling/graph/dag.h"
#include "starling/swap/swapper.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"

namespace starling::swap {
namespace {

// Reads of a table's rows this far apart or closer are merged into one.
constexpr size_t kMergeGap = 64 << 10;

struct Span {
  size_t begin, end, at;  // in the tier's room; where it lands in the buffer
};

// The aligned reads that bring `rows` (sorted) of a room of `room` bytes, and their bytes in all.
std::vector<Span> row_spans(const std::vector<int64_t>& rows, size_t row_bytes, size_t room,
                            size_t& total) {
  std::vector<Span> spans;
  for (int64_t r : rows) {
    const size_t begin = static_cast<size_t>(r) * row_bytes / kSwapAlign * kSwapAlign,
                 end = std::min(room, align_up((static_cast<size_t>(r) + 1) * row_bytes));
    if (!spans.empty() && begin <= spans.back().end + kMergeGap)
      spans.back().end = std::max(spans.back().end, end);
    else
      spans.push_back({begin, end, 0});
  }
  total = 0;
  for (Span& span : spans) {
    span.at = total;
    total += span.end - span.begin;
  }
  return spans;
}

}  // namespace

// On a CPU, with the update overlapped (on a GPU the stream's copies and kernels are queued on
// the device, where the rows' reads would wait behind them), and where the table's chunks have
// groups to spread over before its next reader.
bool Swapper::spreads(int p) const {
  return rows_table_[p] >= 0 && device_.is_cpu() && !tier_->orders_on_device() &&
         !plan_.everything_resident && plan_.overlap_update && plan_.rows_first &&
         owner_[p] + plan_.depth + 1 <= spread_end_[p];
}

void Swapper::update_rows_first(int p, const at::Tensor& ids) {
  at::NoGradGuard no_grad;
  auto& params = dag_.params().params();
  const at::Tensor& value = params[p].value;
  const int64_t rows_in = value.size(0), width = value.size(1);
  // The rows, sorted and unique. A token outside the table leaves the update whole (the lookup
  // then names the bad token itself).
  const at::Tensor flat = ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t* id = flat.data_ptr<int64_t>();
  std::vector<int64_t> rows(id, id + flat.numel());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  // The stream has not started the table (entering the group finished the others only).
  if (pending_[p] != Pending::kQueued) {
    finish_params({p});
    return;
  }
  if (rows.empty() || rows.front() < 0 || rows.back() >= rows_in ||
      !rows_go_first(rows_in, static_cast<int64_t>(rows.size()))) {
    update_whole_now(p);
    return;
  }

  // The rows' four operands and the reads of those in the tier are held beside the budget's
  // other tenants; where they do not fit without waiting, the table is updated whole instead.
  const size_t row_bytes = static_cast<size_t>(width) * 4;
  size_t span_bytes = 0;
  row_spans(rows, row_bytes, align_up(values_[p].bytes), span_bytes);
  int64_t need = 4 * static_cast<int64_t>(align_up(rows.size() * row_bytes));
  for (SwapSlot* s : {&values_[p], &grads_[p], &exp_avg_[p], &exp_avg_sq_[p]})
    if (!s->resident()) need += static_cast<int64_t>(span_bytes);
  if (!make_room(need, false)) {
    update_whole_now(p);
    return;
  }
  track(need);
  const double start = train::now_s(), start_wait = stats_.wait_s;
  const at::Tensor index = at::tensor(rows, at::TensorOptions(at::kLong)).to(device_);
  at::Tensor w = slot_rows(values_[p], rows, index, width),
             g = slot_rows(grads_[p], rows, index, width),
             m = slot_rows(exp_avg_[p], rows, index, width),
             v = slot_rows(exp_avg_sq_[p], rows, index, width);
  if (update_coef_.defined()) g.mul_(update_coef_);
  optimizer_.update_part(w, g, m, v, update_lr_, params[p].decay, update_steps_);
  value.view({rows_in, width}).index_copy_(0, index, w);
  values_[p].dirty = true;
  patched_rows_[p] = std::move(rows);
  ++stats_.rows_first;
  w = g = m = v = at::Tensor();
  track(-need);
  stats_.update_s += train::now_s() - start;
  stats_.update_wait_s += stats_.wait_s - start_wait;
}

// The table's chunks, none issued yet, move to the head of the stream's queue, ungated and no
// longer spread, and are finished: the table updated whole before its lookup, as any first
// group's parameters are.
void Swapper::update_whole_now(int p) {
  const auto rest = jobs_.begin() + static_cast<std::ptrdiff_t>(issued_);
  const auto end =
      std::stable_partition(rest, jobs_.end(), [p](const UpdateJob& j) { return j.p == p; });
  for (auto j = rest; j != end; ++j) {
    j->gate = owner_[p];
    j->spread = false;
  }
  finish_gate_[p] = owner_[p];
  rows_first_[p] = false;
  finish_params({p});
}

// The rows of a [rows, width] fp32 slot (`index`: the same rows as a tensor), as a fresh
// [n, width] tensor: gathered where the slot
// is resident, otherwise read from the tier in aligned spans around them (close ones merged).
// The caller holds room for both.
at::Tensor Swapper::slot_rows(SwapSlot& s, const std::vector<int64_t>& rows,
                              const at::Tensor& index, int64_t width) {
  const auto n = static_cast<int64_t>(rows.size());
  if (s.state == SwapSlot::State::kLoading || s.state == SwapSlot::State::kWriting) settle(s);
  if (s.resident()) return s.tensor.view({-1, width}).index_select(0, index);
  const size_t row_bytes = static_cast<size_t>(width) * 4;
  size_t total = 0;
  const std::vector<Span> spans = row_spans(rows, row_bytes, align_up(s.bytes), total);
  at::DataPtr buffer = pool_.take(total);
  char* base = static_cast<char*>(buffer.get());
  std::vector<Ticket> reads;
  for (const Span& span : spans) {
    reads.push_back(read_room(s, span.begin, base + span.at, span.end - span.begin));
    stats_.read_bytes += static_cast<int64_t>(span.end - span.begin);
  }
  const double t0 = train::now_s();
  for (Ticket t : reads) tier_->wait(t);
  stats_.wait_s += train::now_s() - t0;
  at::Tensor out = at::empty({n, width}, at::TensorOptions(at::kFloat).device(device_));
  char* dst = static_cast<char*>(out.data_ptr());
  size_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t offset = static_cast<size_t>(rows[i]) * row_bytes;
    while (offset >= spans[k].end) ++k;
    std::memcpy(dst + i * row_bytes, base + spans[k].at + (offset - spans[k].begin), row_bytes);
  }
  pool_.give(std::move(buffer), total);
  return out;
}

at::Tensor Swapper::patched_in(int p, int64_t begin, int64_t end) const {
  const auto& rows = patched_rows_[p];
  const int64_t width = dag_.params().params()[p].value.size(1);
  std::vector<int64_t> at;
  for (auto r = std::lower_bound(rows.begin(), rows.end(), begin / width);
       r != rows.end() && *r * width < end; ++r)
    for (int64_t e = std::max(begin, *r * width); e < std::min(end, (*r + 1) * width); ++e)
      at.push_back(e - begin);
  if (at.empty()) return {};
  return at::tensor(at, at::TensorOptions(at::kLong)).to(device_);
}

}  // namespace starling::swap
