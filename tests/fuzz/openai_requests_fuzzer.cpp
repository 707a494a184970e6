// The OpenAI request parsers (/v1/completions, /v1/chat/completions, /tokenize, /v1/responses) on
// arbitrary bodies, with the demo model's tokenizer and chat template: every refusal must be a 4xx
// ApiError or an attnres::Error, never a crash. The first byte picks the route.
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/model/loaded_model.h"
#include "engine/sched/engine_core.h"
#include "fuzz_support.h"
#include "server/common/metrics.h"
#include "server/common/server_state.h"
#include "server/http/api_error.h"
#include "server/http/http_message.h"
#include "server/http/openai_requests.h"
#include "server/http/responses_requests.h"
#include "server/http/routes.h"

using namespace attnres;

namespace {

// The parsers only read the model; nothing is ever run.
class NoForward : public ModelRunner {
 public:
  explicit NoForward(int vocab) : vocab_(vocab) {}
  int vocab_size() const override { return vocab_; }
  void execute(const StepBatch&, StepResult&) override { std::abort(); }

 private:
  int vocab_;
};

struct Fixture {
  LoadedModel model = load_builtin_model("demo");
  NoForward runner{model.config.vocab_size};
  EngineCore engine{make_config(), runner};
  server::Metrics metrics{"fuzz"};
  server::ServerState state{model, engine, metrics, options()};

  EngineConfig make_config() const {
    EngineConfig c;
    c.num_kv_blocks = 64;
    c.scheduler.max_model_len = 256;
    c.vocabulary = model.vocabulary();
    return c;
  }
  static server::ServeOptions options() {
    server::ServeOptions o;
    o.served_model_name = "fuzz";
    o.max_model_len = 256;
    return o;
  }
};

Fixture* the_fixture() {
  static Fixture* fixture = new Fixture();  // lives for the process, like a server's
  return fixture;
}

}  // namespace

// Loaded before fuzzing starts: libFuzzer times every input (-timeout), and under ASan on a
// busy machine loading takes longer than one input may.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)the_fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture* fixture = the_fixture();
  if (size < 1) return 0;
  const int route = data[0] % 4;
  const std::string body(fuzz::as_text(data + 1, size - 1));
  try {
    if (route == 2) {
      server::http::HttpRequest req;
      req.body = body;
      server::http::HttpResponse res;
      server::http::handle_tokenize(fixture->state, req, res);
      return 0;
    }
    const auto json = nlohmann::ordered_json::parse(body, nullptr, false);
    if (json.is_discarded()) return 0;
    if (route == 0) {
      (void)server::http::parse_completion_request(json, fixture->state);
    } else if (route == 3) {
      (void)server::http::parse_responses_request(json, fixture->state);
    } else {
      (void)server::http::parse_chat_request(json, fixture->state);
    }
  } catch (const server::http::ApiError& e) {
    if (e.status() >= 500) std::abort();  // a parser must blame the request, not itself
  } catch (const Error&) {
  }
  return 0;
}
