// Everything one replica's run holds, built from the config: the dataset, the model DAG and its
// executor, the optimizer, the loader, and where the run stands (the Replica strategies see). When
// resuming it is restored from the newest checkpoint; it also writes checkpoints. The training
// loop (trainer.cpp) drives it; nothing here decides when a step or a save happens.
#pragma once

#include <c10/core/Device.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "starling/common/dir_lock.h"
#include "starling/data/dataset.h"
#include "starling/data/loader.h"
#include "starling/graph/dag.h"
#include "starling/graph/executor.h"
#include "starling/train/adamw.h"
#include "starling/train/checkpoint.h"
#include "starling/train/config.h"
#include "starling/train/loss_scaler.h"
#include "starling/train/metrics.h"
#include "starling/train/step_hooks.h"
#include "starling/train/trainer.h"

namespace starling::train {

struct Session {
  Session(const RunConfig& c, c10::Device d) : config(c), device(d) {}

  const RunConfig& config;
  c10::Device device;
  int threads = 1;                        // CPU threads the runtime uses
  std::unique_ptr<DirLock> run_dir_lock;  // held while the run writes run_dir()
  // The outermost directory open_session made for run_dir() (run_dir() or a missing parent);
  // empty when run_dir() was there. See remove_unstarted_run_dir().
  std::filesystem::path made_run_dir;
  std::filesystem::path made_swap_dir;  // the same for swap.dir, where it is set
  data::DatasetInfo dataset;
  std::unique_ptr<graph::OpDag> dag;
  std::unique_ptr<graph::Executor> executor;
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<data::TokenLoader> loader;
  LossScaler scaler;  // fp16 only
  std::unique_ptr<Replica> replica;
  double val_loss = -1;  // the last validation loss (restored when resuming)
  bool resumed = false;  // restored from a checkpoint
  // The checkpoint a resumed run came from, kept until the strategy has read its state.
  std::optional<Checkpoint> restored;

  std::filesystem::path run_dir() const { return config.train.out_dir; }

  // Writes the resolved config, every key, to run_dir()/config.toml. The trainer calls it once
  // the run has started (its runner built, its swarm joined), so a start that fails leaves none.
  void write_config() const;

  // For a run whose start failed (a swap budget too small, initial weights not found), before
  // write_config(): removes the run directory and the parents open_session made for it, where the
  // directory holds nothing but the lock, so that a mistyped command leaves no empty directories
  // behind. Anything else written there keeps it, lock included. The same for an empty swap.dir
  // and its parents, where the run made them. Never throws.
  void remove_unstarted_run_dir() noexcept;

  // Saves a checkpoint of the current step, with the strategy's state when `hooks` is given.
  std::filesystem::path save(StepHooks* hooks);
};

// Checks the config against the machine and the data (ConfigError/DataError naming the key),
// refuses an out_dir that holds a checkpoint unless resuming, builds the session, and restores
// the newest checkpoint (options.resume) or initial weights (train.init_from). Notes go to
// `progress`.
std::unique_ptr<Session> open_session(const RunConfig& config, const TrainOptions& options,
                                      ProgressLine& progress);

}  // namespace starling::train
