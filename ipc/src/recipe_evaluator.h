// Evaluates recipes on a thread of its own. A recipe may run for its whole budget
// (seconds of Lua); on the controller's loop that would hold every other request, a
// stop included, behind it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/scripting/recipe.h"

namespace tide::ipc {

// A recipe, or why it did not load; `answer`, what the post's follow-up made of it.
struct EvaluatedRecipe {
  std::shared_ptr<Recipe> recipe;
  std::string error;
  nlohmann::json answer;
};

class RecipeEvaluator {
 public:
  // `on_done` is called on the evaluator's thread after each job: the controller's loop
  // takes the result at once rather than at its next tick.
  explicit RecipeEvaluator(std::function<void()> on_done = {});
  // Evaluates what was posted, then joins: a recipe is bounded by its budget.
  ~RecipeEvaluator();
  RecipeEvaluator(const RecipeEvaluator&) = delete;
  RecipeEvaluator& operator=(const RecipeEvaluator&) = delete;

  // Runs `load` (Recipe::load_string or load_file with their limits), in the order posted,
  // then `follow_up` on the recipe, if given (a plan: work that must not hold the
  // controller's loop either); an exception of either becomes `error`.
  using FollowUp = std::function<nlohmann::json(const Recipe&)>;
  std::shared_future<EvaluatedRecipe> post(std::function<Recipe()> load, FollowUp follow_up = {});

 private:
  void serve();

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<EvaluatedRecipe()>> jobs_;
  std::function<void()> on_done_;
  bool ending_ = false;
  std::thread thread_;
};

// Whether `f` holds its value now.
template <typename T>
bool is_ready(const std::shared_future<T>& f) {
  return f.valid() && f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace tide::ipc
