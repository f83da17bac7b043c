// How a fuzz target says that an input found a fault: a message on stderr and an abort,
// which libFuzzer reports with the input that caused it.
#pragma once

#include <string>
#include <string_view>

namespace tide::fuzz {

[[noreturn]] void fault(const std::string& what);

// A loader's error must name the file it read (the standard for bad input): `message`
// must hold `path`.
void expect_names(std::string_view message, std::string_view path);

}  // namespace tide::fuzz
