// The in-process communicator against serial computations of the same collectives: P ranks
// run as threads on fresh random tensors; sums must equal the rank-order serial sum bit for
// bit on every rank (replicated activations must stay identical), gathers and scatters must
// place every row where the interface says, and a failing rank must not hang the others.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "engine/parallel/in_process_communicator.h"

namespace attnres {
namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = normal(rng);
  return t;
}

// Runs body(rank, communicator) on P threads; rethrows the first failure.
void run_ranks(int P, const std::function<void(int, Communicator&)>& body) {
  auto group = InProcessGroup::create(P);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(P);
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      auto comm = group->communicator(r);
      try {
        body(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group->abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorTest, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  const int P = GetParam();
  const Shape shape = {37, 13};  // 481 elements: chunks of unequal size
  std::vector<Tensor> inputs, outputs;
  for (int r = 0; r < P; ++r) {
    inputs.push_back(random_tensor(shape, 100 + r));
    outputs.push_back(random_tensor(shape, 100 + r));  // same values, reduced in place
  }
  run_ranks(P, [&](int r, Communicator& comm) {
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.size(), P);
    comm.all_reduce_sum(outputs[r]);
  });
  for (int64_t i = 0; i < inputs[0].numel(); ++i) {
    float want = inputs[0].ptr<float>()[i];
    for (int q = 1; q < P; ++q) want += inputs[q].ptr<float>()[i];
    for (int r = 0; r < P; ++r) ASSERT_EQ(outputs[r].ptr<float>()[i], want) << "rank " << r;
  }
}

TEST_P(CommunicatorTest, ReduceScatterGivesEachRankItsSliceOfTheSum) {
  const int P = GetParam();
  const int64_t rows = 5, cols = 7;
  std::vector<Tensor> inputs, outputs;
  for (int r = 0; r < P; ++r) {
    inputs.push_back(random_tensor({P * rows, cols}, 200 + r));
    outputs.push_back(Tensor::empty({rows, cols}, DType::F32));
  }
  run_ranks(P, [&](int r, Communicator& comm) { comm.reduce_scatter_sum(inputs[r], outputs[r]); });
  for (int r = 0; r < P; ++r) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      float want = inputs[0].ptr<float>()[r * rows * cols + i];
      for (int q = 1; q < P; ++q) want += inputs[q].ptr<float>()[r * rows * cols + i];
      ASSERT_EQ(outputs[r].ptr<float>()[i], want) << "rank " << r << " element " << i;
    }
  }
}

TEST_P(CommunicatorTest, AllGatherStacksTheRanksInOrder) {
  const int P = GetParam();
  const int64_t rows = 3, cols = 11;
  std::vector<Tensor> inputs, outputs;
  for (int r = 0; r < P; ++r) {
    inputs.push_back(random_tensor({rows, cols}, 300 + r));
    outputs.push_back(Tensor::empty({P * rows, cols}, DType::F32));
  }
  run_ranks(P, [&](int r, Communicator& comm) { comm.all_gather(inputs[r], outputs[r]); });
  for (int r = 0; r < P; ++r) {
    for (int q = 0; q < P; ++q) {
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_EQ(outputs[r].ptr<float>()[q * rows * cols + i], inputs[q].ptr<float>()[i]);
      }
    }
  }
}

TEST_P(CommunicatorTest, BroadcastCopiesTheRoot) {
  const int P = GetParam();
  const int root = P - 1;
  std::vector<Tensor> xs;
  for (int r = 0; r < P; ++r) xs.push_back(random_tensor({4, 9}, 400 + r));
  const Tensor want = random_tensor({4, 9}, 400 + root);
  run_ranks(P, [&](int r, Communicator& comm) { comm.broadcast(xs[r], root); });
  for (int r = 0; r < P; ++r) {
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_EQ(xs[r].ptr<float>()[i], want.ptr<float>()[i]);
    }
  }
}

TEST_P(CommunicatorTest, ManyCollectivesInARowStayInStep) {
  // Back-to-back collectives reuse the posted slots: a rank that runs ahead must not see a
  // slower rank's previous tensor.
  const int P = GetParam();
  std::vector<Tensor> xs;
  for (int r = 0; r < P; ++r) xs.push_back(Tensor::empty({8}, DType::F32));
  run_ranks(P, [&](int r, Communicator& comm) {
    for (int it = 0; it < 200; ++it) {
      for (int i = 0; i < 8; ++i) xs[r].ptr<float>()[i] = static_cast<float>(r + it);
      comm.all_reduce_sum(xs[r]);
      const float want = static_cast<float>(P * it + P * (P - 1) / 2);
      for (int i = 0; i < 8; ++i) ASSERT_EQ(xs[r].ptr<float>()[i], want) << "iteration " << it;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, CommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(InProcessGroup, AFailingRankDoesNotHangTheOthers) {
  const int P = 3;
  auto group = InProcessGroup::create(P);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(P);
  for (int r = 0; r < P; ++r) {
    threads.emplace_back([&, r] {
      auto comm = group->communicator(r);
      Tensor x = Tensor::empty({16}, DType::F32);
      try {
        if (r == 1) throw Error("rank 1 broke before the collective");
        comm->all_reduce_sum(x);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        comm->abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[1], "rank 1 broke before the collective");
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("tensor-parallel group aborted: rank 1 broke"), std::string::npos)
        << errors[r];
  }
}

TEST(InProcessGroup, RanksDisagreeingOnTheShapeFailLoudly) {
  auto group = InProcessGroup::create(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = group->communicator(r);
      Tensor x = Tensor::empty({r == 0 ? 8 : 9}, DType::F32);
      try {
        comm->all_reduce_sum(x);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("ranks disagree"), std::string::npos);
}

TEST(InProcessGroup, RejectsBadSizesAndShapes) {
  EXPECT_THROW(InProcessGroup::create(0), Error);
  auto group = InProcessGroup::create(2);
  auto comm = group->communicator(0);
  Tensor in = Tensor::empty({3, 2}, DType::F32), out = Tensor::empty({3, 2}, DType::F32);
  EXPECT_THROW(comm->all_gather(in, out), Error);          // out must be 2x in
  EXPECT_THROW(comm->reduce_scatter_sum(in, out), Error);  // in must be 2x out
  Tensor bf16 = Tensor::empty({4}, DType::BF16);
  EXPECT_THROW(comm->all_reduce_sum(bf16), Error);
}

}  // namespace
}  // namespace attnres
