// The HTTP server in process (server/http, Boost.Beast) over a real engine thread with a fake
// forward: whole and streamed completions, many streams at once, pipelining, and a client that
// hangs up mid-stream being cancelled. Built for the ThreadSanitizer run too
// (tests/sanitizers/run.sh tsan): the connection strands, the request workers and the engine
// thread's wake-ups all run here, instrumented (Boost.Asio is header-only).
#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/model/loaded_model.h"
#include "engine_test_util.h"

namespace attnres::testing {
namespace {

using Json = nlohmann::json;

struct Server {
  Server() {
    // Each logits row takes a moment, so a stream is still running when its client leaves.
    runner.set_row_editor([](const std::vector<int32_t>&, std::span<float>) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
    engine.start();
    http.start();
  }
  ~Server() {
    http.stop();
    engine.shutdown(std::chrono::seconds(5));
  }
  static server::ServeOptions options() {
    server::ServeOptions o;
    o.host = "127.0.0.1";
    o.http_port = 0;
    o.served_model_name = "test";
    o.max_model_len = 128;
    return o;
  }

  LoadedModel model = load_builtin_model("demo");  // the tokenizer the routes decode with
  FakeRunner runner{256, 4};
  EngineCore engine{engine_config({.num_blocks = 256, .max_num_seqs = 32}), runner};
  server::Metrics metrics{"test"};
  server::ServerState state{model, engine, metrics, options()};
  server::HttpServer http{state};
};

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

void send_all(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
}

std::string read_until_closed(int fd) {
  std::string data;
  char buffer[4096];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    data.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

std::string post(const std::string& path, const Json& body, bool close_after = true) {
  const std::string text = body.dump();
  return "POST " + path + " HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
         (close_after ? "Connection: close\r\n" : "") +
         "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
}

Json completion(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  return Json{{"prompt", prompt},   {"max_tokens", max_tokens}, {"temperature", 0},
              {"ignore_eos", true}, {"stream", stream},         {"return_token_ids", true}};
}

// The body of a chunked response, de-chunked.
std::string dechunk(const std::string& body) {
  std::string out;
  size_t at = 0;
  for (;;) {
    const size_t line_end = body.find("\r\n", at);
    if (line_end == std::string::npos) break;
    const size_t size = std::stoul(body.substr(at, line_end - at), nullptr, 16);
    if (size == 0) break;
    out += body.substr(line_end + 2, size);
    at = line_end + 2 + size + 2;
  }
  return out;
}

// The token ids of a streamed completion, and whether it ended with [DONE].
std::vector<int32_t> streamed_ids(const std::string& response, bool* done) {
  const std::string body = dechunk(response.substr(response.find("\r\n\r\n") + 4));
  std::vector<int32_t> ids;
  *done = false;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string payload = body.substr(at + 6, end - at - 6);
    at = end;
    if (payload == "[DONE]") {
      *done = true;
      continue;
    }
    const Json event = Json::parse(payload);
    for (int32_t id : event["choices"][0]["token_ids"]) ids.push_back(id);
  }
  return ids;
}

TEST(HttpServer, AWholeCompletion) {
  Server s;
  const int fd = connect_to(s.http.port());
  send_all(fd, post("/v1/completions", completion({1, 2, 3}, 6, false)));
  const std::string response = read_until_closed(fd);
  ASSERT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  const Json body = Json::parse(response.substr(response.find("\r\n\r\n") + 4));
  EXPECT_EQ(body["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            reference_tokens({1, 2, 3}, 6));
  EXPECT_EQ(body["usage"]["completion_tokens"], 6);
}

TEST(HttpServer, ManyStreamsAtOnceEachGetTheirOwnTokens) {
  Server s;
  std::vector<std::thread> clients;
  std::vector<std::string> responses(24);
  for (size_t i = 0; i < responses.size(); ++i) {
    clients.emplace_back([&, i] {
      const int fd = connect_to(s.http.port());
      send_all(fd, post("/v1/completions", completion({static_cast<int32_t>(i + 1), 7},
                                                      10 + static_cast<int>(i % 5), true)));
      responses[i] = read_until_closed(fd);
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < responses.size(); ++i) {
    ASSERT_EQ(responses[i].rfind("HTTP/1.1 200", 0), 0u) << responses[i];
    bool done = false;
    EXPECT_EQ(streamed_ids(responses[i], &done),
              reference_tokens({static_cast<int32_t>(i + 1), 7}, 10 + static_cast<int>(i % 5)));
    EXPECT_TRUE(done) << "stream " << i;
  }
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  Server s;
  const int fd = connect_to(s.http.port());
  send_all(fd, post("/v1/completions", completion({4, 5}, 3, false), false) +
                   "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  const std::string response = read_until_closed(fd);
  const size_t second = response.find("HTTP/1.1 200", 1);
  ASSERT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  ASSERT_NE(second, std::string::npos) << response;
  EXPECT_NE(response.substr(0, second).find("\"completion_tokens\":3"), std::string::npos);
}

TEST(HttpServer, AClientThatHangsUpMidStreamIsCancelled) {
  Server s;
  const int fd = connect_to(s.http.port());
  send_all(fd, post("/v1/completions", completion({9, 9, 9}, 120, true)));
  char buffer[256];
  ASSERT_GT(recv(fd, buffer, sizeof(buffer), 0), 0);  // the stream started
  close(fd);
  // The engine aborts it within a step of the server noticing; it would run 120 tokens
  // (about 240 ms of rows at the least: ample time to notice the hang-up on a busy machine)
  // otherwise.
  for (int i = 0; i < 500 && s.engine.stats().finished_abort == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.engine.stats().finished_abort, 1);
  EXPECT_EQ(s.engine.stats().num_running, 0);
}

}  // namespace
}  // namespace attnres::testing
