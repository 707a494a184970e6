// The gRPC request conversion (proto -> engine request) on arbitrary bytes parsed as an
// attnres.v1.GenerateRequest, then the engine's own sampling checks: every bad field must be
// an attnres::Error (INVALID_ARGUMENT), never a crash.
#include "attnres/v1/generate.pb.h"
#include "engine/core/error.h"
#include "engine/sample/sampling_params.h"
#include "fuzz_support.h"
#include "server/grpc/grpc_requests.h"

using namespace attnres;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)fuzz::qwen3_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::shared_ptr<const Tokenizer>& tokenizer = fuzz::qwen3_tokenizer();
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  try {
    const server::GrpcGenerateRequest parsed = server::to_engine_request(
        request, SamplingParams{}, *tokenizer, Vocabulary::all_rows(tokenizer->vocab_size()));
    parsed.engine.params.validate(Vocabulary::all_rows(tokenizer->vocab_size()));
  } catch (const Error&) {
  }
  return 0;
}
