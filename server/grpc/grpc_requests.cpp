#include "server/grpc/grpc_requests.h"

#include "server/common/token_ids.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "engine/core/error.h"

namespace attnres::server {

std::optional<OutputConstraint> to_output_constraint(const v1::SamplingParams& proto) {
  OutputConstraint c;
  switch (proto.constraint_case()) {
    case v1::SamplingParams::kJsonSchema:
      c.kind = ConstraintKind::JsonSchema;
      c.spec = proto.json_schema();
      c.field = "json_schema";
      break;
    case v1::SamplingParams::kJsonObject:
      if (!proto.json_object()) return std::nullopt;
      c.kind = ConstraintKind::JsonObject;
      c.field = "json_object";
      break;
    case v1::SamplingParams::kRegex:
      c.kind = ConstraintKind::Regex;
      c.spec = proto.regex();
      c.field = "regex";
      break;
    case v1::SamplingParams::kChoice: {
      c.kind = ConstraintKind::Choice;
      c.spec = nlohmann::json(std::vector<std::string>(proto.choice().values().begin(),
                                                       proto.choice().values().end()))
                   .dump();
      c.field = "choice";
      break;
    }
    case v1::SamplingParams::kGrammar:
      c.kind = ConstraintKind::Grammar;
      c.spec = proto.grammar();
      c.field = "grammar";
      break;
    case v1::SamplingParams::kStructuralTag:
      c.kind = ConstraintKind::StructuralTag;
      c.spec = proto.structural_tag();
      c.field = "structural_tag";
      break;
    case v1::SamplingParams::CONSTRAINT_NOT_SET:
      return std::nullopt;
  }
  return c;
}

SamplingParams to_sampling_params(const v1::SamplingParams& proto, SamplingParams defaults) {
  SamplingParams p = std::move(defaults);
  if (proto.has_temperature()) p.temperature = proto.temperature();
  if (proto.has_top_p()) p.top_p = proto.top_p();
  if (proto.has_top_k()) p.top_k = proto.top_k();
  if (proto.has_min_p()) p.min_p = proto.min_p();
  if (proto.has_repetition_penalty()) p.repetition_penalty = proto.repetition_penalty();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  if (proto.has_seed()) p.seed = proto.seed();
  if (proto.has_max_tokens()) p.max_tokens = proto.max_tokens();
  p.min_tokens = proto.min_tokens();
  p.stop.assign(proto.stop().begin(), proto.stop().end());
  p.stop_token_ids.assign(proto.stop_token_ids().begin(), proto.stop_token_ids().end());
  p.ignore_eos = proto.ignore_eos();
  p.logprobs = proto.has_logprobs() ? proto.logprobs() : -1;
  // -1 means "none" to the engine; a client that set the field asked for a count, so any
  // negative one is out of range (the engine's message, with what the client sent).
  if (proto.has_logprobs() && proto.logprobs() < 0) {
    std::string msg = "field logprobs: got ";
    msg += std::to_string(proto.logprobs());
    msg += ", expected an integer in [0, ";
    msg += std::to_string(kMaxLogprobs);
    msg += "] (or none)";
    throw Error(msg);
  }
  if (proto.has_skip_special_tokens()) p.skip_special_tokens = proto.skip_special_tokens();
  p.logit_bias.clear();
  for (const auto& [id, bias] : proto.logit_bias()) p.logit_bias.emplace_back(id, bias);
  // The map's iteration order is unspecified: sort so validation reports the same id each time.
  p.allowed_token_ids.assign(proto.allowed_token_ids().begin(), proto.allowed_token_ids().end());
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
  p.constraint = to_output_constraint(proto);
  return p;
}

GrpcGenerateRequest to_engine_request(const v1::GenerateRequest& proto,
                                      const SamplingParams& defaults, const Tokenizer& tokenizer,
                                      const Vocabulary& vocabulary) {
  GrpcGenerateRequest out;
  out.stream = proto.stream();
  out.detokenize = !proto.has_detokenize() || proto.detokenize();
  out.engine.request_id = proto.request_id();
  switch (proto.input_case()) {
    case v1::GenerateRequest::kText: {
      if (proto.text().empty()) throw Error("text: is empty; the prompt needs at least one token");
      const bool add_special = !proto.has_add_special_tokens() || proto.add_special_tokens();
      try {
        out.engine.prompt_ids = tokenizer.encode(proto.text(), add_special);
      } catch (const Error& e) {
        throw Error(std::string("text: ") + e.what());
      }
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = proto.token_ids().ids();
      if (ids.empty()) throw Error("token_ids: is empty; the prompt needs at least one token");
      check_token_ids("token_ids", {ids.data(), static_cast<size_t>(ids.size())}, vocabulary);
      out.engine.prompt_ids.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      throw Error("input: neither text nor token_ids is set; exactly one is required");
  }
  out.engine.params = to_sampling_params(proto.sampling_params(), defaults);
  out.engine.n = proto.sampling_params().n() == 0 ? 1 : proto.sampling_params().n();
  if (proto.has_depth_attention()) {  // EngineCore::submit refuses it for a plain model
    out.engine.params.depth_attention = true;
    out.engine.params.depth_attention_per_token = proto.depth_attention().per_token();
  }
  return out;
}

}  // namespace attnres::server
