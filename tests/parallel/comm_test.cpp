// Collectives across real processes: forked ranks meet through a TCPStore and talk
// over Gloo on loopback, as a job's workers do.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "../../engine/src/parallel/tensor_parallel_group.h"
#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/distributed.h"
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

}  // namespace
}  // namespace tide
