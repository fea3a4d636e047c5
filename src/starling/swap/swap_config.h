// The [swap] table: train a model whose training state (weights, gradients, AdamW moments) does
// not fit in compute memory by keeping it in a slower tier and streaming layer groups in while
// they run (docs/swap.md). The swap layer owns these settings and their keys; train/config.h
// places the table in a run's config. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "starling/config/keys_fwd.h"

namespace starling::swap {

struct SwapConfig {
  // Bytes of training state (weights, gradients and AdamW moments; fp32) held in compute memory
  // at once, e.g. "2GB"; "" (the default) keeps everything resident and swaps nothing.
  std::string budget;
  std::string tier = "disk";  // where the rest lives: "host" (RAM) or "disk" (a file, O_DIRECT)
  std::string dir;            // directory of the disk tier's file; "" = train.out_dir
  int64_t group_nodes = 0;    // nodes per layer group; 0 = the planner chooses
  int64_t depth = -1;         // groups loaded ahead of the one computing; -1 = the planner chooses
  // Layer groups, from the first, whose AdamW moments stay in compute memory (the rest stream
  // through the tier); -1 = the planner chooses, 0 = every moment in the tier.
  int64_t moment_groups = -1;
  // The optimizer's update runs behind the next step's forward (true) or on its own after the
  // passes (false).
  bool overlap_update = true;
  // With the update overlapped on a CPU: the rows a token lookup reads are updated first, and the
  // rest of its table while later layers compute (true), or the table whole before the forward
  // starts (false).
  bool rows_first = true;
  // Without clipping (optim.grad_clip = 0) and with the update overlapped on a CPU: each
  // parameter's update starts inside the backward, once its gradient is final (true), rather
  // than after the passes (false).
  bool update_in_backward = true;
  // With clipping (optim.grad_clip > 0) on the disk tier, as update_in_backward does: start the
  // update inside the backward as if the step will not be clipped, writing the new values to
  // spare rooms in the tier, and keep them if the global norm turns out under the limit (the
  // same bits: the clipping coefficient is then exactly 1) or redo the update from the untouched
  // rooms if it does not. "auto": after a step that was not clipped, reserving the spare rooms at
  // its first guess where swap.dir then has room for them twice over; "always": every step (the
  // room checked at the start); "off".
  std::string speculative_update = "auto";
  // "auto" guesses after an unclipped step while the share of the recent steps after one that
  // were not clipped either is above this; -1 = the plan's break-even (swap_plan.h), from its
  // predictions for a guess kept, a guess redone and no guess.
  double guess_break_even = -1;
  // How much longer the computation takes while the tier moves data at full speed (0.2 = 20%),
  // for the planner's prediction; -1 = probed at the start (a CPU's disk or host RAM tier).
  double io_slowdown = -1;

  bool enabled() const { return !budget.empty(); }
};

// Appends the [swap] keys, bound to `c`'s fields.
void add_config_keys(SwapConfig& c, config::Keys& keys);
// Checks what spans keys (the budget's syntax); ConfigError prefixed with `source`.
void check(const SwapConfig& c, const std::string& source);

// "2GB", "1.5 GiB", "512MB", "300000000B": decimal (KB, MB, GB, TB) and binary (KiB, MiB, GiB,
// TiB) units and B, case-insensitive; a unit is required. ConfigError naming `what` otherwise.
int64_t parse_bytes(const std::string& text, const std::string& what);
// 1536 MB -> "1.50 GB": three significant digits with a decimal unit.
std::string format_bytes(double bytes);

}  // namespace starling::swap
