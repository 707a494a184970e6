#include "server/http/structured_output_fields.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/http/api_error.h"

namespace attnres::server::http {
namespace {

using Json = nlohmann::ordered_json;

// The request field (its top-level name) a constraint came from, for errors.
OutputConstraint make(ConstraintKind kind, std::string spec, const std::string& field) {
  OutputConstraint c;
  c.kind = kind;
  c.spec = std::move(spec);
  c.field = field;
  return c;
}

[[noreturn]] void refuse(const std::string& where, const std::string& what,
                         const std::string& param) {
  throw bad_request("field " + where + ": " + what, param);
}

// A JSON schema given as an object, or as its JSON text (vLLM takes both).
std::string schema_text(const Json& value, const std::string& where, const std::string& param) {
  if (value.is_object()) return value.dump();
  if (value.is_string()) return value.get<std::string>();
  refuse(where, "expected a JSON schema (an object), got " + json_type_name(value), param);
}

std::string string_value(const Json& value, const std::string& where, const std::string& param) {
  if (!value.is_string()) refuse(where, "expected a string, got " + json_type_name(value), param);
  if (value.get_ref<const std::string&>().empty()) refuse(where, "is empty", param);
  return value.get<std::string>();
}

// Choice: a list of strings, kept as its JSON text (the compiler's Choice spec).
std::string choice_list(const Json& value, const std::string& where, const std::string& param) {
  if (!value.is_array() || value.empty()) {
    refuse(where, "expected a non-empty list of strings, got " + json_type_name(value), param);
  }
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string()) {
      refuse(where + "[" + std::to_string(i) + "]",
             "expected a string, got " + json_type_name(value[i]), param);
    }
  }
  return value.dump();
}

// A structural tag: xgrammar's format, as an object or its JSON text.
std::string structural_tag(const Json& value, const std::string& where, const std::string& param) {
  if (value.is_object()) return value.dump();
  return string_value(value, where, param);
}

// OpenAI's response_format.
std::optional<OutputConstraint> response_format(const Json& value) {
  const std::string field = "response_format";
  if (!value.is_object()) {
    refuse(field, "expected an object {\"type\": ...}, got " + json_type_name(value), field);
  }
  auto type = value.find("type");
  if (type == value.end() || !type->is_string()) {
    refuse(field + ".type", "is required: one of text, json_object, json_schema, structural_tag",
           field);
  }
  const std::string& kind = type->get_ref<const std::string&>();
  if (kind == "text") return std::nullopt;
  if (kind == "json_object") return make(ConstraintKind::JsonObject, "", field);
  if (kind == "json_schema") {
    auto schema = value.find("json_schema");
    if (schema == value.end() || !schema->is_object()) {
      refuse(field + ".json_schema", "is required with type json_schema: {\"name\", \"schema\"}",
             field);
    }
    if (auto name = schema->find("name"); name != schema->end() && !name->is_string()) {
      refuse(field + ".json_schema.name", "expected a string, got " + json_type_name(*name), field);
    }
    if (auto strict = schema->find("strict");
        strict != schema->end() && !strict->is_boolean() && !strict->is_null()) {
      refuse(field + ".json_schema.strict",
             "expected true or false, got " + json_type_name(*strict), field);
    }
    auto body = schema->find("schema");
    if (body == schema->end() || body->is_null()) {
      refuse(field + ".json_schema.schema", "is required", field);
    }
    return make(ConstraintKind::JsonSchema,
                schema_text(*body, field + ".json_schema.schema", field), field);
  }
  if (kind == "structural_tag") return make(ConstraintKind::StructuralTag, value.dump(), field);
  refuse(field + ".type",
         "got \"" + kind + "\", expected one of text, json_object, json_schema, structural_tag",
         field);
}

// vLLM's structured_outputs: exactly one constraint key.
std::optional<OutputConstraint> structured_outputs(const Json& value) {
  const std::string field = "structured_outputs";
  if (!value.is_object()) {
    refuse(field, "expected an object, got " + json_type_name(value), field);
  }
  std::vector<OutputConstraint> found;
  for (const auto& [key, item] : value.items()) {
    const std::string where = field + "." + key;
    if (item.is_null()) continue;
    if (key == "json") {
      found.push_back(make(ConstraintKind::JsonSchema, schema_text(item, where, field), field));
    } else if (key == "regex") {
      found.push_back(make(ConstraintKind::Regex, string_value(item, where, field), field));
    } else if (key == "choice") {
      found.push_back(make(ConstraintKind::Choice, choice_list(item, where, field), field));
    } else if (key == "grammar") {
      found.push_back(make(ConstraintKind::Grammar, string_value(item, where, field), field));
    } else if (key == "structural_tag") {
      found.push_back(
          make(ConstraintKind::StructuralTag, structural_tag(item, where, field), field));
    } else if (key == "json_object") {
      if (!item.is_boolean()) refuse(where, "expected true or false", field);
      if (item.get<bool>()) found.push_back(make(ConstraintKind::JsonObject, "", field));
    } else if (key == "disable_fallback" || key == "disable_any_whitespace" ||
               key == "disable_additional_properties") {
      // Options xgrammar's output already satisfies: there is no fallback backend, JSON has
      // no free whitespace, and a schema's additionalProperties is honoured as written.
      if (!item.is_boolean()) refuse(where, "expected true or false", field);
    } else {
      refuse(where,
             "is not supported (structured_outputs takes one of json, regex, choice, grammar, "
             "json_object, structural_tag)",
             field);
    }
  }
  if (found.empty()) {
    refuse(field,
           "names no constraint: give one of json, regex, choice, grammar, json_object, "
           "structural_tag",
           field);
  }
  if (found.size() > 1) refuse(field, "gives more than one constraint; give exactly one", field);
  return std::move(found.front());
}

}  // namespace

void read_structured_output_fields(const FieldReader& f, SamplingParams& params) {
  std::vector<std::pair<std::string, OutputConstraint>> found;  // (field, constraint)
  auto add = [&](const std::string& field, std::optional<OutputConstraint> c) {
    if (c) found.emplace_back(field, std::move(*c));
  };
  if (const Json* v = f.find("response_format")) add("response_format", response_format(*v));
  if (const Json* v = f.find("structured_outputs")) {
    add("structured_outputs", structured_outputs(*v));
  }
  if (const Json* v = f.find("guided_json")) {
    add("guided_json", make(ConstraintKind::JsonSchema,
                            schema_text(*v, "guided_json", "guided_json"), "guided_json"));
  }
  if (const Json* v = f.find("guided_regex")) {
    add("guided_regex", make(ConstraintKind::Regex,
                             string_value(*v, "guided_regex", "guided_regex"), "guided_regex"));
  }
  if (const Json* v = f.find("guided_choice")) {
    add("guided_choice", make(ConstraintKind::Choice,
                              choice_list(*v, "guided_choice", "guided_choice"), "guided_choice"));
  }
  if (const Json* v = f.find("guided_grammar")) {
    add("guided_grammar",
        make(ConstraintKind::Grammar, string_value(*v, "guided_grammar", "guided_grammar"),
             "guided_grammar"));
  }
  if (const Json* v = f.find("grammar")) {  // llama.cpp: GBNF
    add("grammar",
        make(ConstraintKind::Grammar, string_value(*v, "grammar", "grammar"), "grammar"));
  }
  if (const Json* v = f.find("json_schema")) {  // llama.cpp
    add("json_schema", make(ConstraintKind::JsonSchema,
                            schema_text(*v, "json_schema", "json_schema"), "json_schema"));
  }
  if (auto backend = f.string("guided_decoding_backend")) {
    if (*backend != "xgrammar" && *backend != "auto" && !backend->empty()) {
      refuse(
          "guided_decoding_backend",
          "got \"" + *backend + "\", this server's structured output uses xgrammar (or \"auto\")",
          "guided_decoding_backend");
    }
  }
  if (f.find("guided_whitespace_pattern")) {
    refuse("guided_whitespace_pattern", "is not supported (JSON output has one fixed layout)",
           "guided_whitespace_pattern");
  }
  if (found.size() > 1) {
    refuse(found[1].first,
           "conflicts with " + found[0].first + ": give one structured-output constraint",
           found[1].first);
  }
  if (!found.empty()) params.constraint = std::move(found.front().second);
}

}  // namespace attnres::server::http
