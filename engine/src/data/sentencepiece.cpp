// SentencePiece BPE models (tokenizer.model), read from the protobuf wire format.
// Encoding follows sentencepiece's bpe_model.cc: normalise, split into characters (a
// user-defined piece whole and frozen, as its prefix matcher does), then repeatedly merge
// the adjacent pair whose joined piece has the highest score (leftmost on ties); what is
// left unknown falls back to byte pieces or <unk>. Control pieces in the text are taken
// out first, as transformers does with special tokens.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <stdexcept>

#include "special_token_finder.h"
#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581, sentencepiece's whitespace mark

class Wire {
 public:
  Wire(std::string_view data, const std::string& file) : d_(data), file_(file) {}
  bool done() const { return pos_ >= d_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= d_.size()) fail("truncated varint");
      const auto b = static_cast<uint8_t>(d_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("varint longer than 10 bytes");
    return 0;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > d_.size() - pos_) fail("length-delimited field runs past the end");
    const auto out = d_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  float fixed32() {
    if (d_.size() - pos_ < 4) fail("truncated fixed32");
    float f;
    std::memcpy(&f, d_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); break;
      case 1: advance(8); break;
      case 2: bytes(); break;
      case 5: advance(4); break;
      default: fail("unknown wire type " + std::to_string(wire_type));
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(file_ + ": not a SentencePiece model (" + what + ")");
  }

 private:
  void advance(size_t n) {
    if (d_.size() - pos_ < n) fail("truncated field");
    pos_ += n;
  }
  std::string_view d_;
  const std::string& file_;
  size_t pos_ = 0;
};

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

}  // namespace

SentencePieceBpe SentencePieceBpe::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open tokenizer '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  SentencePieceBpe t;
  t.raw_ = ss.str();
  int64_t model_type = 1;  // proto default: UNIGRAM
  std::string normalizer = "nmt_nfkc";
  int64_t unk_id = 0, bos_id = 1, eos_id = 2;  // TrainerSpec's defaults
  Wire top(t.raw_, path);
  while (!top.done()) {
    const uint64_t key = top.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), type = key & 7;
    if (field == 1 && type == 2) {  // SentencePiece pieces
      Wire p(top.bytes(), path);
      Piece piece;
      while (!p.done()) {
        const uint64_t k = p.varint();
        const uint32_t f = static_cast<uint32_t>(k >> 3), ty = k & 7;
        if (f == 1 && ty == 2) piece.text = std::string(p.bytes());
        else if (f == 2 && ty == 5) piece.score = p.fixed32();
        else if (f == 3 && ty == 0) piece.type = static_cast<int>(p.varint());
        else p.skip(ty);
      }
      t.pieces_.push_back(std::move(piece));
    } else if (field == 2 && type == 2) {  // TrainerSpec
      Wire s(top.bytes(), path);
      while (!s.done()) {
        const uint64_t k = s.varint();
        const uint32_t f = static_cast<uint32_t>(k >> 3), ty = k & 7;
        if (ty != 0) {
          s.skip(ty);
          continue;
        }
        const auto v = static_cast<int64_t>(s.varint());
        if (f == 3) model_type = v;
        else if (f == 35) t.byte_fallback_ = v != 0;
        else if (f == 40) unk_id = static_cast<int32_t>(v);
        else if (f == 41) bos_id = static_cast<int32_t>(v);
        else if (f == 42) eos_id = static_cast<int32_t>(v);
      }
    } else if (field == 3 && type == 2) {  // NormalizerSpec
      Wire s(top.bytes(), path);
      while (!s.done()) {
        const uint64_t k = s.varint();
        const uint32_t f = static_cast<uint32_t>(k >> 3), ty = k & 7;
        if (f == 1 && ty == 2) normalizer = std::string(s.bytes());
        else if (f == 3 && ty == 0) t.add_dummy_prefix_ = s.varint() != 0;
        else if (f == 4 && ty == 0) t.remove_extra_whitespaces_ = s.varint() != 0;
        else if (f == 5 && ty == 0 && s.varint() == 0) top.fail("escape_whitespaces = false is not supported");
        else s.skip(ty);
      }
    } else {
      top.skip(type);
    }
  }
  if (t.pieces_.empty()) top.fail("no pieces");
  if (model_type != 2)
    throw std::runtime_error(path + ": SentencePiece model_type " + std::to_string(model_type) +
                             " is not supported; only BPE (2), as LLaMA-1/2 use");
  if (normalizer != "identity")
    throw std::runtime_error(path + ": SentencePiece normaliser '" + normalizer +
                             "' is not supported; only 'identity', as LLaMA-1/2 use");
  const auto in_vocabulary = [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(t.pieces_.size()) ? static_cast<int32_t>(id) : -1; };
  // Every unknown character encodes to unk_id: an id outside the pieces would reach the
  // model's embedding.
  if (in_vocabulary(unk_id) < 0)
    top.fail("unk_id " + std::to_string(unk_id) + " is not one of the " + std::to_string(t.pieces_.size()) + " pieces");
  t.unk_id_ = static_cast<int32_t>(unk_id);
  t.eos_id_ = in_vocabulary(eos_id);
  t.bos_id_ = in_vocabulary(bos_id);
  for (int b = 0; b < 256; ++b) t.byte_ids_[b] = -1;
  const auto hex_digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  for (size_t i = 0; i < t.pieces_.size(); ++i) {
    const Piece& p = t.pieces_[i];
    if (p.type == 6) {
      // sentencepiece writes byte pieces as "<0x0A>": two upper-case hex digits.
      const int hi = p.text.size() == 6 && p.text.rfind("<0x", 0) == 0 && p.text[5] == '>' ? hex_digit(p.text[3]) : -1;
      const int lo = hi >= 0 ? hex_digit(p.text[4]) : -1;
      if (lo < 0) top.fail("byte piece " + std::to_string(i) + " is '" + p.text + "', not <0xHH>");
      t.byte_ids_[hi * 16 + lo] = static_cast<int32_t>(i);
    } else if (p.type == 1 || p.type == 4) {
      t.by_text_.emplace(p.text, static_cast<int32_t>(i));
      if (p.type == 4 && !p.text.empty()) t.user_defined_lengths_.push_back(p.text.size());
    } else if (p.type == 3 && !p.text.empty()) {
      t.controls_.emplace_back(p.text, static_cast<int32_t>(i));
    }
  }
  auto& lengths = t.user_defined_lengths_;
  std::sort(lengths.begin(), lengths.end(), std::greater<>());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::stable_sort(t.controls_.begin(), t.controls_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return t;
}

void SentencePieceBpe::save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(raw_.data(), static_cast<std::streamsize>(raw_.size()));
  if (!out.flush()) throw std::runtime_error("cannot write tokenizer '" + path + "'");
}

std::string SentencePieceBpe::normalize(std::string_view text, bool dummy_prefix) const {
  std::string s(text);
  if (remove_extra_whitespaces_) {
    std::string collapsed;
    bool space = true;  // drops leading spaces
    for (const char c : s) {
      if (c == ' ') {
        if (!space) collapsed += ' ';
        space = true;
      } else {
        collapsed += c;
        space = false;
      }
    }
    while (!collapsed.empty() && collapsed.back() == ' ') collapsed.pop_back();
    s.swap(collapsed);
  }
  if (s.empty()) return s;
  std::string out;
  if (dummy_prefix) out += kSpace;
  for (const char c : s) {
    if (c == ' ') out += kSpace;
    else out += c;
  }
  return out;
}

std::vector<int32_t> SentencePieceBpe::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  bool first = true;
  SpecialTokenFinder controls(controls_, text);
  for (size_t start = 0;;) {
    const auto [hit, at] = controls.next(start);
    encode_stretch(text.substr(start, hit ? at - start : std::string_view::npos), first && add_dummy_prefix_, ids);
    if (!hit) return ids;
    ids.push_back(hit->second);
    start = at + hit->first.size();
    first = false;
  }
}

void SentencePieceBpe::encode_stretch(std::string_view text, bool dummy_prefix, std::vector<int32_t>& ids) const {
  const std::string norm = normalize(text, dummy_prefix);
  struct Sym {
    int prev, next;
    size_t begin, len;
    bool whole;  // a user-defined piece: never merged
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < norm.size();) {
    size_t n = 0;
    for (const size_t len : user_defined_lengths_) {
      if (len > norm.size() - i) continue;
      const auto it = by_text_.find(norm.substr(i, len));
      if (it != by_text_.end() && pieces_[static_cast<size_t>(it->second)].type == 4) {
        n = len;
        break;
      }
    }
    const bool whole = n > 0;
    if (!whole) n = std::min(utf8_len(static_cast<unsigned char>(norm[i])), norm.size() - i);
    syms.push_back({static_cast<int>(syms.size()) - 1, static_cast<int>(syms.size()) + 1, i, n, whole});
    i += n;
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  struct Candidate {
    float score;
    int left, right;
    size_t len;
    bool operator<(const Candidate& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  std::priority_queue<Candidate> agenda;
  auto consider = [&](int l, int r) {
    if (l < 0 || r < 0 || syms[l].whole || syms[r].whole) return;
    const size_t len = syms[l].len + syms[r].len;
    const auto it = by_text_.find(norm.substr(syms[l].begin, len));
    if (it != by_text_.end()) agenda.push({pieces_[it->second].score, l, r, len});
  };
  for (size_t i = 0; i + 1 < syms.size(); ++i) consider(static_cast<int>(i), static_cast<int>(i + 1));
  while (!agenda.empty()) {
    const Candidate c = agenda.top();
    agenda.pop();
    Sym &l = syms[c.left], &r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  bool last_unknown = false;
  for (int i = 0; i >= 0; i = syms[i].next) {
    const std::string piece = norm.substr(syms[i].begin, syms[i].len);
    const auto it = by_text_.find(piece);
    const bool unknown = it == by_text_.end();
    if (!unknown) {
      ids.push_back(it->second);
    } else if (byte_fallback_) {
      for (const unsigned char b : piece) ids.push_back(byte_ids_[b] >= 0 ? byte_ids_[b] : unk_id_);
    } else if (!last_unknown) {
      ids.push_back(unk_id_);  // a run of unknown characters becomes one <unk>, as sentencepiece does
    }
    last_unknown = unknown && !byte_fallback_;
  }
}

std::string SentencePieceBpe::decode_one(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(pieces_.size())) return "\xEF\xBF\xBD";
  const Piece& p = pieces_[static_cast<size_t>(id)];
  if (p.type == 6) {
    for (int b = 0; b < 256; ++b)
      if (byte_ids_[b] == id) return std::string(1, static_cast<char>(b));
  }
  if (p.type == 3) return "";
  if (p.type == 2) return " \xE2\x81\x87 ";  // sentencepiece renders <unk> as " ⁇ "
  std::string out;
  for (size_t i = 0; i < p.text.size();) {
    if (p.text.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += p.text[i++];
    }
  }
  return out;
}

std::string SentencePieceBpe::token_text(int32_t id) const { return pieces_.at(static_cast<size_t>(id)).text; }

std::string SentencePieceBpe::decode(const std::vector<int32_t>& ids) const {
  std::string out = Tokenizer::decode(ids);
  if (add_dummy_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace tide
