#include "tide/engine/data/normalizer.h"

#include <climits>
#include <functional>
#include <stdexcept>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <nlohmann/json.hpp>

namespace tide {
namespace {

const char* name(Normalizer::Form f) {
  switch (f) {
    case Normalizer::Form::Nfc: return "NFC";
    case Normalizer::Form::Nfd: return "NFD";
    case Normalizer::Form::Nfkc: return "NFKC";
    case Normalizer::Form::Nfkd: return "NFKD";
  }
  return "?";
}

const icu::Normalizer2& instance(Normalizer::Form f) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (f) {
    case Normalizer::Form::Nfc: n = icu::Normalizer2::getNFCInstance(status); break;
    case Normalizer::Form::Nfd: n = icu::Normalizer2::getNFDInstance(status); break;
    case Normalizer::Form::Nfkc: n = icu::Normalizer2::getNFKCInstance(status); break;
    case Normalizer::Form::Nfkd: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status) || !n)
    throw std::runtime_error(std::string("ICU has no ") + name(f) + " normaliser: " + u_errorName(status));
  return *n;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& spec, const std::string& file) {
  Normalizer n;
  // Nested Sequences are bounded by the JSON reader's depth limit.
  const std::function<void(const nlohmann::json&)> add = [&](const nlohmann::json& s) {
    const std::string type = s.is_object() ? s.value("type", "") : "";
    if (type == "Sequence") {
      const auto& inner = s.value("normalizers", nlohmann::json::array());
      if (!inner.is_array()) throw std::runtime_error(file + ": normalizer Sequence without a list of normalizers");
      for (const auto& i : inner) add(i);
    } else if (type == "NFC") {
      n.forms_.push_back(Form::Nfc);
    } else if (type == "NFD") {
      n.forms_.push_back(Form::Nfd);
    } else if (type == "NFKC") {
      n.forms_.push_back(Form::Nfkc);
    } else if (type == "NFKD") {
      n.forms_.push_back(Form::Nfkd);
    } else {
      throw std::runtime_error(file + ": normalizer " + (s.is_object() ? "'" + type + "'" : s.dump()) +
                               " is not supported (NFC, NFD, NFKC, NFKD and Sequence are)");
    }
  };
  if (!spec.is_null()) add(spec);
  for (const Form f : n.forms_) instance(f);  // fails here, at load, if ICU lacks the data
  return n;
}

nlohmann::json Normalizer::to_json() const {
  if (forms_.empty()) return nullptr;
  auto one = [](Form f) { return nlohmann::json{{"type", name(f)}}; };
  if (forms_.size() == 1) return one(forms_[0]);
  nlohmann::json list = nlohmann::json::array();
  for (const Form f : forms_) list.push_back(one(f));
  return {{"type", "Sequence"}, {"normalizers", list}};
}

std::string Normalizer::apply(std::string_view text) const {
  std::string cur(text);
  for (const Form f : forms_) {
    // ASCII is invariant under every normal form: most of a corpus takes this branch.
    bool ascii = true;
    for (const char c : cur)
      if (static_cast<unsigned char>(c) >= 0x80) {
        ascii = false;
        break;
      }
    if (ascii) break;
    if (cur.size() > static_cast<size_t>(INT32_MAX))
      throw std::runtime_error(std::string(name(f)) + " normalisation of a text of " + std::to_string(cur.size()) +
                               " bytes: ICU takes at most 2^31 - 1 bytes at once");
    std::string out;
    out.reserve(cur.size());
    icu::StringByteSink<std::string> sink(&out);
    UErrorCode status = U_ZERO_ERROR;
    instance(f).normalizeUTF8(0, icu::StringPiece(cur.data(), static_cast<int32_t>(cur.size())), sink, nullptr, status);
    if (U_FAILURE(status))
      throw std::runtime_error(std::string(name(f)) + " normalisation of a text of " + std::to_string(cur.size()) +
                               " bytes failed: " + u_errorName(status));
    cur.swap(out);
  }
  return cur;
}

}  // namespace tide
