// Text whose stretches count as targets or not (a prompt and its completion; a chat
// template's markup and an assistant's turn), encoded as one text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tide {

class Tokenizer;

struct TextSpan {
  std::string text;
  bool counted;  // its tokens are targets the loss counts
  // It starts with a special token the tokenizer takes out of the text first (a chat
  // turn's marker), so the text from here on encodes the same whatever came before.
  bool starts_at_special = false;
};

struct CountedIds {
  std::vector<int32_t> ids;
  std::vector<uint8_t> counted;  // one a token: 1 where it counts as a target
};

// The ids of the spans' texts joined, encoded as one text (not span by span: a
// tokenizer may merge across an edge, or treat a text's start apart), and which count.
// An edge falls after the ids that encoding the text up to it shares with the whole's:
// a token that crosses the edge (or that the pre-tokenizer's look-ahead past it changed)
// goes with the span after it, so a counted span's first token counts even when it began
// in the markup before it. Each edge costs one encoding of the text before it, from the
// last span that starts at a special token (which bounds the work by the longest turn,
// not the conversation: a conversation of many turns costs a few encodings of itself).
CountedIds encode_spans(const Tokenizer& tokenizer, const std::vector<TextSpan>& spans);

}  // namespace tide
