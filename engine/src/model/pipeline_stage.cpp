#include "tide/engine/model/pipeline_stage.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/train/flops.h"

namespace tide {

namespace {
// Contiguous blocks for each of `parts` virtual stages, in model order (see partition_stages).
std::vector<BlockRange> cut_blocks(const ModelConfig& m, int64_t pp, int64_t virtual_stages, int64_t seq_len,
                                   bool documents, const std::vector<int64_t>& given) {
  const int64_t n = m.n_layers, parts = pp * virtual_stages;
  const std::string what = virtual_stages == 1 ? fmt::format("pp = {} stages", pp)
                                               : fmt::format("pp x parallel.virtual_stages = {} x {} = {} stages", pp,
                                                             virtual_stages, parts);
  if (!given.empty()) {
    int64_t total = 0;
    for (const auto b : given) total += b;
    if (static_cast<int64_t>(given.size()) != parts || total != n)
      throw ConfigError("parallel.pipeline_stages",
                        fmt::format("{} stages of {} blocks do not cut {} of model.n_layers = {} blocks", given.size(),
                                    fmt::join(given, "+"), what, n));
    std::vector<BlockRange> ranges;
    int64_t at = 0;
    for (const auto b : given) {
      ranges.push_back({at, at + b});
      at += b;
    }
    return ranges;
  }
  if (parts > n)
    throw ConfigError(virtual_stages == 1 ? "parallel.pp" : "parallel.virtual_stages",
                      fmt::format("{} for model.n_layers = {} blocks: each stage needs a block", what, n));
  ModelConfig one = m, none = m;
  one.n_layers = 1;
  none.n_layers = 0;
  // A block's training FLOPs per token: its weights', and its attention's over the keys
  // the kernel computes (flops.h). before[j]: blocks [0, j)'s.
  const double weights = 6.0 * static_cast<double>(parameter_count(one) - parameter_count(none));
  const double width = static_cast<double>(m.n_heads * head_dim(m));
  std::vector<double> before(static_cast<size_t>(n) + 1, 0.0);
  for (int64_t i = 0; i < n; ++i)
    before[static_cast<size_t>(i) + 1] =
        before[static_cast<size_t>(i)] + weights + 12.0 * width * computed_keys(m, i, seq_len, documents);
  const double head = 6.0 * static_cast<double>(m.vocab_size) * static_cast<double>(m.dim);
  // cost[s][j]: the least possible most expensive stage when stages 0..s hold blocks
  // [0, j); from[s][j] where stage s starts.
  const double inf = std::numeric_limits<double>::infinity();
  const auto P = static_cast<size_t>(parts), N = static_cast<size_t>(n);
  std::vector<std::vector<double>> cost(P, std::vector<double>(N + 1, inf));
  std::vector<std::vector<int64_t>> from(P, std::vector<int64_t>(N + 1, 0));
  for (size_t s = 0; s < P; ++s) {
    const double extra = s == P - 1 ? head : 0.0;
    for (size_t j = s + 1; j <= N; ++j) {
      for (size_t i = s; i < j; ++i) {
        const double earlier = s == 0 ? (i == 0 ? 0.0 : inf) : cost[s - 1][i];
        const double c = std::max(earlier, before[j] - before[i] + extra);
        if (c < cost[s][j]) {
          cost[s][j] = c;
          from[s][j] = static_cast<int64_t>(i);
        }
      }
    }
  }
  std::vector<BlockRange> ranges(P);
  int64_t end = n;
  for (size_t s = P; s-- > 0;) {
    ranges[s] = {from[s][static_cast<size_t>(end)], end};
    end = ranges[s].first;
  }
  return ranges;
}
}  // namespace

std::vector<PipelineStage> partition_stages(const ModelConfig& m, int64_t pp, int64_t seq_len,
                                            const std::vector<int64_t>& given, int64_t virtual_stages, bool documents) {
  const auto ranges = cut_blocks(m, pp, virtual_stages, seq_len, documents, given);
  std::vector<PipelineStage> stages(static_cast<size_t>(pp));
  for (int64_t r = 0; r < pp; ++r) {
    auto& st = stages[static_cast<size_t>(r)];
    st.chunks.clear();
    for (int64_t c = 0; c < virtual_stages; ++c) st.chunks.push_back(ranges[static_cast<size_t>(c * pp + r)]);
    st.first = r == 0;
    st.last = r == pp - 1;
  }
  return stages;
}

int64_t range_blocks(const BlockRange& range, int64_t n_layers) {
  return (range.end < 0 ? n_layers : range.end) - range.first;
}

int64_t stage_blocks(const PipelineStage& stage, int64_t n_layers) {
  int64_t blocks = 0;
  for (const auto& c : stage.chunks) blocks += range_blocks(c, n_layers);
  return blocks;
}

int64_t recomputed_blocks(const ModelConfig& m, const BlockRange& range) {
  if (!m.activation_checkpointing) return 0;
  const int64_t blocks = range_blocks(range, m.n_layers);
  return m.recompute_blocks > 0 ? std::min(m.recompute_blocks, blocks) : blocks;
}

std::vector<int> chunk_units(const PipelineStage& stage, int chunk, const ParameterUnitLayout& units) {
  const auto& range = stage.chunks.at(static_cast<size_t>(chunk));
  const bool starts = stage.first && chunk == 0;
  const bool ends = stage.last && chunk + 1 == static_cast<int>(stage.chunks.size());
  std::vector<int> out;
  if (ends && (units.head() != 0 || !starts)) out.push_back(units.head());
  for (int64_t block = range.first + range_blocks(range, units.n_layers); block-- > range.first;)
    out.push_back(static_cast<int>(block) + 1);
  if (starts) out.push_back(0);
  return out;
}

bool stage_owns(const PipelineStage& stage, const std::string& name) {
  if (const int unit = block_unit(name); unit > 0) {
    const int64_t block = unit - 1;
    for (const auto& c : stage.chunks)
      if (block >= c.first && (c.end < 0 || block < c.end)) return true;
    return false;
  }
  return is_head_parameter(name) ? stage.last : stage.first;
}

}  // namespace tide
