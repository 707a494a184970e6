// The real tokenizer configs shipped as test data: they load, and their templates render
// known prompts. (Full byte-for-byte parity with jinja2 is
// tests/python/test_chat_template_parity.py.)
#include <thread>

#include "tests/cpp/engine/jinja/test_util.h"

namespace attnres::testing {
namespace {

using nlohmann::json;

std::string data(const std::string& rel) { return std::string(ATTNRES_TOKENIZER_DATA) + "/" + rel; }

TEST(ChatTemplateReal, LoadsConfigs) {
  TokenizerConfig qwen = TokenizerConfig::load(data("qwen3/tokenizer_config.json"));
  EXPECT_TRUE(qwen.chat_template.has_value());
  EXPECT_EQ(qwen.bos_token, "");
  EXPECT_EQ(qwen.eos_token, "<|im_end|>");
  EXPECT_EQ(qwen.add_bos_token, std::optional<bool>(false));
  EXPECT_EQ(qwen.model_max_length, 131072);
  TokenizerConfig gpt2 = TokenizerConfig::load(data("gpt2/tokenizer_config.json"));
  EXPECT_FALSE(gpt2.chat_template.has_value());
}

TEST(ChatTemplateReal, ListFormAndAddedTokens) {
  auto cfg = TokenizerConfig::from_json(json::parse(R"({
    "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}],
    "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": null,
    "model_max_length": 1000000000000000019884624838656})"),
                                        "inline");
  EXPECT_EQ(cfg.chat_template.value_or(""), "D");
  EXPECT_EQ(cfg.named_templates.at("tool_use"), "T");
  EXPECT_EQ(cfg.bos_token, "<s>");
  EXPECT_EQ(cfg.eos_token, "");
  EXPECT_EQ(cfg.model_max_length, 0);
}

TEST(ChatTemplateReal, Qwen3) {
  TokenizerConfig cfg = TokenizerConfig::load(data("qwen3/tokenizer_config.json"));
  ChatTemplate t = ChatTemplate::parse(*cfg.chat_template);
  json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(t.apply(msgs, true, cfg), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply(msgs, true, cfg, nullptr, {{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplateReal, Llama32WithDateString) {
  TokenizerConfig cfg = TokenizerConfig::load(data("llama3.2/tokenizer_config.json"));
  ChatTemplate t = ChatTemplate::parse(*cfg.chat_template);
  json msgs = json::array({{{"role", "user"}, {"content", " Hi "}}});
  EXPECT_EQ(t.apply(msgs, true, cfg, nullptr, {{"date_string", "01 Jan 2025"}}),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 01 Jan 2025\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateReal, TinyLlamaAndConcurrentRenders) {
  TokenizerConfig cfg = TokenizerConfig::load(data("tinyllama/tokenizer_config.json"));
  const ChatTemplate t = ChatTemplate::parse(*cfg.chat_template);
  json msgs =
      json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}});
  const std::string expected = "<|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\n";
  EXPECT_EQ(t.apply(msgs, true, cfg), expected);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i, copy = t] {
      for (int k = 0; k < 50; ++k) ok[i] += copy.apply(msgs, true, cfg) == expected;
    });
  }
  for (auto& th : threads) th.join();
  for (int n : ok) EXPECT_EQ(n, 50);
}

}  // namespace
}  // namespace attnres::testing
