// Prompt-completion examples for fine-tuning (`tide data prepare --format
// prompt-completion`): one JSON object a line, {"prompt": "...", "completion": "..."}, the
// format of Hugging Face TRL's prompt-completion datasets. The prompt's tokens become
// inputs only; the completion's (and its end-of-text) the targets the loss counts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide {

struct PromptCompletion {
  std::string prompt, completion;
};

// The examples of `text`, the contents of the file `path`, in order; blank lines are
// skipped, other fields of an object ignored. A line that is not such an object (not
// JSON, nested deeper than 64, "prompt" or "completion" missing or not a string, or a
// completion that is empty) throws, naming the file, the line and what is wrong.
std::vector<PromptCompletion> read_prompt_completions(std::string_view text, const std::string& path);

}  // namespace tide
