#include "recipe_evaluator.h"

namespace tide::ipc {

RecipeEvaluator::RecipeEvaluator(std::function<void()> on_done)
    : on_done_(std::move(on_done)), thread_([this] { serve(); }) {}

RecipeEvaluator::~RecipeEvaluator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ending_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::shared_future<EvaluatedRecipe> RecipeEvaluator::post(std::function<Recipe()> load, FollowUp follow_up) {
  std::packaged_task<EvaluatedRecipe()> job([load = std::move(load), follow_up = std::move(follow_up)] {
    EvaluatedRecipe out;
    try {
      out.recipe = std::make_shared<Recipe>(load());
      if (follow_up) out.answer = follow_up(*out.recipe);
    } catch (const std::exception& e) {
      out.error = e.what();
    }
    return out;
  });
  std::shared_future<EvaluatedRecipe> result = job.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  wake_.notify_one();
  return result;
}

void RecipeEvaluator::serve() {
  while (true) {
    std::packaged_task<EvaluatedRecipe()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return ending_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // ending, and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
    if (on_done_) on_done_();
  }
}

}  // namespace tide::ipc
