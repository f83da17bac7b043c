#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "test_data.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/model/linear_cross_entropy.h"

namespace tide {
namespace {

TEST(BatchLoader, TargetsAreTokensShiftedByOne) {
  const TokenDataset ds(testing::small_dataset());
  const auto& split = ds.split("train");
  const Batch b = make_batch(SampleSource(split, 5), 0, 4, 32);
  ASSERT_EQ(b.tokens.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_TRUE(torch::equal(b.tokens.narrow(1, 1, 31), b.targets.narrow(1, 0, 31)));
  // Each row is a real window of the split.
  const int64_t start = window_start(5, 0, split.size(), 32);
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(b.tokens[0][i].item<int64_t>(), split.at(start + i));
}

// A document ends with its end-of-text token, so a token's document within its row is
// the count of end-of-text tokens before it there: read from the token ids, independent
// of the .idx offsets the loader reads.
void expect_documents_follow_end_of_text(const Batch& b, int64_t eos, const std::string& what) {
  ASSERT_TRUE(b.documents.defined()) << what;
  ASSERT_EQ(b.documents.sizes(), b.tokens.sizes()) << what;
  ASSERT_EQ(b.documents.scalar_type(), torch::kInt32) << what;
  int64_t boundaries = 0;
  for (int64_t r = 0; r < b.tokens.size(0); ++r) {
    int32_t ended = 0;
    for (int64_t p = 0; p < b.tokens.size(1); ++p) {
      ASSERT_EQ(b.documents[r][p].item<int32_t>(), ended) << what << ", row " << r << ", position " << p;
      if (b.tokens[r][p].item<int64_t>() == eos) ++ended;
    }
    boundaries += ended;
  }
  EXPECT_GT(boundaries, 0) << what << ": no row crosses a document's end, nothing was tested";
}

TEST(BatchLoader, EachTokensDocumentIsCountedFromItsRowsFirst) {
  const TokenDataset ds(testing::small_dataset());
  const auto eos = ds.meta().at("eos_id").get<int64_t>();
  const auto& train = ds.split("train");
  const BatchContents documents{/*documents=*/true, /*uncounted_document_ends=*/false};
  expect_documents_follow_end_of_text(make_batch(SampleSource(train, 3), 0, 16, 200, documents), eos, "training batch");
  BatchLoader loader(SampleSource(train, 3), 16, 200, 0, 2, 0, 0, /*pin=*/false, documents);
  const Batch first = loader.next();
  EXPECT_TRUE(torch::equal(first.documents, make_batch(SampleSource(train, 3), 0, 16, 200, documents).documents));
  expect_documents_follow_end_of_text(make_eval_batch(ds.split("val"), 0, 1, 8, 200, documents), eos,
                                      "validation batch");
  // Not asked for, not made.
  EXPECT_FALSE(make_batch(SampleSource(train, 3), 0, 2, 16).documents.defined());
}

// data.eod_mask_loss: exactly the targets whose input is a document's end-of-text token
// (read from the ids, independent of the .idx offsets the loader reads) are uncounted;
// the tokens, and every other target, are the plain batch's. From the loader's thread,
// for validation, and beside documents apart.
void expect_uncounted_after_end_of_text(const Batch& masked, const Batch& plain, int64_t eos, const std::string& what) {
  ASSERT_TRUE(torch::equal(masked.tokens, plain.tokens)) << what;
  const auto ends = plain.tokens.eq(eos);
  EXPECT_GT(ends.sum().item<int64_t>(), 0) << what << ": no document ends in the batch, nothing was tested";
  EXPECT_TRUE(torch::equal(masked.targets, plain.targets.masked_fill(ends, kUncountedTarget))) << what;
}

TEST(BatchLoader, ADocumentsEndDoesNotCountItsPredictionOfTheNextDocument) {
  const TokenDataset ds(testing::small_dataset());
  const auto eos = ds.meta().at("eos_id").get<int64_t>();
  const auto& train = ds.split("train");
  const BatchContents masked{/*documents=*/false, /*uncounted_document_ends=*/true};
  const Batch plain = make_batch(SampleSource(train, 3), 0, 16, 200);
  expect_uncounted_after_end_of_text(make_batch(SampleSource(train, 3), 0, 16, 200, masked), plain, eos,
                                     "training batch");
  BatchLoader loader(SampleSource(train, 3), 16, 200, 0, 2, 0, 0, /*pin=*/false, masked);
  expect_uncounted_after_end_of_text(loader.next(), plain, eos, "the loader's batch");
  expect_uncounted_after_end_of_text(make_eval_batch(ds.split("val"), 0, 1, 8, 200, masked),
                                     make_eval_batch(ds.split("val"), 0, 1, 8, 200), eos, "validation batch");
  const Batch both = make_batch(SampleSource(train, 3), 0, 16, 200, {true, true});
  expect_uncounted_after_end_of_text(both, plain, eos, "with documents apart");
  expect_documents_follow_end_of_text(both, eos, "with uncounted ends");
}

// data.loss_mask on a prompt-completion dataset (test_data.h: prompts of capitals and
// spaces, completions with none): a target is uncounted exactly where its token is a
// prompt's, read from the token ids, not from the mask the loader reads; in training
// batches and validation ones alike.
void expect_prompts_uncounted(const Batch& b, const std::string& what) {
  int64_t uncounted = 0, counted = 0;
  for (int64_t r = 0; r < b.targets.size(0); ++r)
    for (int64_t p = 0; p < b.targets.size(1); ++p) {
      const int64_t target = b.targets[r][p].item<int64_t>();
      const bool left_out = target == kUncountedTarget;
      // An uncounted target's token is the next input (none for the row's last).
      if (left_out && p + 1 == b.tokens.size(1)) continue;
      const int64_t token = left_out ? b.tokens[r][p + 1].item<int64_t>() : target;
      EXPECT_EQ(left_out, token >= 'A' && token <= 'Z') << what << ", row " << r << ", position " << p;
      (left_out ? uncounted : counted) += 1;
    }
  EXPECT_GT(uncounted, 0) << what << ": no prompt was tested";
  EXPECT_GT(counted, 0) << what << ": no completion was tested";
}

TEST(BatchLoader, ALossMaskLeavesOutThePromptsTargetsAndDocumentWindowsStartAtExamples) {
  const TokenDataset ds(testing::prompt_completion_dataset());
  const auto eos = ds.meta().at("eos_id").get<int64_t>();
  const auto& train = ds.split("train");
  BatchContents masked;
  masked.loss_mask = true;
  expect_prompts_uncounted(make_batch(SampleSource(train, 3, true), 0, 16, 64, masked), "training batch");
  expect_prompts_uncounted(make_eval_batch(ds.split("val"), 0, 1, 4, 64, masked), "validation batch");
  // Validation's windows at examples too, with document_windows: each row's first token a
  // prompt's first.
  masked.document_windows = true;
  const Batch val = make_eval_batch(ds.split("val"), 0, 1, 4, 64, masked);
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(val.tokens[r][0].item<int64_t>(), 'A') << "validation row " << r;
  EXPECT_FALSE(torch::equal(val.tokens[0], val.tokens[3])) << "the rows are one window";
  // Without the mask every target counts.
  EXPECT_FALSE(make_batch(SampleSource(train, 3), 0, 16, 64).targets.eq(kUncountedTarget).any().item<bool>());
  // Document windows: every one starts at an example's first token (the split's first,
  // or one after an end-of-text), a prompt's first byte; many examples are drawn, and
  // each window fits.
  const SampleSource windows(train, 3, /*document_windows=*/true);
  std::set<int64_t> starts;
  for (int64_t i = 0; i < 400; ++i) {
    const auto [split, start] = windows.window(i, 64);
    ASSERT_LE(start + 65, split->size());
    EXPECT_TRUE(start == 0 || split->at(start - 1) == eos) << "sample " << i << " starts at " << start;
    EXPECT_EQ(split->at(start), 'A') << "sample " << i;
    starts.insert(start);
  }
  EXPECT_GT(starts.size(), 30u);
  // The same samples for the same seed; other windows without the option.
  EXPECT_EQ(windows.window(7, 64), SampleSource(train, 3, true).window(7, 64));
  EXPECT_NE(windows.window(7, 64), SampleSource(train, 3).window(7, 64));
}

TEST(BatchLoader, DeterministicAndResumableAtAnyCursor) {
  const TokenDataset ds(testing::small_dataset());
  const auto& split = ds.split("train");
  std::vector<Batch> straight;
  {
    BatchLoader l(SampleSource(split, 9), 4, 16, 0, 3);
    for (int i = 0; i < 6; ++i) straight.push_back(l.next());
    EXPECT_EQ(l.cursor(), 24);
  }
  BatchLoader resumed(SampleSource(split, 9), 4, 16, /*cursor=*/12, 0);  // after three batches, no prefetch
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(torch::equal(resumed.next().tokens, straight[i].tokens)) << i;
  BatchLoader other_seed(SampleSource(split, 10), 4, 16, 0, 2);
  EXPECT_FALSE(torch::equal(other_seed.next().tokens, straight[0].tokens));
}

TEST(SampleSource, ABlendDrawsEachSplitItsShareOfEveryStretchOfSamples) {
  const TokenDataset ds(testing::small_dataset());
  const TokenSplit &train = ds.split("train"), &val = ds.split("val");
  // A split may appear twice: the draw picks a position in the blend, not a split.
  const std::vector<double> weights = {5, 3, 2};
  const SampleSource blend({&train, &val, &train}, weights, 42);
  // The draws are the Kronecker sequence of the golden ratio, whose partial quotients are
  // all 1: any n of them fall in an interval of [0, 1) within n * D_n of its length's
  // share, n * D_n <= 3 + (1 / log(golden ratio) + 1 / log 2) log n (Kuipers and
  // Niederreiter, Uniform Distribution of Sequences, ch. 2, thm 3.4); one more for the
  // interval's ends rounded to 2^-64.
  const double golden = (1 + std::sqrt(5.0)) / 2;
  for (const int64_t first : {int64_t{0}, int64_t{123456789}, int64_t{1} << 40}) {
    const int64_t n = 20000;
    std::vector<int64_t> count(3, 0);
    for (int64_t i = first; i < first + n; ++i) ++count[blend.split_of(i)];
    const double bound = 4 + (1 / std::log(golden) + 1 / std::log(2.0)) * std::log(static_cast<double>(n));
    for (size_t d = 0; d < 3; ++d)
      EXPECT_LE(std::abs(static_cast<double>(count[d]) - static_cast<double>(n) * weights[d] / 10), bound)
          << "split " << d << " from sample " << first << ": " << count[d] << " of " << n;
  }
  // Each row is a window of the split its sample was drawn from.
  const Batch b = make_batch(blend, 1000, 16, 24);
  for (int64_t r = 0; r < 16; ++r) {
    const auto [split, start] = blend.window(1000 + r, 24);
    ASSERT_LE(start + 25, split->size());
    for (int64_t t = 0; t < 24; ++t) ASSERT_EQ(b.tokens[r][t].item<int64_t>(), split->at(start + t)) << r;
  }
  EXPECT_THROW(SampleSource({&train, &val}, {1.0, 0.0}, 1), std::invalid_argument);
}

TEST(BatchLoader, ABlendResumesAtAnyCursor) {
  const TokenDataset ds(testing::small_dataset());
  const SampleSource blend({&ds.split("train"), &ds.split("val")}, {3.0, 1.0}, 9);
  std::vector<Batch> straight;
  {
    BatchLoader l(blend, 4, 16, 0, 3);
    for (int i = 0; i < 6; ++i) straight.push_back(l.next());
  }
  BatchLoader resumed(blend, 4, 16, /*cursor=*/12, 0);
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(torch::equal(resumed.next().tokens, straight[i].tokens)) << i;
}

TEST(BatchLoader, RefusesSplitsShorterThanAWindow) {
  const TokenDataset ds(testing::small_dataset());
  EXPECT_THROW(BatchLoader(SampleSource(ds.split("val"), 1), 1, ds.split("val").size(), 0, 0), std::runtime_error);
}

}  // namespace
}  // namespace tide
