// Runs the `starling` binary with arguments and captures its exit code and output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace starling::testing {

struct CliResult {
  int code;
  std::string output;  // stdout and stderr together
};

inline CliResult run_cli(const std::string& args) {
  const std::string cmd = std::string(STARLING_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// Whether the binary sees a GPU ("starling 0.1.0 (libtorch 2.11.0, CUDA, 1 GPU)").
inline bool binary_sees_a_gpu() {
  const auto r = run_cli("--version");
  return r.output.find(", CUDA, ") != std::string::npos &&
         r.output.find(", CUDA, 0 GPUs") == std::string::npos;
}

}  // namespace starling::testing
