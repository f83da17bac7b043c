// Collectives across real processes: forked ranks meet through a TCPStore and talk
// over Gloo on loopback, as a job's workers do.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "../../engine/src/parallel/tensor_parallel_group.h"
#include "../engine/tiny_models.h"
#include "tide/engine/model/chunk_attention.h"
#include "tide/engine/model/context_parallel.h"
#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/train/tensor_memory.h"
#include "tide/ipc/worker_group.h"

namespace tide {
namespace {
using ipc::free_loopback_port;  // a port the kernel found free: a pid-derived one can collide

// Runs body(rank) in `world` child processes; each returns 0 when its checks pass.
void run_ranks(int world, const std::function<int(Distributed&)>& body, int port) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 1;
      try {
        LaunchEnv env;
        env.rank = r;
        env.world = world;
        env.master_port = port;
        ParallelConfig p;
        auto d = init_distributed(env, p, std::chrono::milliseconds(20000));
        rc = body(*d);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << r << " status " << status;
  }
}

TEST(Comm, AllReduceReduceScatterAllGatherBroadcast) {
  run_ranks(
      3,
      [](Distributed& d) {
        Comm& c = *d.world;
        const int r = c.rank(), n = c.size();
        int bad = 0;
        auto t = torch::full({5}, static_cast<double>(r + 1), torch::kFloat32);
        c.all_reduce_sum(t, "test");
        bad += !torch::allclose(t, torch::full({5}, 6.0));  // 1 + 2 + 3
        // reduce-scatter: rank r gets the sum over ranks of chunk r.
        auto in = torch::arange(n * 4, torch::kFloat32) * static_cast<double>(r + 1);
        auto out = torch::empty({4});
        c.reduce_scatter_sum(in, out, "test");
        bad += !torch::allclose(out, torch::arange(r * 4, r * 4 + 4, torch::kFloat32) * 6.0);
        // all-gather: chunk j holds rank j's input.
        auto mine = torch::full({2}, static_cast<double>(r), torch::kFloat32);
        auto all = torch::empty({n * 2});
        c.all_gather(mine, all, "test");
        bad += !torch::allclose(all, torch::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f}));
        // bf16 travels as fp32 through Gloo.
        auto b = torch::full({3}, 1.5, torch::kBFloat16);
        c.all_reduce_sum(b, "bf16");
        bad += !torch::allclose(b.to(torch::kFloat32), torch::full({3}, 4.5));
        auto flag = torch::tensor({r == 2}, torch::kBool);
        c.broadcast(flag, 2, "bool");
        bad += !flag.item<bool>();
        bad += c.bytes_sent() <= 0;
        return bad;
      },
      free_loopback_port());
}

TEST(Comm, SubGroupsFollowTheGrid) {
  run_ranks(
      4,
      [](Distributed& d) {
        // dp4 here (tp = pp = 1): the dp group is the world.
        auto t = torch::ones({1});
        d.dp->all_reduce_sum(t, "dp");
        return (t.item<float>() == 4.0f && d.tp->size() == 1 && d.pp->size() == 1) ? 0 : 1;
      },
      free_loopback_port());
}

TEST(Comm, DeadPeerFailsTheCollectiveByName) {
  run_ranks(
      2,
      [](Distributed& d) {
        // One collective both ranks finish: rank 0 is past the rendezvous and every
        // group's setup before rank 1 leaves, so what fails next is a collective.
        auto t = torch::ones({1 << 16});
        d.world->all_reduce_sum(t, "before");
        if (d.world->rank() == 1) ::_exit(0);  // leaves without a word
        try {
          for (int i = 0; i < 100; ++i) d.world->all_reduce_sum(t, "gradient bucket 0");
        } catch (const CommError& e) {
          const std::string m = e.what();
          return m.find("all_reduce (gradient bucket 0) on group world") != std::string::npos ? 0 : 2;
        }
        return 3;
      },
      free_loopback_port());
}

// The vocabulary-parallel loss: three ranks each hold a slice of the output weight (the
// last one a padding row, filled with values that would dominate any softmax they
// entered) and together give the whole vocabulary's loss and gradients, every sixth row
// uncounted.
TEST(Comm, VocabularyShardsOfTheLossEqualTheWholeVocabulary) {
  run_ranks(
      3,
      [](Distributed& d) {
        Comm& c = *d.world;
        const auto group = tensor_parallel_group(c);
        torch::manual_seed(9);  // the same inputs on every rank
        const int64_t n = 23, dim = 8, vocab = 53, local = padded_vocab(vocab, 3) / 3;
        const auto h0 = torch::randn({n, dim}, torch::kFloat64), w0 = torch::randn({vocab, dim}, torch::kFloat64);
        auto targets = torch::randint(0, vocab, {n}, torch::kInt64);
        // Uncounted rows (data.eod_mask_loss) take part in the rows' statistics and count
        // for nothing: cross_entropy's ignore_index.
        targets.index_put_({torch::indexing::Slice(0, n, 6)}, kUncountedTarget);
        auto hr = h0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
        const auto reference = torch::cross_entropy_loss(torch::mm(hr, wr.t()), targets);
        (reference * 3.0).backward();

        const int64_t first = c.rank() * local, valid = std::clamp<int64_t>(vocab - first, 0, local);
        auto w = torch::full({local, dim}, 100.0, torch::kFloat64);
        w.narrow(0, 0, valid).copy_(w0.narrow(0, first, valid));
        w.requires_grad_();
        auto h = h0.clone().requires_grad_();
        const auto loss = linear_cross_entropy(h, w, targets, VocabShard{group.get(), first, valid}, 5);
        (loss * 3.0).backward();
        int bad = 0;
        bad += std::abs(loss.item<double>() - reference.item<double>()) > 1e-12;
        auto grad_h = h.grad().clone();  // this rank's part: the ranks' parts sum to it
        c.all_reduce_sum(grad_h, "grad h");
        bad += !torch::allclose(grad_h, hr.grad(), 1e-10, 1e-12);
        bad += !torch::allclose(w.grad().narrow(0, 0, valid), wr.grad().narrow(0, first, valid), 1e-10, 1e-12);
        bad += !w.grad().narrow(0, valid, local - valid).eq(0).all().item<bool>();
        if (bad)
          std::fprintf(stderr, "rank %d: loss %.15g against %.15g\n", c.rank(), loss.item<double>(),
                       reference.item<double>());
        return bad;
      },
      free_loopback_port());
}

// The host tensor bytes the autograd graph behind `out` keeps for its backward: what
// releasing every node's saved tensors frees. Tensors held elsewhere too (the inputs,
// `out` itself) free nothing. Counted this way rather than as the growth of live bytes
// over a forward, which also sees the buffers of a collective that Gloo's worker thread
// lets go of a moment after the collective completes.
int64_t kept_by_graph(const torch::Tensor& out) {
  std::vector<torch::autograd::Node*> todo{out.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  const int64_t before = host_tensor_bytes();
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node).second) continue;
    node->release_variables();
    for (const auto& edge : node->next_edges()) todo.push_back(edge.function.get());
  }
  return before - host_tensor_bytes();
}

// Context parallelism's causal attention without masks: each of two ranks holds two of
// the four chunks of a sequence of 32 tokens and gets the rows and the gradients of its
// tokens that one attention over the whole sequence gives (grouped keys, fp64: the same
// sums in another order, within 1e-12). Its node keeps this rank's keys and values, not
// the gathered sequence's, which the masked path (context_attention through
// chunk_attention) keeps.
TEST(Comm, UnmaskedContextAttentionEqualsWholeSequenceAttentionKeepingOnlyItsOwnKeys) {
  run_ranks(
      2,
      [](Distributed& d) {
        count_host_tensor_memory();
        const ContextParallel cp{tensor_parallel_group(*d.world)};
        torch::manual_seed(5);  // the same sequence on every rank
        const int64_t b = 2, h = 4, kv = 2, t = 32, hd = 16;
        const double scale = 1 / std::sqrt(static_cast<double>(hd));
        const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
        const auto q0 = torch::randn({b, h, t, hd}, f64), g0 = torch::randn({b, h, t, hd}, f64);
        const auto k0 = torch::randn({b, kv, t, hd}, f64), v0 = torch::randn({b, kv, t, hd}, f64);
        auto qr = q0.clone().requires_grad_(), kr = k0.clone().requires_grad_(), vr = v0.clone().requires_grad_();
        const auto want = at::scaled_dot_product_attention(qr, kr, vr, {}, 0.0, true, scale, true);
        (want * g0).sum().backward();

        const ContextAttention context = context_attention_chunks(cp, t, 0, {}, {}, f64);
        if (!context.unmasked()) return 10;
        const auto pos = context.positions;
        const auto mine = [&](const torch::Tensor& x) { return x.index_select(2, pos); };
        const auto inputs = [&] {
          return std::vector<torch::Tensor>{mine(q0).requires_grad_(), mine(k0).requires_grad_(),
                                            mine(v0).requires_grad_()};
        };
        const int64_t local = t / 2, element = 8;
        const int64_t own_keys = 2 * b * kv * local * hd * element;
        const int64_t gathered = 2 * b * kv * t * hd * element;
        // Beside q and its output, the node keeps this rank's keys and values stacked and,
        // for each of the two chunks, the merged rows' log-sum-exp and each of its calls'.
        const int64_t lse = b * h * (local / 2) * element;
        int bad = 0;

        auto x = inputs();
        const auto out = unmasked_context_attention(x[0], x[1], x[2], context, scale);
        (out * mine(g0)).sum().backward();
        bad += !torch::allclose(out, mine(want), 1e-12, 1e-12);
        bad += !torch::allclose(x[0].grad(), mine(qr.grad()), 1e-12, 1e-12);
        bad += !torch::allclose(x[1].grad(), mine(kr.grad()), 1e-12, 1e-12);
        bad += !torch::allclose(x[2].grad(), mine(vr.grad()), 1e-12, 1e-12);
        x = inputs();
        const int64_t kept = kept_by_graph(unmasked_context_attention(x[0], x[1], x[2], context, scale));
        bad += kept > own_keys + 6 * lse;

        // The masked path's nodes keep the gathered keys and values: the count sees them.
        const auto masked = [&](const std::vector<torch::Tensor>& y) {
          return context_attention(y[0], y[1], y[2], context,
                                   [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor&) { return chunk_attention(q, k, v, scale); });
        };
        x = inputs();
        bad += !torch::allclose(masked(x), mine(want), 1e-12, 1e-12);
        const int64_t masked_kept = kept_by_graph(masked(inputs()));
        bad += masked_kept < gathered;
        if (bad)
          std::fprintf(stderr, "rank %d: %d failed; kept %lld bytes (own keys %lld), masked %lld\n", d.world->rank(),
                       bad, static_cast<long long>(kept), static_cast<long long>(own_keys),
                       static_cast<long long>(masked_kept));
        return bad;
      },
      free_loopback_port());
}

// The all-to-all form of context parallelism (DeepSpeed-Ulysses): each of two ranks holds
// the two chunks of a sequence of 32 tokens; the first exchange gives it the whole
// sequence's q, k and v of its share of the heads, exactly (moved, not computed); one
// attention over them with those heads' bias (a per-head additive mask, as ALiBi's) and
// the exchange back give the rows and gradients of its tokens that one attention over
// the whole sequence gives (fp64: the same sums, within 1e-12). With one key/value head
// both ranks read it, and its gradient is the sum of theirs.
TEST(Comm, AllToAllContextAttentionEqualsWholeSequenceAttention) {
  run_ranks(
      2,
      [](Distributed& d) {
        const ContextParallel cp{tensor_parallel_group(*d.world), ContextComm::AllToAll};
        const int rank = d.world->rank();
        const int64_t b = 2, h = 4, t = 32, hd = 8;
        const double scale = 1 / std::sqrt(static_cast<double>(hd));
        const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
        const auto pos = context_positions(t, rank, 2, torch::kCPU);
        const auto mine = [&](const torch::Tensor& x) { return x.index_select(2, pos); };
        int bad = 0;
        for (const int64_t kv : {2, 1}) {
          torch::manual_seed(6 + kv);  // the same sequence on every rank
          const auto q0 = torch::randn({b, h, t, hd}, f64), g0 = torch::randn({b, h, t, hd}, f64);
          const auto k0 = torch::randn({b, kv, t, hd}, f64), v0 = torch::randn({b, kv, t, hd}, f64);
          const auto future = torch::ones({t, t}, torch::kBool).triu(1);
          const auto bias = torch::randn({1, h, t, t}, f64).masked_fill(future, -INFINITY);
          auto qr = q0.clone().requires_grad_(), kr = k0.clone().requires_grad_(), vr = v0.clone().requires_grad_();
          const auto want = at::scaled_dot_product_attention(qr, kr, vr, bias, 0.0, false, scale, true);
          (want * g0).sum().backward();

          auto q = mine(q0).requires_grad_(), k = mine(k0).requires_grad_(), v = mine(v0).requires_grad_();
          const auto whole = sequence_of_heads(q, k, v, cp);
          const HeadShare sq = context_head_share(h, rank, 2), skv = context_head_share(kv, rank, 2);
          bad += !torch::equal(whole.q, q0.narrow(1, sq.first, sq.count));
          bad += !torch::equal(whole.k, k0.narrow(1, skv.first, skv.count));
          bad += !torch::equal(whole.v, v0.narrow(1, skv.first, skv.count));
          const auto attended =
              at::scaled_dot_product_attention(whole.q, whole.k, whole.v, bias.narrow(1, sq.first, sq.count), 0.0,
                                               false, scale, whole.k.size(1) != whole.q.size(1));
          const auto out = tokens_of_heads(attended, cp);
          (out * mine(g0)).sum().backward();
          bad += !torch::allclose(out, mine(want), 1e-12, 1e-12);
          bad += !torch::allclose(q.grad(), mine(qr.grad()), 1e-12, 1e-12);
          bad += !torch::allclose(k.grad(), mine(kr.grad()), 1e-12, 1e-12);
          bad += !torch::allclose(v.grad(), mine(vr.grad()), 1e-12, 1e-12);
          if (bad) {
            std::fprintf(stderr, "rank %d, %lld key/value heads: %d failed\n", rank, static_cast<long long>(kv), bad);
            return bad;
          }
        }
        return 0;
      },
      free_loopback_port());
}

TEST(Comm, AllToAllRowsMovesUnevenChunksEmptyOnesIncluded) {
  run_ranks(
      3,
      [](Distributed& d) {
        Comm& c = *d.world;
        const int r = c.rank(), n = c.size();
        // Rank r sends r + j rows of [2, 2] to rank j (none from 0 to 0), each row filled
        // with 100 r + j.
        std::vector<int64_t> send, recv;
        std::vector<torch::Tensor> chunks;
        for (int j = 0; j < n; ++j) {
          send.push_back(r + j);
          recv.push_back(j + r);
          chunks.push_back(torch::full({r + j, 2, 2}, 100.0 * r + j, torch::kFloat64));
        }
        const auto in = torch::cat(chunks);
        auto out = torch::empty({r * n + n * (n - 1) / 2, 2, 2}, torch::kFloat64);
        c.all_to_all_rows(in, out, send, recv, "test");
        std::vector<torch::Tensor> want;
        for (int i = 0; i < n; ++i) want.push_back(torch::full({i + r, 2, 2}, 100.0 * i + r, torch::kFloat64));
        int bad = !torch::equal(out, torch::cat(want));
        // A count that does not fit the tensors is refused, naming the operation.
        try {
          c.all_to_all_rows(in, out, {1, 1, 5}, recv, "wrong counts");  // 7 rows: no rank's input
          ++bad;
        } catch (const c10::Error& e) {
          bad += std::string(e.what()).find("wrong counts") == std::string::npos;
        }
        return bad;
      },
      free_loopback_port());
}

// Expert parallelism: two ranks, each holding 2 of a block's 4 experts and exchanging
// tokens, give each rank's tokens the output and input gradient of the whole layer, and
// each expert the gradient of both ranks' tokens.
TEST(Comm, ExpertParallelMixtureEqualsTheWholeLayerAndItsGradients) {
  run_ranks(
      2,
      [](Distributed& d) {
        const ModelConfig cfg = testing::tiny_moe();  // 4 experts, top 2
        const int rank = d.world->rank();
        Transformer whole(cfg);
        Transformer spread(cfg, TensorParallel{}, PipelineStage{}, ParameterStorage::Initialised,
                           ExpertParallel{tensor_parallel_group(*d.world)});
        for (auto* m : {&whole, &spread}) {
          (*m)->reset_parameters(3);
          (*m)->to(torch::kFloat64);
        }
        auto& a = *whole->blocks->ptr<BlockImpl>(1)->moe;
        auto& b = *spread->blocks->ptr<BlockImpl>(1)->moe;
        int bad = 0;
        bad += b.experts.size() != 2 || b.first_expert() != int64_t{2} * rank;
        bad += spread->named_parameters().find(
                   fmt::format("model.layers.1.mlp.experts.{}.up_proj.weight", 2 * (1 - rank))) != nullptr;
        torch::manual_seed(11 + rank);
        const auto x = torch::randn({2, 7, cfg.dim}, torch::kFloat64);
        const auto w = torch::randn({2, 7, cfg.dim}, torch::kFloat64);
        auto xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
        const auto ya = a.forward(xa, nullptr), yb = b.forward(xb, nullptr);
        (ya * w).sum().backward();
        (yb * w).sum().backward();
        // fp64 sums of at most 48 products of values below 10: rounding far under 1e-12.
        bad += !torch::allclose(yb, ya, 0, 1e-12);
        bad += !torch::allclose(xb.grad(), xa.grad(), 0, 1e-12);
        bad += !torch::allclose(b.gate->weight.grad(), a.gate->weight.grad(), 0, 1e-12);
        // The whole layer's expert gradients summed over both ranks' tokens (every rank
        // reduces all four experts', in one order).
        for (auto& expert : a.experts)
          for (auto* p : {&expert->gate, &expert->up, &expert->down})
            d.world->all_reduce_sum((*p)->weight.mutable_grad(), "the whole layer's expert gradient");
        for (size_t k = 0; k < b.experts.size(); ++k) {
          auto& mine = *b.experts[k];
          auto& both = *a.experts[static_cast<size_t>(b.first_expert()) + k];
          for (auto [got, want] : {std::pair{mine.gate, both.gate}, {mine.up, both.up}, {mine.down, both.down}})
            bad += !torch::allclose(got->weight.grad(), want->weight.grad(), 0, 1e-12);
        }
        if (bad) std::fprintf(stderr, "rank %d: %d failed\n", rank, bad);
        return bad;
      },
      free_loopback_port());
}

}  // namespace
}  // namespace tide
