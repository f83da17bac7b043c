#include <cmath>
#include <iostream>
#include <memory>

#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include "cli_common.h"
#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/data/tokenizer.h"
#include "tide/engine/data/utf8_stream.h"
#include "tide/engine/train/evaluate.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/runtime.h"

namespace tide::cli {
namespace {

std::unique_ptr<Tokenizer> tokenizer_for(const LoadedModel& m, const std::string& explicit_path,
                                         const std::string& model_path) {
  const std::string path = explicit_path.empty() ? m.tokenizer_path : explicit_path;
  if (path.empty())
    throw std::runtime_error("no tokenizer.json or tokenizer.model beside '" + model_path + "'; pass --tokenizer");
  return load_tokenizer(path);
}

// The model on the device asked for: "cpu" (where it loads) or "cuda" (GPU 0 of those
// visible; CUDA_VISIBLE_DEVICES picks another).
void place(LoadedModel& m, const std::string& device) {
  if (device != "cuda") return;
  if (!torch::cuda::is_available())
    throw std::runtime_error("--device cuda: no CUDA device is visible, or this LibTorch was built without CUDA");
  m.model->to(torch::Device(torch::kCUDA, 0));
}

// The chat template of a model: the one named, else the one written beside its tokenizer
// (chat_template.jinja, which tide writes for a chat dataset and runs and exports carry).
ChatTemplate chat_template_for(const std::string& named, const std::string& tokenizer_path) {
  if (!named.empty()) return chat_template_named(named);
  const auto jinja = chat_template_beside(tokenizer_path);
  if (!jinja)
    throw std::runtime_error("--chat: no " + std::string(kChatTemplateFile) + " beside the tokenizer '" +
                             tokenizer_path + "'; name one with --chat-template (llama3, chatml, gemma)");
  const auto found = chat_template_of_jinja(*jinja);
  if (!found)
    throw std::runtime_error("--chat: the " + std::string(kChatTemplateFile) + " beside '" + tokenizer_path +
                             "' is none of tide's chat templates (a model's own Jinja); name the format it follows "
                             "with --chat-template (llama3, chatml, gemma)");
  return *found;
}

CLI::Option* add_device_option(CLI::App* cmd, std::string& device) {
  return cmd->add_option("--device", device, "Where the model computes: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
}

}  // namespace

void add_generate_commands(CLI::App& app) {
  struct GenOptions {
    std::string model, prompt, tokenizer, device = "cpu";
    std::string chat, system, chat_template;
    SampleOptions sample;
    int64_t threads = 0;
  };
  auto g = std::make_shared<GenOptions>();
  auto* gen = app.add_subcommand("generate", "Sample text from a trained model");
  gen->add_option("model", g->model, "Run directory, weights file or Hugging Face directory")->required();
  auto* prompt = gen->add_option("-p,--prompt", g->prompt, "Text to continue");
  auto* chat = gen->add_option("--chat", g->chat,
                               "A user's message: the model answers it as the assistant, in its chat template, "
                               "and stops at the end of its turn (prints the answer only)");
  chat->excludes(prompt);
  gen->add_option("--system", g->system, "With --chat: a system message before the user's")->needs(chat);
  gen->add_option("--chat-template", g->chat_template,
                  "With --chat: llama3, chatml or gemma (default: the chat_template.jinja tide wrote beside the "
                  "model's tokenizer)")
      ->check(CLI::IsMember(chat_template_names()))
      ->needs(chat);
  gen->add_option("-n,--max-tokens", g->sample.max_new_tokens, "Tokens to generate")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  gen->add_option("-t,--temperature", g->sample.temperature, "Sampling temperature; 0 is greedy")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  gen->add_option("--top-k", g->sample.top_k, "Keep the k most likely tokens; 0: all")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  gen->add_option("--top-p", g->sample.top_p, "Nucleus sampling mass; 1: off")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  gen->add_option("--seed", g->sample.seed, "Sampling seed")->capture_default_str();
  gen->add_option("--tokenizer", g->tokenizer, "tokenizer.json or tokenizer.model (default: the one beside the model)");
  gen->add_option("--threads", g->threads, "Intra-op threads; 0: all cores")->check(CLI::Range(0, 1024));
  add_device_option(gen, g->device);
  gen->callback([g] {
    configure_threads(g->threads);
    LoadedModel m = load_model(g->model);
    place(m, g->device);
    const auto tok = tokenizer_for(m, g->tokenizer, g->model);
    SampleOptions opt = g->sample;
    opt.stop_id = tok->eos_id();
    std::string prompt_text = g->prompt;
    if (!g->chat.empty()) {
      // The conversation so far as the template writes it, then the assistant's header;
      // the reply ends at the template's end-of-turn token.
      const std::string tokenizer_path = g->tokenizer.empty() ? m.tokenizer_path : g->tokenizer;
      const ChatTemplate t = chat_template_for(g->chat_template, tokenizer_path);
      check_chat_tokens(t, *tok, tokenizer_path);
      Conversation c{"--chat", {}, {}};
      if (!g->system.empty()) c.messages.push_back({ChatRole::kSystem, g->system, {}});
      c.messages.push_back({ChatRole::kUser, g->chat, {}});
      prompt_text.clear();
      for (const auto& span : render_conversation(t, c)) prompt_text += span.text;
      prompt_text += chat_generation_prompt(t);
      opt.end_of_turn_id = tok->encode(chat_end_of_turn(t)).at(0);
    } else {
      std::cout << g->prompt << std::flush;
    }
    // Valid UTF-8 out, whatever bytes the model picks (text=True readers need it).
    Utf8Stream text;
    sample(m.model, tok->encode(prompt_text), opt, [&](int32_t id) {
      if (id != opt.stop_id && id != opt.end_of_turn_id) std::cout << text.push(tok->decode_one(id)) << std::flush;
    });
    std::cout << text.finish() << std::endl;
  });

  struct EvalOptions {
    std::string model, data, tokenizer, device = "cpu";
    int64_t seq_len = 0, batches = 16, micro_batch = 4, threads = 0;
    BatchContents contents;
  };
  auto e = std::make_shared<EvalOptions>();
  auto* ev = app.add_subcommand("eval", "Loss and perplexity of a model on a dataset's validation split");
  ev->add_option("model", e->model, "Run directory, weights file or Hugging Face directory")->required();
  ev->add_option("--data", e->data, "Dataset directory from `tide data prepare`")->required();
  ev->add_option("--seq-len", e->seq_len, "Tokens per sequence (default: min(512, model.max_seq_len))")
      ->check(CLI::Range(1, 1 << 24));
  ev->add_option("--batches", e->batches, "Batches to average")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  ev->add_option("--micro-batch", e->micro_batch, "Sequences per batch")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  ev->add_option("--threads", e->threads, "Intra-op threads; 0: all cores")->check(CLI::Range(0, 1024));
  ev->add_flag("--document-attention", e->contents.documents,
               "Attend only within each document, as a run with data.document_attention = true trains");
  ev->add_flag("--eod-mask-loss", e->contents.uncounted_document_ends,
               "Leave out each document's last token predicting the next document's first, as a run with "
               "data.eod_mask_loss = true measures it");
  ev->add_flag("--loss-mask", e->contents.loss_mask,
               "Count only the targets the dataset's loss mask marks (a prompt-completion dataset's completions, a "
               "chat dataset's assistant turns), "
               "as a run with data.loss_mask = true measures it");
  ev->add_flag("--document-windows", e->contents.document_windows,
               "Start each window at a document's first token, as a run with data.document_windows = true "
               "validates");
  add_device_option(ev, e->device);
  ev->callback([e] {
    configure_threads(e->threads);
    LoadedModel m = load_model(e->model);
    place(m, e->device);
    const TokenDataset data(e->data);
    if (e->contents.loss_mask && !data.has_loss_mask())
      throw std::runtime_error(
          "--loss-mask: dataset '" + e->data +
          "' has no loss mask (prepare it with `tide data prepare --format prompt-completion` or `--format messages`)");
    if (data.vocab_size() > m.model->config().vocab_size)
      throw std::runtime_error("dataset '" + e->data + "' has " + std::to_string(data.vocab_size()) +
                               " ids, the model only " + std::to_string(m.model->config().vocab_size));
    const int64_t seq = e->seq_len > 0 ? e->seq_len : std::min<int64_t>(512, m.model->config().max_seq_len);
    const double loss = evaluate_loss(m.model, data.split("val"), seq, e->micro_batch, e->batches, e->contents);
    std::cout << "{\"loss\": " << loss << ", \"perplexity\": " << std::exp(loss)
              << ", \"unigram_baseline\": " << unigram_entropy(data.split("val")) << "}" << std::endl;
  });
}

}  // namespace tide::cli
