// The Transformer uploads each weight once: a tied LM head is the embedding's upload, not a
// second copy (on a GPU that copy was 311 MB at the 0.6B shape), and still counts in the
// bytes a decode step reads.
#include <gtest/gtest.h>

#include <map>

#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/engine/runner/parallel_test_util.h"

namespace attnres {
namespace {

// The CPU backend, counting how often each host buffer is uploaded.
class UploadCountingBackend : public CpuBackend {
 public:
  UploadCountingBackend() : CpuBackend(1) {}
  Tensor upload(const Tensor& host) override {
    ++uploads[host.data];
    return CpuBackend::upload(host);
  }
  std::map<const void*, int> uploads;
};

TEST(TransformerUpload, ATiedLmHeadIsTheEmbeddingsUpload) {
  for (bool tied : {true, false}) {
    ModelConfig config = test::tp_test_config("full");
    config.tie_word_embeddings = tied;
    const ModelWeights weights = make_random_weights(config, {DType::F32, 5, false});
    ASSERT_EQ(weights.lm_head.data == weights.embed_tokens.data, tied);
    UploadCountingBackend backend;
    const Transformer model(config, weights, backend);
    for (const auto& [data, count] : backend.uploads) {
      EXPECT_EQ(count, 1) << (tied ? "tied" : "untied") << ": a buffer uploaded " << count
                          << " times";
    }
    EXPECT_EQ(backend.uploads.count(weights.lm_head.data), 1u);
    // The LM head is read whole every decode step, tied or not.
    size_t layers = 0;
    for (const LayerWeights& l : weights.layers) {
      for (const Tensor* t :
           {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm, &l.k_norm,
            &l.post_attention_norm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
        if (t->defined()) layers += t->nbytes();
      }
    }
    EXPECT_GE(model.weight_bytes(), layers + weights.lm_head.nbytes());
  }
}

}  // namespace
}  // namespace attnres
