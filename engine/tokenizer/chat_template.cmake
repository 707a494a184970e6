# Chat templates (Jinja) and tokenizer_config.json, compiled into attnres_tokenizer.
# Included by engine/tokenizer/CMakeLists.txt after add_library(attnres_tokenizer ...).
set(ATTNRES_CHAT_TEMPLATE_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/chat_template.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_filters.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_interpreter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_lexer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_methods.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_parser.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_tests.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_utf8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jinja_value.cpp
)

if(NOT TARGET attnres_tokenizer)
  # Only while engine/tokenizer/CMakeLists.txt does not define the library yet: a stand-in
  # so the chat template tests can build. The real target gets the same sources below.
  add_library(attnres_tokenizer STATIC)
endif()

target_sources(attnres_tokenizer PRIVATE ${ATTNRES_CHAT_TEMPLATE_SOURCES})
target_link_libraries(attnres_tokenizer
  PUBLIC attnres_include_root nlohmann_json::nlohmann_json
  PRIVATE PkgConfig::UTF8PROC)
