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

}  // namespace starling::testing
