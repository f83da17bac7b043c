#include "piece_list.h"

#include <algorithm>
#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tide/engine/io/json_input.h"

namespace tide {
namespace {

using json = nlohmann::json;

// Elements of a shape; nothing above 2^62 (a bound no real parameter nears, so the
// products below cannot overflow).
int64_t elements_of(const std::vector<int64_t>& shape, const std::function<void(const std::string&)>& fail) {
  int64_t n = 1;
  for (const int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 62)) fail("a shape of more than 2^62 elements");
  return n;
}

class PieceReader {
 public:
  PieceReader(const SafetensorsReader& file, size_t index) : file_(file), index_(index) {}

  SavedPiece read(const json& meta) {
    if (!meta.is_object()) fail("is " + meta.dump() + ", not an object");
    SavedPiece p;
    p.file = &file_;
    const std::string tensor = text(meta, "tensor");
    where_ = "piece '" + tensor + "'";
    p.entry = file_.find(tensor);
    if (!p.entry) fail("names a tensor the file does not hold");
    p.param = text(meta, "param");
    p.kind = text(meta, "kind");
    if (p.kind != "param" && p.kind != "exp_avg" && p.kind != "exp_avg_sq" && p.kind != "buffer")
      fail("has kind '" + p.kind + "' (param, exp_avg, exp_avg_sq or buffer)");
    p.global_shape = shape(meta, "global_shape");
    p.local_shape = shape(meta, "local_shape");
    if (p.local_shape.size() != p.global_shape.size()) fail("has a local_shape of another rank than its global_shape");
    const auto failing = [this](const std::string& why) { fail("has " + why); };
    elements_of(p.global_shape, failing);
    const int64_t local_elements = elements_of(p.local_shape, failing);
    if (!meta.contains("tp") || !meta["tp"].is_object()) fail("has no tp object");
    const json& tp = meta["tp"];
    p.tp_dim = integer(tp, "dim");
    p.tp_first = integer(tp, "first");
    p.tp_length = integer(tp, "length");
    p.tp_valid = integer(tp, "valid");
    const auto rank = static_cast<int64_t>(p.global_shape.size());
    if (p.tp_dim < -1 || p.tp_dim >= rank) fail(fmt::format("has tp.dim {} for a shape of rank {}", p.tp_dim, rank));
    if (p.tp_dim == -1) {
      if (p.local_shape != p.global_shape)
        fail("is a whole parameter (tp.dim -1) whose local_shape is not its global_shape");
    } else {
      for (int64_t d = 0; d < rank; ++d) {
        const auto du = static_cast<size_t>(d);
        if (d == p.tp_dim ? p.local_shape[du] != p.tp_length : p.local_shape[du] != p.global_shape[du])
          fail(fmt::format("has local_shape {} that is not a tp.length {} slice of global_shape {} along dim {}",
                           json(p.local_shape).dump(), p.tp_length, json(p.global_shape).dump(), p.tp_dim));
      }
      if (p.tp_first < 0 || p.tp_valid < p.tp_first || p.tp_valid > p.global_shape[static_cast<size_t>(p.tp_dim)])
        fail(fmt::format("has tp.first {} and tp.valid {} outside [0, {}]", p.tp_first, p.tp_valid,
                         p.global_shape[static_cast<size_t>(p.tp_dim)]));
    }
    if (!meta.contains("range") || !meta["range"].is_array() || meta["range"].size() != 2)
      fail("has no range [begin, end]");
    p.range_begin = element(meta["range"], 0);
    p.range_end = element(meta["range"], 1);
    if (p.range_begin < 0 || p.range_end < p.range_begin || p.range_end > local_elements)
      fail(fmt::format("has range [{}, {}] outside its slice's {} elements", p.range_begin, p.range_end,
                       local_elements));
    if (p.entry->dtype != "F32" || p.entry->shape.size() != 1 || p.entry->shape[0] != p.range_end - p.range_begin)
      fail(fmt::format("is a {} tensor of shape {}, not the {} F32 values of its range", p.entry->dtype,
                       json(p.entry->shape).dump(), p.range_end - p.range_begin));
    return p;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(fmt::format("{}: tide.pieces entry {} ({}) {}", file_.path(), index_,
                                         where_.empty() ? "unnamed" : where_, what));
  }
  std::string text(const json& o, const char* field) const {
    if (!o.contains(field) || !o[field].is_string()) fail(std::string("has no string '") + field + "'");
    return o[field].get<std::string>();
  }
  int64_t whole(const json& v, const std::string& what) const {
    const auto n = json_int64(v);
    if (!n) fail("has " + what + " " + v.dump() + ", not an integer");
    return *n;
  }
  int64_t integer(const json& o, const char* field) const {
    if (!o.contains(field)) fail(std::string("has no '") + field + "'");
    return whole(o[field], std::string("'") + field + "'");
  }
  int64_t element(const json& list, size_t i) const { return whole(list[i], "range[" + std::to_string(i) + "]"); }
  std::vector<int64_t> shape(const json& o, const char* field) const {
    if (!o.contains(field) || !o[field].is_array()) fail(std::string("has no list '") + field + "'");
    std::vector<int64_t> out;
    for (const auto& d : o[field]) {
      out.push_back(whole(d, std::string("a dimension in '") + field + "'"));
      if (out.back() < 0) fail(std::string("has a negative dimension in '") + field + "'");
    }
    return out;
  }

  const SafetensorsReader& file_;
  size_t index_;
  std::string where_;
};

}  // namespace

std::vector<SavedPiece> read_piece_list(const SafetensorsReader& file) {
  const auto it = file.metadata().find("tide.pieces");
  if (it == file.metadata().end()) throw std::runtime_error(file.path() + ": no tide.pieces metadata");
  const json list = parse_json_input(it->second, file.path() + ": tide.pieces metadata");
  if (!list.is_array()) throw std::runtime_error(file.path() + ": tide.pieces metadata is not a list");
  std::vector<SavedPiece> out;
  for (size_t i = 0; i < list.size(); ++i) out.push_back(PieceReader(file, i).read(list[i]));
  return out;
}

void check_piece_coverage(const std::vector<SavedPiece>& all, const std::string& dir) {
  std::map<std::pair<std::string, std::string>, std::vector<const SavedPiece*>> by_tensor;
  for (const auto& p : all) by_tensor[{p.param, p.kind}].push_back(&p);
  for (auto& [key, pieces] : by_tensor) {
    const auto fail = [&, &key = key](const std::string& what) {
      throw std::runtime_error(fmt::format("checkpoint {}: the pieces of {} {} {}", dir, key.second, key.first, what));
    };
    const SavedPiece& first = *pieces.front();
    for (const auto* p : pieces)
      if (p->global_shape != first.global_shape || p->tp_dim != first.tp_dim || p->tp_valid != first.tp_valid)
        fail("disagree on its shape or its tensor-parallel split (" + p->file->path() + ")");
    // Slice by slice (tp.first), pieces in element order: each must start where the one
    // before it ended, and the last end at the slice's size.
    std::sort(pieces.begin(), pieces.end(), [](const SavedPiece* a, const SavedPiece* b) {
      return std::tie(a->tp_first, a->range_begin) < std::tie(b->tp_first, b->range_begin);
    });
    int64_t next_slice = 0, next_element = 0;
    const SavedPiece* slice = nullptr;
    const auto close_slice = [&] {
      if (!slice) return;
      const int64_t size = elements_of(slice->local_shape, fail);
      if (next_element != size)
        fail(fmt::format("cover {} of the {} elements of the slice at {}", next_element, size, slice->tp_first));
      next_slice = slice->tp_first + (slice->tp_dim < 0 ? 1 : slice->tp_length);
    };
    for (const auto* p : pieces) {
      if (!slice || p->tp_first != slice->tp_first) {
        close_slice();
        if (p->tp_first != next_slice)
          fail(fmt::format("have a slice at {} where the one before ends at {}", p->tp_first, next_slice));
        slice = p;
        next_element = 0;
      }
      if (p->local_shape != slice->local_shape || p->tp_length != slice->tp_length)
        fail(fmt::format("disagree on the shape of the slice at {}", p->tp_first));
      if (p->range_begin != next_element)
        fail(fmt::format("have elements [{}, {}) of the slice at {} where [{}, ...) comes next", p->range_begin,
                         p->range_end, p->tp_first, next_element));
      next_element = p->range_end;
    }
    close_slice();
    const int64_t wanted = first.tp_dim < 0 ? 1 : first.tp_valid;
    if (next_slice < wanted) fail(fmt::format("end at {} along tp.dim, short of {}", next_slice, wanted));
  }
}

}  // namespace tide
