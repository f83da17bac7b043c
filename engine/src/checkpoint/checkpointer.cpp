#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "checkpoint_files.h"
#include "frozen_weights.h"
#include "model/random_state.h"
#include "saved_pieces.h"
#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/store_client.h"
#include "tide/engine/plan/cluster.h"

namespace tide {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// fp16's loss scale from a manifest: null (fp32 and bf16 runs, and checkpoints from
// before it was kept) or a positive finite scale with its count of good steps.
std::optional<LossScaleState> read_loss_scale(const json& manifest, const std::string& dir) {
  const auto it = manifest.find("loss_scale");
  if (it == manifest.end() || it->is_null()) return std::nullopt;
  const auto bad = [&] {
    return std::runtime_error(
        fmt::format("{}/manifest.json: loss_scale {} is not {{\"scale\": a positive number, "
                    "\"good_steps\": a whole number >= 0}}",
                    dir, it->dump()));
  };
  if (!it->is_object() || !it->contains("scale") || !it->contains("good_steps")) throw bad();
  const json& scale = (*it)["scale"];
  const json& good = (*it)["good_steps"];
  if (!scale.is_number() || !good.is_number_integer()) throw bad();
  LossScaleState state{scale.get<double>(), good.get<int64_t>()};
  if (!std::isfinite(state.scale) || state.scale <= 0 || state.good_steps < 0) throw bad();
  return state;
}

const char* const kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};

// Where this rank's model computes (its parameters live there, under ZeRO-3 too, as
// empty shards): whose random generators the checkpoint carries.
torch::Device model_device(const CheckpointParts& parts) { return parts.model->parameters().front().device(); }

// A range of one local parameter and where its values live in this rank's buffers.
struct Piece {
  size_t slot = 0;
  int64_t begin = 0, end = 0;  // elements of the local (tensor-parallel) parameter
  int64_t param_at = 0;        // in AdamW::params()
  int64_t moment_at = 0;       // in the moments
  bool counted = true;         // this rank is the one that saves it
};

// Rank `rank` of `ranks`' pieces of every unit, cut at parameter boundaries. With
// zero >= 1 (or 3 for parameters) the buffers hold only those pieces, end to end.
std::vector<Piece> pieces_of(const FlatParameters& flat, int rank, int ranks, int zero) {
  std::vector<Piece> out;
  for (const auto& seg : flat.shard_segments(rank, ranks, true, false)) {
    const int64_t g0 = seg.grad_offset, g1 = g0 + seg.numel;  // whole-buffer offsets
    for (const auto& unit : flat.units()) {
      if (g0 < unit.offset || g0 >= unit.offset + unit.numel) continue;
      for (const size_t i : unit.slots) {
        const auto& s = flat.slots()[i];
        const int64_t lo = std::max(g0, s.offset), hi = std::min(g1, s.offset + s.numel);
        if (lo >= hi) continue;
        const int64_t local = seg.param_offset + (lo - g0);
        out.push_back({i, lo - s.offset, hi - s.offset, zero == 3 ? local : lo, zero >= 1 ? local : lo, seg.counted});
      }
    }
  }
  return out;
}

torch::Tensor moments(AdamW& optim, int kind) { return kind == 1 ? optim.exp_avg() : optim.exp_avg_sq(); }

json tp_json(const TpSlice& t) {
  return {{"dim", t.dim}, {"first", t.first}, {"length", t.length}, {"valid", t.valid}};
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

struct Checkpointer::Impl {
  std::string root;
  CheckpointParts parts;
  int rank = 0, world = 1, dp_rank = 0, dp = 1, zero = 0;
  std::unique_ptr<StoreClient> store;  // used by the writer thread only
  std::thread writer;
  std::atomic<bool> abandoned{false};
  Listener listener;

  struct Entry {
    std::string name;
    torch::Tensor values;
    json piece;  // what it is (docs/checkpoints.md); null: the RNG state
  };
  struct Snapshot {
    int64_t step = 0;
    std::chrono::steady_clock::time_point taken;
    std::vector<Entry> entries;
    json manifest;  // rank 0
    json frozen;    // this rank's fingerprints(), which rank 0 records for all
  };

  // What this rank saves and restores: its parameters' layout and optimizer, the pieces of
  // rank `rank` of the `ranks` that share them; under expert parallelism its experts' too.
  struct Holding {
    FlatParameters* flat;
    AdamW* optim;
    int rank, ranks;
  };
  std::vector<Holding> holdings() const {
    std::vector<Holding> out{{parts.flat, parts.optim, dp_rank, dp}};
    if (parts.expert_flat) {
      const Comm& holders = *parts.dist->expert_replicas;
      out.push_back({parts.expert_flat, parts.expert_optim, holders.rank(), holders.size()});
    }
    return out;
  }

  bool saves_buffers() const { return dp_rank == 0 && (!parts.dist || parts.dist->tp->rank() == 0); }
  // Each of the model's buffers from `whole` (by name); one it gives undefined keeps its
  // values (initial weights without routing biases: they start at 0).
  void restore_buffers(const std::function<torch::Tensor(const std::string&)>& whole, const std::string& source) {
    for (const auto& item : parts.model->named_buffers()) {
      const auto values = whole(item.key());
      if (!values.defined()) continue;
      TORCH_CHECK(values.numel() == item.value().numel(), source, ": ", item.key(), " has ", values.numel(),
                  " values there, ", item.value().numel(), " in this model");
      item.value().copy_(values.reshape(item.value().sizes()));
    }
  }

  void fail(const Snapshot& snap, const std::string& what) {
    spdlog::error("checkpoint: step {}: {}", snap.step, what);
    if (listener) listener(snap.step, "", what, seconds_since(snap.taken));
  }

  void write(const Snapshot& snap);
  json write_files(const Snapshot& snap, const fs::path& tmp) const;
  void commit(const Snapshot& snap, const json& files, const json& frozen);
  void prune(int64_t newest);
  // This rank's parameters (kinds 1: k = 0), or parameters and both moments (3), from
  // whole tensors of any layout's checkpoint or weights: whole(name, k) for each
  // parameter this rank holds a part of; `source` names them in errors.
  void restore_values(const std::function<torch::Tensor(const std::string&, int)>& whole, int kinds,
                      const std::string& source);
  void restore_rng(const json& manifest, const std::string& dir);
  // The frozen parameters (this rank's parts) from whole tensors, which `source` must
  // hold; their fingerprints taken of those.
  void restore_frozen(const std::function<torch::Tensor(const std::string&)>& whole, const std::string& source);
  // This rank's part of whole tensor `global` of parameter `name`, whose part here has
  // `local_shape` (rows past the vocabulary zero); `source` names it in errors.
  torch::Tensor tensor_parallel_part(const torch::Tensor& global, const std::string& name,
                                     const std::vector<int64_t>& local_shape, const std::string& source) const;
  // The fingerprints of this rank's frozen parameters (of the whole tensors): taken as
  // restore_frozen reads them, or where nothing wrote them (no checkpoint.init_from: the
  // seed's draw) by drawing each whole once, at the first use. Training never changes them.
  const WeightFingerprints& fingerprints();
  WeightFingerprints frozen;
  bool fingerprints_made = false;
};

const WeightFingerprints& Checkpointer::Impl::fingerprints() {
  if (fingerprints_made) return frozen;
  const auto names = frozen_parameter_names(*parts.model);
  if (!names.empty()) {
    const Transformer whole(parts.cfg->model, TensorParallel{}, PipelineStage{}, ParameterStorage::Deferred);
    const auto params = whole->named_parameters();
    frozen = weights_fingerprints(names, [&](const std::string& name) {
      auto values = torch::empty(params[name].sizes(), torch::kFloat32);
      whole->initialise_parameter(name, values, static_cast<uint64_t>(parts.cfg->seed));
      return values;
    });
  }
  fingerprints_made = true;
  return frozen;
}

Checkpointer::Checkpointer(std::string root, CheckpointParts parts) : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.root = std::move(root);
  m.parts = parts;
  if (parts.dist) {
    m.rank = parts.dist->world->rank();
    m.world = parts.dist->world->size();
    // ZeRO's shards are spread over the ranks that hold the same parameters: dp x cp.
    m.dp_rank = parts.dist->replicas().rank();
    m.dp = parts.dist->replicas().size();
    m.zero = static_cast<int>(parts.cfg->parallel.zero);
    if (m.world > 1) m.store = std::make_unique<StoreClient>(parts.dist->env, std::chrono::seconds(30));
  }
}

Checkpointer::~Checkpointer() { wait(); }

void Checkpointer::wait() {
  if (impl_->writer.joinable()) impl_->writer.join();
}

void Checkpointer::abandon() {
  impl_->abandoned = true;
  wait();
  impl_->abandoned = false;
}

void Checkpointer::on_finished(Listener listener) {
  wait();
  impl_->listener = std::move(listener);
}

void Checkpointer::save(int64_t step, int64_t optimizer_steps, int64_t loader_cursor,
                        const std::optional<LossScaleState>& loss_scale) {
  wait();  // one save in flight at a time
  auto& m = *impl_;
  auto snap = std::make_shared<Impl::Snapshot>();
  snap->step = step;
  snap->taken = std::chrono::steady_clock::now();
  {
    // The pieces this rank owns, copied to host memory now: training may go on.
    torch::NoGradGuard no_grad;
    for (const auto& held : m.holdings()) {
      auto& flat = *held.flat;
      auto& optim = *held.optim;
      for (const auto& p : pieces_of(flat, held.rank, held.ranks, m.zero)) {
        if (!p.counted) continue;
        const auto& slot = flat.slots()[p.slot];
        const TpSlice tp = m.parts.model->tp_slice(slot.name);
        auto global_shape = slot.shape;
        if (tp.dim >= 0) global_shape[static_cast<size_t>(tp.dim)] = tp.valid;
        for (int k = 0; k < 3; ++k) {
          const auto& src = k == 0 ? optim.params() : moments(optim, k);
          const int64_t at = k == 0 ? p.param_at : p.moment_at;
          const std::string name = fmt::format("{}|{}|{}", slot.name, kKinds[k], p.begin);
          // Asynchronous: a copy in host memory, since training goes on. Synchronous on the
          // host: the buffers themselves, since training waits for the write.
          auto values = src.narrow(0, at, p.end - p.begin);
          if (m.parts.cfg->checkpoint.async || !values.is_cpu()) values = values.to(torch::kCPU).clone();
          snap->entries.push_back({name,
                                   values,
                                   {{"tensor", name},
                                    {"param", slot.name},
                                    {"kind", kKinds[k]},
                                    {"range", {p.begin, p.end}},
                                    {"local_shape", slot.shape},
                                    {"global_shape", global_shape},
                                    {"tp", tp_json(tp)}}});
        }
      }
    }
    // Buffers (the experts' routing biases) are whole on every rank of a stage, alike:
    // its first data- and tensor-parallel rank saves them.
    if (m.saves_buffers())
      for (const auto& item : m.parts.model->named_buffers()) {
        const auto& b = item.value();
        const std::string name = fmt::format("{}|buffer|0", item.key());
        snap->entries.push_back({name,
                                 b.to(torch::kCPU, torch::kFloat32, false, /*copy=*/true).reshape({-1}),
                                 {{"tensor", name},
                                  {"param", item.key()},
                                  {"kind", "buffer"},
                                  {"range", {0, b.numel()}},
                                  {"local_shape", b.sizes().vec()},
                                  {"global_shape", b.sizes().vec()},
                                  {"tp", tp_json(TpSlice{})}}});
      }
    for (auto& g : save_generators(model_device(m.parts)))
      snap->entries.push_back({"rng|" + g.device, std::move(g.state), nullptr});
  }
  snap->frozen = json(m.fingerprints());
  if (m.rank == 0) {
    const auto& cfg = *m.parts.cfg;
    const Distributed* d = m.parts.dist;
    snap->manifest = {
        {"format", kCheckpointFormat},
        {"step", step},
        {"optimizer_steps", optimizer_steps},
        {"loader_cursor", loader_cursor},
        {"tokens_seen", loader_cursor * cfg.data.seq_len},
        {"lr_schedule", {{"next_step", step}}},
        // fp32 and bf16 train without one
        {"loss_scale",
         loss_scale ? json{{"scale", loss_scale->scale}, {"good_steps", loss_scale->good_steps}} : json(nullptr)},
        {"rng", "per rank: tensors rng|cpu and, on CUDA, rng|cuda in its file"},
        {"layout",
         {{"world", m.world},
          {"dp", d ? d->grid.dp() : 1},
          {"cp", d ? d->grid.cp() : 1},
          {"tp", d ? d->tp->size() : 1},
          {"pp", d ? d->pp->size() : 1},
          {"ep", cfg.parallel.ep},
          {"virtual_stages", cfg.parallel.virtual_stages},
          {"zero", m.zero}}},
        {"recipe", config_to_json(cfg)},
        // Where a LoRA run's frozen base, left out of the files, is read from, resolved (an
        // export from another directory finds it); commit() records its fingerprints.
        {"frozen_source", m.fingerprints().empty() || cfg.checkpoint.init_from.empty()
                              ? json(nullptr)
                              : json(fs::absolute(cfg.checkpoint.init_from).lexically_normal().string())},
        {"recipe_schema_version", kConfigSchemaVersion},
        {"created",
         std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
             .count()}};
  }
  auto job = [this, snap] {
    try {
      impl_->write(*snap);
    } catch (const std::exception& e) {
      impl_->fail(*snap, e.what());
    }
  };
  if (m.parts.cfg->checkpoint.async)
    m.writer = std::thread(job);
  else
    job();
}

void Checkpointer::Impl::write(const Snapshot& snap) {
  const fs::path tmp = fs::path(root) / (step_dir_name(snap.step) + ".tmp");
  const std::string key = fmt::format("tide/ckpt/{}/{}", step_dir_name(snap.step), rank);
  json report;  // {"files": {name: {"bytes", "xxh3"}}, "frozen": fingerprints} or {"error": why}
  try {
    fs::create_directories(tmp);
    report = {{"files", write_files(snap, tmp)}, {"frozen", snap.frozen}};
  } catch (const std::exception& e) {
    report = {{"error", e.what()}};
  }
  if (rank != 0) {
    if (store) store->set(key, report.dump());
    if (report.contains("error")) throw std::runtime_error(report["error"].get<std::string>());
    return;
  }
  if (report.contains("error")) throw std::runtime_error(report["error"].get<std::string>());
  json files = report["files"];
  json frozen = snap.frozen;
  const auto patience = std::chrono::milliseconds(
      static_cast<int64_t>(std::max(600.0, parts.cfg->parallel.timeout_s) * 1000));
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (int r = 1; r < world; ++r) {
    // Polled rather than waited for: a run that fails meanwhile abandons the save at once.
    std::optional<std::string> other;
    while (!(other = store->get_if_set(fmt::format("tide/ckpt/{}/{}", step_dir_name(snap.step), r)))) {
      if (abandoned) throw std::runtime_error("abandoned: the run failed before every rank had written its files");
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(fmt::format("rank {} did not finish its files", r));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const json theirs = parse_json_or_discard(*other);
    if (theirs.is_object() && theirs.contains("error"))
      throw std::runtime_error(fmt::format("rank {}: {}", r, theirs["error"].get<std::string>()));
    if (!theirs.is_object() || !theirs.contains("files") || !theirs["files"].is_object())
      throw std::runtime_error(fmt::format("rank {} reported '{}'", r, *other));
    files.update(theirs["files"]);
    if (theirs.contains("frozen") && theirs["frozen"].is_object()) frozen.update(theirs["frozen"]);
  }
  commit(snap, files, frozen);
}

// This rank's share as one file or several, each written (and hashed, and fsynced) by a
// thread of its own: one stream to the page cache and one fsync at a time leave a disk
// and the cores idle. Entries go to the lightest file, largest first; the RNG state to part 0.
json Checkpointer::Impl::write_files(const Snapshot& snap, const fs::path& tmp) const {
  const auto bytes_of = [](const Entry* e) {
    return static_cast<uint64_t>(e->values.numel()) * e->values.element_size();
  };
  std::vector<const Entry*> order;
  uint64_t total = 0;
  for (const auto& e : snap.entries) {
    order.push_back(&e);
    total += bytes_of(&e);
  }
  const int64_t cores = int64_t{local_cores()};
  const int64_t wanted = parts.cfg->checkpoint.writers > 0
                             ? parts.cfg->checkpoint.writers
                             : std::clamp<int64_t>(static_cast<int64_t>(total >> 26), 1, std::min<int64_t>(4, cores));
  const int n = static_cast<int>(std::clamp<int64_t>(wanted, 1, std::max<size_t>(1, snap.entries.size() - 1)));
  std::stable_sort(order.begin(), order.end(), [&](const Entry* a, const Entry* b) {
    if (a->piece.is_null() != b->piece.is_null()) return a->piece.is_null();  // the RNG state first
    return bytes_of(a) > bytes_of(b);
  });
  std::vector<std::vector<const Entry*>> assigned(static_cast<size_t>(n));
  std::vector<uint64_t> load(static_cast<size_t>(n), 0);
  for (const Entry* e : order) {
    const auto lightest = std::min_element(load.begin(), load.end()) - load.begin();
    const size_t k = e->piece.is_null() ? 0 : static_cast<size_t>(lightest);
    assigned[k].push_back(e);
    load[k] += bytes_of(e);
  }
  std::vector<WrittenFile> written(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  auto write_part = [&](size_t k) {
    try {
      // Within a file, the snapshot's order: the same layout for the same share.
      auto list = assigned[k];
      std::sort(list.begin(), list.end());
      SafetensorsWriter w;
      json pieces = json::array();
      for (const Entry* e : list) {
        w.add(e->name, e->piece.is_null() ? "U8" : "F32", {e->values.numel()}, e->values.data_ptr(), bytes_of(e));
        if (!e->piece.is_null()) pieces.push_back(e->piece);
      }
      w.set_metadata("tide.format", std::to_string(kCheckpointFormat));
      w.set_metadata("tide.rank", std::to_string(rank));
      w.set_metadata("tide.pieces", pieces.dump());
      written[k] = w.write((tmp / rank_file_name(rank, static_cast<int>(k))).string());
    } catch (const std::exception& e) {
      errors[k] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (size_t k = 1; k < assigned.size(); ++k) threads.emplace_back(write_part, k);
  write_part(0);
  for (auto& t : threads) t.join();
  json files = json::object();
  for (size_t k = 0; k < assigned.size(); ++k) {
    if (!errors[k].empty()) throw std::runtime_error(errors[k]);
    files[rank_file_name(rank, static_cast<int>(k))] = {{"bytes", written[k].bytes}, {"xxh3", hex64(written[k].xxh3)}};
  }
  return files;
}

void Checkpointer::Impl::commit(const Snapshot& snap, const json& files, const json& frozen) {
  const fs::path dir = fs::path(root) / step_dir_name(snap.step);
  const fs::path tmp = fs::path(root) / (step_dir_name(snap.step) + ".tmp");
  json manifest = snap.manifest;
  manifest["files"] = files;
  manifest["frozen_xxh3"] = frozen.empty() ? json(nullptr) : frozen;
  write_durably((tmp / "manifest.json").string(), manifest.dump(2) + "\n");
  fsync_path(tmp.string());
  if (fs::exists(dir)) {  // the same step saved again (a resumed run): replace it whole
    const fs::path old = fs::path(root) / (step_dir_name(snap.step) + ".replaced");
    fs::remove_all(old);
    fs::rename(dir, old);
    fs::rename(tmp, dir);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, dir);
  }
  fsync_path(root);
  write_durably((dir / "COMMITTED").string(), fmt::format("{}\n", snap.step));
  write_durably((fs::path(root) / "latest").string(), step_dir_name(snap.step) + "\n");
  uint64_t bytes = 0;
  for (const auto& [name, info] : files.items()) bytes += info.at("bytes").get<uint64_t>();
  const double seconds = seconds_since(snap.taken);
  spdlog::info("checkpoint: step {} saved in {} ({} bytes in {:.3f} s, {:.0f} MB/s)", snap.step, dir.string(), bytes,
               seconds, static_cast<double>(bytes) / 1e6 / std::max(seconds, 1e-9));
  prune(snap.step);
  if (listener) listener(snap.step, dir.string(), "", seconds);
}

void Checkpointer::Impl::prune(int64_t newest) {
  const auto& c = parts.cfg->checkpoint;
  auto all = list_checkpoints(root);
  const auto keep_from = all.size() > static_cast<size_t>(c.keep_last) ? all.size() - c.keep_last : 0;
  for (size_t i = 0; i < keep_from; ++i) {
    if (all[i].step == newest) continue;
    if (c.keep_every > 0 && all[i].step % c.keep_every == 0) continue;
    std::error_code ec;
    fs::remove_all(all[i].path, ec);
  }
  // Temporaries of saves that never finished, older than this one.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 && name < step_dir_name(newest))
      fs::remove_all(e.path(), ec);
  }
}

std::optional<std::string> Checkpointer::latest_valid() const {
  auto all = list_checkpoints(impl_->root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const auto problems = verify_checkpoint(it->path);
    if (problems.empty()) return it->path;
    spdlog::error("checkpoint {} is unusable: {}; trying the one before", it->path, fmt::join(problems, "; "));
  }
  return std::nullopt;
}

ResumeState Checkpointer::load(const std::string& dir) {
  const auto problems = verify_checkpoint(dir);
  if (!problems.empty())
    throw std::runtime_error(fmt::format("checkpoint {} is unusable: {}", dir, fmt::join(problems, "; ")));
  const json manifest = read_manifest(dir);
  torch::NoGradGuard no_grad;
  if (const std::string differs = fingerprint_difference(recorded_fingerprints(manifest), impl_->fingerprints(), false);
      !differs.empty())
    throw std::runtime_error(
        fmt::format("checkpoint {} was trained on other frozen base weights than this run's ({}): {}", dir, differs,
                    "resume it with the checkpoint.init_from and model fields it was trained with"));
  const SavedPieces saved(dir, manifest);
  impl_->restore_values([&](const std::string& name, int k) { return saved.whole(name, kKinds[k]); }, 3, dir);
  impl_->restore_buffers([&](const std::string& name) { return saved.whole(name, "buffer"); }, dir);
  ResumeState state;
  state.step = manifest.at("step").get<int64_t>();
  state.optimizer_steps = manifest.at("optimizer_steps").get<int64_t>();
  state.loader_cursor = manifest.at("loader_cursor").get<int64_t>();
  state.loss_scale = read_loss_scale(manifest, dir);
  state.dir = dir;
  for (const auto& held : impl_->holdings()) held.optim->restore(state.optimizer_steps);
  impl_->restore_rng(manifest, dir);
  spdlog::info("checkpoint: resumed from {} (step {})", dir, state.step);
  return state;
}

void Checkpointer::initialise(const std::function<at::Tensor(const std::string&)>& whole_parameter,
                              const std::string& source) {
  torch::NoGradGuard no_grad;
  impl_->restore_values([&](const std::string& name, int) { return whole_parameter(name); }, 1, source);
  impl_->restore_frozen(whole_parameter, source);
  impl_->restore_buffers(whole_parameter, source);
  for (const auto& held : impl_->holdings()) held.optim->restore(0);
}

void Checkpointer::Impl::restore_frozen(const std::function<torch::Tensor(const std::string&)>& whole,
                                        const std::string& source) {
  auto params = parts.model->named_parameters();
  // Sharded (ZeRO-3): this rank's pieces of each, by the parameter's slot.
  std::map<std::string, std::vector<Piece>> pieces;
  std::map<std::string, const FlatParameters::Slot*> slots;
  const torch::Tensor shard = parts.frozen ? parts.data_parallel->frozen_shard() : torch::Tensor();
  if (parts.frozen)
    for (const auto& piece : pieces_of(*parts.frozen, dp_rank, dp, 3)) {
      const auto& slot = parts.frozen->slots()[piece.slot];
      pieces[slot.name].push_back(piece);
      slots[slot.name] = &slot;
    }
  frozen.clear();
  for (const auto& name : frozen_parameter_names(*parts.model)) {
    const auto values = whole(name);
    TORCH_CHECK(values.defined(), source, " holds no tensor for parameter '", name, "'");
    frozen[name] = tensor_fingerprint(values);
    if (!parts.frozen) {
      auto& p = params[name];
      p.copy_(tensor_parallel_part(values, name, p.sizes().vec(), source));
      continue;
    }
    const auto it = pieces.find(name);
    if (it == pieces.end()) continue;  // no piece of it on this rank
    const auto local = tensor_parallel_part(values, name, slots.at(name)->shape, source).contiguous().view({-1});
    for (const auto& piece : it->second)
      shard.narrow(0, piece.param_at, piece.end - piece.begin)
          .copy_(local.narrow(0, piece.begin, piece.end - piece.begin));
  }
  fingerprints_made = true;
}

torch::Tensor Checkpointer::Impl::tensor_parallel_part(const torch::Tensor& global, const std::string& name,
                                                       const std::vector<int64_t>& local_shape,
                                                       const std::string& source) const {
  const TpSlice tp = parts.model->tp_slice(name);
  auto expected = local_shape;  // the whole parameter's
  if (tp.dim >= 0) expected[static_cast<size_t>(tp.dim)] = tp.valid;
  TORCH_CHECK(global.sizes().vec() == expected, source, ": ", name, " has shape ", global.sizes(), " there, ",
              c10::IntArrayRef(expected), " in this model");
  if (tp.dim < 0) return global;
  auto local = torch::zeros(local_shape, torch::kFloat32);
  const int64_t n = std::clamp<int64_t>(tp.valid - tp.first, 0, tp.length);
  if (n > 0) local.narrow(tp.dim, 0, n).copy_(global.narrow(tp.dim, tp.first, n));
  return local;
}

void Checkpointer::Impl::restore_values(const std::function<torch::Tensor(const std::string&, int)>& whole, int kinds,
                                        const std::string& source) {
  for (const auto& held : holdings()) {
    auto& flat = *held.flat;
    auto& optim = *held.optim;
    // Parameters: all local ones (ZeRO-3: this rank's pieces); moments: the optimizer's.
    const auto param_pieces = zero == 3 ? pieces_of(flat, held.rank, held.ranks, 3) : pieces_of(flat, 0, 1, 0);
    const auto moment_pieces = zero >= 1 ? pieces_of(flat, held.rank, held.ranks, zero) : pieces_of(flat, 0, 1, 0);
    for (int k = 0; k < kinds; ++k) {
      const auto& wanted = k == 0 ? param_pieces : moment_pieces;
      std::map<size_t, std::vector<const Piece*>> by_slot;
      for (const auto& p : wanted) by_slot[p.slot].push_back(&p);
      for (const auto& [slot_index, list] : by_slot) {
        const auto& slot = flat.slots()[slot_index];
        const auto global = whole(slot.name, k);
        if (!global.defined()) continue;  // initialise: not in the source (a LoRA adapter), kept as drawn
        const auto values = tensor_parallel_part(global, slot.name, slot.shape, source).contiguous().view({-1});
        torch::Tensor dst = k == 0 ? optim.params() : moments(optim, k);
        for (const Piece* p : list) {
          const int64_t at = k == 0 ? p->param_at : p->moment_at;
          dst.narrow(0, at, p->end - p->begin).copy_(values.narrow(0, p->begin, p->end - p->begin));
        }
      }
    }
  }
}

void Checkpointer::Impl::restore_rng(const json& manifest, const std::string& dir) {
  // Only under the same layout does this rank's random generator continue where it stopped.
  const auto& layout = manifest.at("layout");
  const Distributed* d = parts.dist;
  // (Checkpoints from before interleaving name no virtual stages: they had one.)
  // (Checkpoints from before context parallelism name no cp: they had 1.)
  if (layout.at("world") != world || layout.at("dp") != (d ? d->grid.dp() : 1) ||
      layout.value("cp", 1) != (d ? d->grid.cp() : 1) || layout.at("tp") != (d ? d->tp->size() : 1) ||
      layout.at("pp") != (d ? d->pp->size() : 1) ||
      layout.value("virtual_stages", int64_t{1}) != parts.cfg->parallel.virtual_stages)
    return;
  const SafetensorsReader own((fs::path(dir) / rank_file_name(rank)).string());
  // Every generator state the rank saved (rng|<device>); restore_generators takes those
  // this device has.
  std::vector<GeneratorState> states;
  for (const auto& e : own.entries()) {
    if (e.name.rfind("rng|", 0) != 0) continue;
    auto bytes = torch::empty({static_cast<int64_t>(e.end - e.begin)}, torch::kUInt8);
    std::memcpy(bytes.data_ptr(), own.data(e), e.end - e.begin);
    states.push_back({e.name.substr(4), bytes});
  }
  restore_generators(states, model_device(parts));
}

}  // namespace tide
