#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "starling/cli/commands.h"
#include "starling/common/error.h"
#include "starling/strategy/peer.h"
#include "starling/swap/swap_runner.h"
#include "starling/train/events.h"

namespace starling::cli {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int env_int(const char* name) {
  const char* v = env(name);
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < 0 || n > 1'000'000)
    throw ConfigError(std::string("environment variable ") + name + "=\"" + v +
                      "\" is not a non-negative integer");
  return static_cast<int>(n);
}

// Ranks a launcher starts with one config share its train.out_dir, and two processes in one
// directory would overwrite each other's metrics and checkpoints (the second is refused: it finds
// the first's lock). "{rank}" in train.out_dir stands for the rank; without it each rank of a
// group of two or more writes to <train.out_dir>/rank-<RANK>.
void place_rank_out_dir(train::RunConfig& c, int rank, int world) {
  if (const auto at = c.train.out_dir.find("{rank}"); at != std::string::npos)
    c.train.out_dir.replace(at, 6, std::to_string(rank));
  else if (world > 1)
    c.train.out_dir =
        (std::filesystem::path(c.train.out_dir) / ("rank-" + std::to_string(rank))).string();
}

// torchrun / srun style launch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Rank 0 listens on
// MASTER_PORT; the others join it; everyone waits for WORLD_SIZE peers and trains on its share.
void apply_cluster_env(train::RunConfig& c, int& rank, int& world, bool listen_given,
                       bool join_given) {
  if (!env("RANK") || !env("WORLD_SIZE") || !env("MASTER_ADDR") || !env("MASTER_PORT")) return;
  rank = env_int("RANK");
  world = env_int("WORLD_SIZE");
  if (world < 1 || rank >= world)
    throw ConfigError("RANK=" + std::to_string(rank) +
                      " must be below WORLD_SIZE=" + std::to_string(world));
  const std::string master = std::string("tcp://") + env("MASTER_ADDR") + ":" + env("MASTER_PORT");
  if (rank == 0 && !listen_given) {
    c.net.listen = std::string("tcp://0.0.0.0:") + env("MASTER_PORT");
    c.net.advertise = env("MASTER_ADDR");
  } else if (rank != 0 && !listen_given) {
    c.net.listen = "tcp://0.0.0.0:0";
  }
  if (rank != 0 && !join_given) c.net.join = {master};
  c.net.min_peers = std::max<int64_t>(c.net.min_peers, world);
  if (c.net.name.empty()) c.net.name = "rank-" + std::to_string(rank);
  // One key file per rank: "{rank}" in net.key stands for the rank.
  if (const auto at = c.net.key.find("{rank}"); at != std::string::npos)
    c.net.key.replace(at, 6, std::to_string(rank));
  place_rank_out_dir(c, rank, world);
}

// net.backend = "gloo" or "nccl": a fixed group. Keys left unset come from the launcher's
// environment (RANK, WORLD_SIZE, MASTER_ADDR:MASTER_PORT); under torchrun, whose agent hosts the
// store itself, rank 0 connects to it rather than hosting its own. With NCCL each rank takes the
// GPU LOCAL_RANK names when train.device is plain "cuda".
void apply_group_env(train::RunConfig& c, int& rank, int& world, bool& store_hosted_elsewhere) {
  // The launcher's ranks share the config's train.out_dir; ranks given in the config (a local
  // swarm's) come with directories of their own.
  const bool launched = c.net.rank < 0 && env("RANK");
  if (c.net.rank < 0 && env("RANK")) c.net.rank = env_int("RANK");
  if (c.net.world_size == 0 && env("WORLD_SIZE")) c.net.world_size = env_int("WORLD_SIZE");
  if (c.net.store.empty() && env("MASTER_ADDR") && env("MASTER_PORT"))
    c.net.store = std::string(env("MASTER_ADDR")) + ":" + env("MASTER_PORT");
  const char* agent_store = env("TORCHELASTIC_USE_AGENT_STORE");
  store_hosted_elsewhere = agent_store != nullptr && std::string(agent_store) == "True";
  if (c.net.backend == "nccl" && c.train.device == "cuda" && env("LOCAL_RANK"))
    c.train.device = "cuda:" + std::to_string(env_int("LOCAL_RANK"));
  if (c.net.rank >= 0) rank = static_cast<int>(c.net.rank);
  if (c.net.world_size > 0) world = static_cast<int>(c.net.world_size);
  if (launched) place_rank_out_dir(c, rank, world);
}

}  // namespace

void add_peer_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "peer", "run one peer of a training swarm ([strategy] and [net] of the config)");
  struct Args {
    std::string config, listen, key, allow, name;
    std::vector<std::string> sets, join;
    bool resume = false, quiet = false, json = false, insecure = false;
    int64_t stop_at = -1;
    int data_rank = -1, data_world = -1;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("-c,--config", a->config, "config file (TOML)")->required();
  cmd->add_option("--set", a->sets, "override a key, e.g. --set strategy.kind=co2 (repeatable)");
  cmd->add_option("--listen", a->listen, "address to listen on (net.listen), tcp://HOST:PORT");
  cmd->add_option("--join", a->join,
                  "a live member to join through (net.join): tcp://HOST:PORT or KEY@tcp://...");
  cmd->add_option("--key", a->key, "this peer's key file (net.key)");
  cmd->add_option("--allow", a->allow, "the swarm's allowlist (net.allow)");
  cmd->add_option("--name", a->name, "this peer's name (net.name)");
  cmd->add_flag("--insecure", a->insecure, "plain TCP without CURVE (net.insecure)");
  cmd->add_flag("--resume", a->resume, "continue from the newest checkpoint in train.out_dir");
  cmd->add_option("--stop-at", a->stop_at,
                  "stop with a checkpoint after this step, or at the end of the round it falls "
                  "in (localsgd, diloco, co2)")
      // Not int64's largest: CLI11 reads a number past it as that largest, without a word.
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 53));
  cmd->add_option("--data-rank", a->data_rank,
                  "this peer's share of the training data (default: RANK, else 0)");
  cmd->add_option("--data-world", a->data_world,
                  "how many shares the data is cut into (default: WORLD_SIZE, else 1)");
  cmd->add_flag("-q,--quiet", a->quiet, "no live progress line");
  cmd->add_flag("--json", a->json, "one JSON object per step and event on stdout");
  cmd->callback([a] {
    auto c = train::load_run_config(a->config, a->sets);
    if (c.strategy.kind == "none" && !c.pipeline.enabled())
      throw ConfigError(a->config + ": strategy.kind must be " + strategy::swarm_strategy_list() +
                        " for a peer");
    if (!a->listen.empty()) c.net.listen = a->listen;
    if (!a->join.empty()) c.net.join = a->join;
    if (!a->key.empty()) c.net.key = a->key;
    if (!a->allow.empty()) c.net.allow = a->allow;
    if (!a->name.empty()) c.net.name = a->name;
    if (a->insecure) c.net.insecure = true;
    int rank = 0, world = 1;
    strategy::PeerOptions o;
    if (c.net.backend == "starling")
      apply_cluster_env(c, rank, world, !a->listen.empty(), !a->join.empty());
    else
      apply_group_env(c, rank, world, o.store_hosted_elsewhere);
    if (a->data_rank >= 0) rank = a->data_rank;
    if (a->data_world >= 0) world = a->data_world;
    if (world < 1 || rank < 0 || rank >= world)
      throw ConfigError("--data-rank " + std::to_string(rank) + " must be in [0, --data-world " +
                        std::to_string(world) + ")");
    if (c.pipeline.auto_stages) {
      // The peers place themselves once they have planned (strategy/pipeline_auto_peer.h), and
      // each stage then reads its replica's share of the data.
    } else if (c.pipeline.enabled()) {
      // A flat rank (RANK, --data-rank) names the stage and the replica unless pipeline.stage
      // and pipeline.replica do; every stage of a replica reads that replica's batches.
      strategy::place_pipeline_peer(c.pipeline, rank, world);
      rank = static_cast<int>(c.pipeline.replica);
      world = static_cast<int>(c.pipeline.replicas);
    }
    o.train.resume = a->resume;
    o.train.progress = !a->quiet;
    o.train.stop_at = a->stop_at;
    o.train.data_rank = rank;
    o.train.data_world = world;
    o.train.json_events = a->json;
    if (c.swap.enabled()) o.train.step_runner = swap::swapped_step_runner(false);
    const auto r = strategy::run_peer(c, o);
    if (a->json) {
      rusage usage{};
      ::getrusage(RUSAGE_SELF, &usage);
      std::cout << train::events::done(
                       {.step = r.step,
                        .loss = r.train_loss,
                        .val_loss = r.val_loss,
                        .tokens_per_s = r.tokens_per_s,
                        .peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0,
                        .sample = r.sample},
                       r.net)
                       // A byte-level model's sample need not be valid UTF-8: invalid bytes
                       // become U+FFFD rather than failing the peer at its very end.
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << std::endl;
    } else {
      std::cout << "trained " << r.step << " steps: loss " << r.train_loss;
      if (r.val_loss >= 0) std::cout << ", val loss " << r.val_loss;
      std::cout << ", " << static_cast<long>(r.tokens_per_s) << " tokens/s\n";
      if (!r.sample.empty()) std::cout << "sample:\n" << r.sample << "\n";
    }
  });
}

}  // namespace starling::cli
