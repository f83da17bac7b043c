// What the tests that compare tide with another program (Hugging Face's libraries in the
// project's .venv, sentencepiece's tools) share: running its command and reading what it
// printed.
#pragma once

#include <cstdio>
#include <string>

namespace tide::testing {

// Everything `cmd` (a shell command) wrote to stdout; empty when it could not start.
inline std::string command_output(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

}  // namespace tide::testing
