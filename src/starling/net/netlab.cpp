#include "starling/net/netlab.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <utility>

#include "starling/net/lab_delay_relay.h"

#ifndef STARLING_SOURCE_DIR
#error "define STARLING_SOURCE_DIR (the source tree root) when compiling netlab.cpp"
#endif

extern char** environ;

namespace starling::net {
namespace {

struct RunResult {
  int exit_code = -1;  // -1 if it did not exit normally (signal, timeout, spawn failure)
  std::string output;  // stdout and stderr, interleaved
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Runs `bash script args...` with NETLAB_OWNER_PID set to this process, so the lab is owned by
// the test process rather than by the short-lived script, and `gc` in a later run can tell
// whether we are still alive. The timeout only guards against a wedged system: the script does
// nothing slow.
RunResult run_script(const std::vector<std::string>& args,
                     std::chrono::seconds timeout = std::chrono::seconds(120)) {
  RunResult result;
  std::vector<std::string> argv_s = {"bash", NetLab::script_path()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "NETLAB_OWNER_PID=", 17) != 0) env_s.emplace_back(*e);
  }
  env_s.push_back("NETLAB_OWNER_PID=" + std::to_string(::getpid()));
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.output = std::string("pipe2: ") + std::strerror(errno);
    return result;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, "bash", &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    result.output = std::string("cannot run bash: ") + std::strerror(rc);
    return result;
  }

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;  // timeout is handled at the top of the loop
    ssize_t k = ::read(fds[0], buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;  // EOF: the script and everything it started have closed the pipe
    result.output.append(buf, static_cast<size_t>(k));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    result.output += "\n(timed out after " + std::to_string(timeout.count()) + " s)";
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  result.output = trim(std::move(result.output));
  return result;
}

std::string describe(const std::vector<std::string>& args, const RunResult& r) {
  std::string cmd = "netlab.sh";
  for (const auto& a : args) cmd += " " + a;
  return cmd + " failed (exit " + std::to_string(r.exit_code) + "): " + r.output;
}

}  // namespace

std::string NetLab::script_path() {
  if (const char* s = std::getenv("STARLING_NETLAB_SCRIPT"); s != nullptr && *s != '\0') return s;
  return std::string(STARLING_SOURCE_DIR) + "/scripts/netlab.sh";
}

std::string NetLab::unavailable_reason() {
  // Computed once: the probe costs a namespace round trip, and the answer cannot change.
  static const std::string reason = [] {
    if (::geteuid() != 0) return std::string("network lab needs root (netns, veth, tc tbf)");
    if (::access(script_path().c_str(), R_OK) != 0) {
      return "network lab script not found: " + script_path();
    }
    RunResult r = run_script({"check"}, std::chrono::seconds(30));
    if (r.exit_code == 0) return std::string();
    return "network lab unavailable: " +
           (r.output.empty() ? std::string("check failed") : r.output);
  }();
  return reason;
}

NetLab::NetLab(int peers, std::string rate) : peers_(peers), rate_(std::move(rate)) { build(); }

NetLab::NetLab(const std::vector<std::vector<std::string>>& rates,
               const std::vector<std::vector<double>>& delays_s)
    : peers_(static_cast<int>(rates.size())), rate_("unlimited") {
  for (const auto& row : rates)
    if (row.size() != rates.size())
      throw std::invalid_argument("NetLab: the rate matrix must be square (" +
                                  std::to_string(rates.size()) + " rows, a row of " +
                                  std::to_string(row.size()) + ")");
  bool delayed = false;
  if (!delays_s.empty()) {
    if (delays_s.size() != rates.size())
      throw std::invalid_argument("NetLab: the delay matrix has " +
                                  std::to_string(delays_s.size()) + " rows for " +
                                  std::to_string(rates.size()) + " peers");
    for (size_t a = 0; a < delays_s.size(); ++a) {
      if (delays_s[a].size() != rates.size())
        throw std::invalid_argument("NetLab: the delay matrix must be square");
      for (size_t b = 0; b < delays_s.size(); ++b) delayed |= a != b && delays_s[a][b] > 0;
    }
  }
  build();
  for (int i = 0; i < peers_; ++i) {
    std::vector<std::string> args = {"shape", name_, std::to_string(i)};
    for (const auto& r : rates[static_cast<size_t>(i)]) args.push_back(r.empty() ? "-" : r);
    RunResult a = run_script(args);
    if (a.exit_code != 0) {
      run_script({"down", name_});
      throw std::runtime_error("NetLab: " + describe(args, a));
    }
  }
  rate_ = "per link";
  if (delayed) {
    std::vector<std::string> args = {"unbridge", name_};
    RunResult a = run_script(args);
    if (a.exit_code != 0) {
      run_script({"down", name_});
      throw std::runtime_error("NetLab: " + describe(args, a));
    }
    try {
      relay_ = std::make_unique<LabDelayRelay>(name_ + "-hub", delays_s);
    } catch (...) {
      run_script({"down", name_});
      throw;
    }
  }
}

void NetLab::build() {
  static std::atomic<int> counter{0};
  name_ = "nl" + std::to_string(::getpid()) + "x" + std::to_string(counter++);
  if (peers_ < 1 || peers_ > 254) {
    throw std::invalid_argument("NetLab: peers must be 1..254, got " + std::to_string(peers_));
  }

  // Best effort: a failed gc must not stop this lab from being built.
  RunResult gc = run_script({"gc"});
  if (gc.exit_code != 0) std::cerr << "NetLab: " << describe({"gc"}, gc) << "\n";

  // A lab of the same name can only be a leftover of an earlier process that had our pid and
  // somehow escaped gc; it is ours to replace.
  run_script({"down", name_});
  std::vector<std::string> up = {"up", name_, std::to_string(peers_), rate_};
  RunResult r = run_script(up);
  if (r.exit_code != 0) throw std::runtime_error("NetLab: " + describe(up, r));

  for (int i = 0; i < peers_; ++i) {
    std::vector<std::string> args = {"ip", name_, std::to_string(i)};
    RunResult a = run_script(args);
    if (a.exit_code != 0 || a.output.empty()) {
      run_script({"down", name_});
      throw std::runtime_error("NetLab: " + describe(args, a));
    }
    ips_.push_back(a.output);
  }
}

NetLab::~NetLab() {
  relay_.reset();  // before its ports go
  RunResult r = run_script({"down", name_});
  if (r.exit_code != 0) {
    std::cerr << "NetLab: " << describe({"down", name_}, r)
              << " (the next NetLab's gc will retry)\n";
  }
}

std::string NetLab::ip(int i) const {
  if (i < 0 || i >= peers_) throw std::out_of_range("NetLab::ip: no peer " + std::to_string(i));
  return ips_[static_cast<size_t>(i)];
}

std::string NetLab::ns(int i) const {
  if (i < 0 || i >= peers_) throw std::out_of_range("NetLab::ns: no peer " + std::to_string(i));
  return name_ + "-" + std::to_string(i);
}

void NetLab::set_rate(int i, const std::string& rate) {
  const std::vector<std::string> args = {"rate", name_, std::to_string(i), rate};
  const RunResult r = run_script(args);
  if (r.exit_code != 0) throw std::runtime_error("NetLab: " + describe(args, r));
}

std::vector<std::string> NetLab::exec_prefix(int i) const { return {"ip", "netns", "exec", ns(i)}; }

}  // namespace starling::net
