#include "starling/swap/pinned_tier.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <thread>

#include "starling/common/error.h"

namespace starling::swap {
namespace {

c10::Stream side_stream(c10::Device device) {
  if (device.is_cpu())
    throw std::logic_error("swap: the pinned tier lies below a device's memory, not the CPU's");
  return c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
}

}  // namespace

PinnedTier::PinnedTier(c10::Device device)
    : device_(device), loads_{side_stream(device), {}}, stores_{side_stream(device), {}} {}

PinnedTier::~PinnedTier() {
  // Copies in flight read or write the rooms: let them land before the memory goes back.
  try {
    retire(loads_, issued_, true);
    retire(stores_, issued_, true);
  } catch (...) {
  }
}

uint64_t PinnedTier::reserve(size_t bytes) {
  // Rooms read as zeros until written (tier.h).
  rooms_.push_back(at::zeros({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                             at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
  reserved_ += static_cast<int64_t>(rooms_.back().numel());
  return rooms_.size() - 1;
}

at::Tensor PinnedTier::on_device(const void* data, size_t bytes) const {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)},
                       at::TensorOptions().dtype(at::kByte).device(device_));
}

Ticket PinnedTier::copy(Lane& lane, const at::Tensor& dst, const at::Tensor& src) {
  c10::impl::VirtualGuardImpl impl(device_.type());
  // After the compute stream's work queued so far (see the header).
  c10::Event queued(device_.type());
  queued.record(impl.getStream(device_));
  queued.block(lane.stream);
  {
    c10::StreamGuard on_side(lane.stream);
    dst.copy_(src, /*non_blocking=*/true);
  }
  c10::Event landed(device_.type());
  landed.record(lane.stream);
  const Ticket t = ++issued_;
  lane.in_flight.emplace_back(t, std::move(landed));
  return t;
}

Ticket PinnedTier::write(uint64_t key, size_t offset, const void* src, size_t bytes) {
  at::Tensor room =
      rooms_.at(key).narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(bytes));
  return copy(stores_, room, on_device(src, bytes));
}

Ticket PinnedTier::read(uint64_t key, size_t offset, void* dst, size_t bytes) {
  at::Tensor room =
      rooms_.at(key).narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(bytes));
  return copy(loads_, on_device(dst, bytes), room);
}

PinnedTier::Lane* PinnedTier::lane_of(Ticket ticket) {
  for (Lane* lane : {&loads_, &stores_})
    for (const auto& [t, event] : lane->in_flight)
      if (t == ticket) return lane;
  return nullptr;  // retired
}

// Drops the copies up to `upto` that have landed, oldest first; with `block`, waits for them.
void PinnedTier::retire(Lane& lane, Ticket upto, bool block) {
  while (!lane.in_flight.empty() && lane.in_flight.front().first <= upto) {
    const c10::Event& event = lane.in_flight.front().second;
    if (!event.query()) {
      if (!block) return;
      // c10::Event has no blocking wait on every libtorch this builds against; a copy takes
      // microseconds to milliseconds, so yielding costs the thread nothing it could use.
      while (!event.query()) std::this_thread::yield();
    }
    lane.in_flight.pop_front();
  }
}

void PinnedTier::wait(Ticket ticket) {
  if (Lane* lane = lane_of(ticket)) retire(*lane, ticket, true);
}

bool PinnedTier::done(Ticket ticket) {
  Lane* lane = lane_of(ticket);
  if (lane == nullptr) return true;
  retire(*lane, ticket, false);
  return lane_of(ticket) == nullptr;
}

// A copy of a lane never lands before the ones queued ahead of it: waiting for its event orders
// the waiter after them too.
const c10::Event* PinnedTier::pending_event(Ticket ticket) {
  Lane* lane = lane_of(ticket);
  if (lane == nullptr) return nullptr;
  retire(*lane, ticket, false);
  for (const auto& [t, event] : lane->in_flight)
    if (t == ticket) return &event;
  return nullptr;
}

void PinnedTier::order_after(Ticket ticket) {
  if (const c10::Event* event = pending_event(ticket))
    event->block(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
}

void PinnedTier::order_copies_after(Ticket ticket) {
  if (const c10::Event* event = pending_event(ticket)) {
    event->block(loads_.stream);
    event->block(stores_.stream);
  }
}

std::string PinnedTier::describe() const { return "pinned host RAM below " + device_.str(); }

void check_tier_below(const std::string& kind, c10::Device compute) {
  if (!compute.is_cpu() && kind == "disk")
    throw ConfigError("swap.tier = \"disk\" is not supported on train.device = \"" + compute.str() +
                      "\" yet (the disk would be a third level below pinned host "
                      "RAM); use swap.tier = \"host\"");
}

std::unique_ptr<Tier> make_tier(const std::string& kind, const std::filesystem::path& dir,
                                c10::Device compute) {
  check_tier_below(kind, compute);
  if (!compute.is_cpu() && kind == "host") return std::make_unique<PinnedTier>(compute);
  return make_tier(kind, dir);  // its error names the kinds
}

}  // namespace starling::swap
