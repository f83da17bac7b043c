#include "tide/engine/io/step_rows.h"

#include <stdexcept>

#include "tide/engine/io/json_input.h"

namespace tide {

JsonlWriter::JsonlWriter(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw std::runtime_error("cannot open '" + path + "' for writing");
}

void JsonlWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write to '" + path_ + "'");
}

std::optional<double> truncate_step_rows(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string kept, line;
  std::optional<double> last_loss;
  while (std::getline(in, line)) {
    const auto j = parse_json_or_discard(line);
    if (j.is_object() && j.value("step", int64_t{0}) <= last_step) {
      kept += line + "\n";
      if (j.contains("loss") && j["loss"].is_number()) last_loss = j["loss"].get<double>();
    }
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept;
  if (!out.flush()) throw std::runtime_error("cannot rewrite '" + path + "'");
  return last_loss;
}

}  // namespace tide
