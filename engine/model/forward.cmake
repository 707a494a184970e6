# The forward, the depth plan and the KV cache (the lead's part of engine/model).
target_sources(attnres_model PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/depth_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/depth_bank.cpp
  ${CMAKE_CURRENT_LIST_DIR}/depth_attention_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random_weights.cpp)

# A model directory as a whole (weights + tokenizer + chat template), and the built-in models.
add_library(attnres_model_bundle ${CMAKE_CURRENT_LIST_DIR}/loaded_model.cpp
            ${CMAKE_CURRENT_LIST_DIR}/quantized_checkpoint.cpp)
target_link_libraries(attnres_model_bundle PUBLIC attnres_model attnres_tokenizer attnres_sample)
