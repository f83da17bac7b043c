// Names read from files a user hands us (manifests, safetensors indexes) that tide then
// opens inside one directory.
#pragma once

#include <string_view>

namespace tide {

// True for a single path component that stays in its directory: not empty, not "." or
// "..", no '/' and no NUL.
bool is_plain_file_name(std::string_view name);

}  // namespace tide
