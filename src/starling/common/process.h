// Child processes for multi-process tests: spawn with a pipe on stdout, read lines with a
// deadline, signal, and reap. A test never hangs on a child: every wait has a timeout, and the
// destructor kills whatever is still running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace starling {

class Process {
 public:
  // Starts argv[0] (a path) with stdout on a pipe; stderr goes to `stderr_file` if given.
  explicit Process(const std::vector<std::string>& argv, const std::string& stderr_file = "");
  ~Process();
  Process(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // The next stdout line (without newline), or nullopt at end of output or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  // Every remaining line until the process closes stdout or `timeout` passes.
  std::vector<std::string> read_all(std::chrono::milliseconds timeout);

  void signal(int sig);
  // Exit code (or 128 + signal); nullopt if still running after `timeout`.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  pid_t pid() const { return pid_; }
  // The read end of the child's stdout, for poll() over several children.
  int stdout_fd() const { return out_; }
  // True once the child closed its stdout and every buffered line was read.
  bool finished_output() const { return eof_ && buffer_.find('\n') == std::string::npos; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
  bool eof_ = false;
  std::optional<int> status_;
};

}  // namespace starling
