#include "tide/engine/model/pipeline_stage.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/parameter_names.h"

namespace tide {

std::vector<PipelineStage> partition_stages(const ModelConfig& m, int64_t pp, int64_t seq_len,
                                            const std::vector<int64_t>& given) {
  const int64_t n = m.n_layers;
  if (!given.empty()) {
    int64_t total = 0;
    for (const auto b : given) total += b;
    if (static_cast<int64_t>(given.size()) != pp || total != n)
      throw ConfigError("parallel.pipeline_stages",
                        fmt::format("{} stages of {} blocks do not cut pp = {} stages of model.n_layers = {} blocks",
                                    given.size(), fmt::join(given, "+"), pp, n));
    std::vector<PipelineStage> stages;
    int64_t at = 0;
    for (size_t s = 0; s < given.size(); ++s) {
      stages.push_back({at, at + given[s], s == 0, s + 1 == given.size()});
      at += given[s];
    }
    return stages;
  }
  if (pp > n)
    throw ConfigError("parallel.pp", fmt::format("{} stages for model.n_layers = {} blocks: each stage needs a block", pp, n));
  ModelConfig one = m, none = m;
  one.n_layers = 1;
  none.n_layers = 0;
  const double block = 6.0 * static_cast<double>(parameter_count(one) - parameter_count(none)) +
                       12.0 * static_cast<double>(m.dim) * static_cast<double>(seq_len);
  const double head = 6.0 * static_cast<double>(m.vocab_size) * static_cast<double>(m.dim);
  // cost[s][j]: the least possible most expensive stage when stages 0..s hold blocks
  // [0, j); from[s][j] where stage s starts.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> cost(static_cast<size_t>(pp), std::vector<double>(static_cast<size_t>(n + 1), inf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(pp), std::vector<int64_t>(static_cast<size_t>(n + 1), 0));
  for (int64_t s = 0; s < pp; ++s) {
    const double extra = s == pp - 1 ? head : 0.0;
    for (int64_t j = s + 1; j <= n; ++j) {
      for (int64_t i = s; i < j; ++i) {
        const double before = s == 0 ? (i == 0 ? 0.0 : inf) : cost[static_cast<size_t>(s - 1)][static_cast<size_t>(i)];
        const double c = std::max(before, static_cast<double>(j - i) * block + extra);
        if (c < cost[static_cast<size_t>(s)][static_cast<size_t>(j)]) {
          cost[static_cast<size_t>(s)][static_cast<size_t>(j)] = c;
          from[static_cast<size_t>(s)][static_cast<size_t>(j)] = i;
        }
      }
    }
  }
  std::vector<PipelineStage> stages(static_cast<size_t>(pp));
  int64_t end = n;
  for (int64_t s = pp - 1; s >= 0; --s) {
    auto& st = stages[static_cast<size_t>(s)];
    st.end_block = end;
    st.first_block = from[static_cast<size_t>(s)][static_cast<size_t>(end)];
    st.first = s == 0;
    st.last = s == pp - 1;
    end = st.first_block;
  }
  return stages;
}

bool stage_owns(const PipelineStage& stage, const std::string& name) {
  if (const int unit = block_unit(name); unit > 0)
    return unit - 1 >= stage.first_block && (stage.end_block < 0 || unit - 1 < stage.end_block);
  const bool head = name == "lm_head.weight" || name.rfind("model.norm.", 0) == 0 ||
                    name.rfind("transformer.ln_f.", 0) == 0;
  return head ? stage.last : stage.first;
}

}  // namespace tide
