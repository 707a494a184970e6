// Client-side conversions between the plain values of types.h and the attnres.v1 messages,
// and the assembly of a Generate stream into per-choice results. Pure functions over
// messages (no channel, no threads), so every rule of the stream is unit-tested without a
// server: chunks of a choice come before its one GenerateComplete, every choice of n completes
// exactly once, and the completion's ids and text are the choice's whole output.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnres/v1/generate.pb.h"
#include "clients/cpp/types.h"

namespace attnres::client {

v1::GenerateRequest to_proto(const GenerateOptions& options);

std::vector<TokenLogprob> from_proto(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs);
ModelInfo from_proto(const v1::GetModelInfoResponse& info);

// Reads one Generate call's responses, in order, into a GenerateResult. A stream that breaks
// the protocol (a chunk after its choice completed, a choice completing twice or never, an
// index outside [0, n)) is a ClientError with code INTERNAL naming what went wrong.
class ResultAssembler {
 public:
  // n: the choices asked for (0 counts as 1, as on the server).
  explicit ResultAssembler(int n);

  // Takes the next response; returns it as a StreamChunk when it is a chunk.
  std::optional<StreamChunk> add(const v1::GenerateResponse& response);

  // Whether every choice has completed.
  bool complete() const;

  // The result, once the stream ended with status OK. Throws when a choice never completed.
  GenerateResult result() const;

 private:
  struct ChoiceState {
    std::vector<TokenLogprob> streamed_logprobs;
    std::optional<Choice> done;
  };
  ChoiceState& choice_at(uint32_t index, const char* what);

  std::string request_id_;
  std::vector<ChoiceState> choices_;
};

}  // namespace attnres::client
