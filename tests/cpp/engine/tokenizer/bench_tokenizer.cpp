// Encoding throughput: bench_tokenizer <tokenizer.json> [text file] [repeat]
// Without a text file, ~1 MB of English-like text is generated deterministically. Reports the
// best of `repeat` runs (each on a fresh tokenizer copy, so the word cache starts cold).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace {

std::string generated_text(size_t bytes) {
  static const char* words[] = {"the",
                                "of",
                                "and",
                                "to",
                                "in",
                                "a",
                                "is",
                                "that",
                                "for",
                                "it",
                                "as",
                                "was",
                                "with",
                                "be",
                                "by",
                                "on",
                                "not",
                                "he",
                                "I",
                                "this",
                                "are",
                                "or",
                                "his",
                                "from",
                                "at",
                                "which",
                                "but",
                                "have",
                                "an",
                                "had",
                                "they",
                                "you",
                                "were",
                                "their",
                                "one",
                                "all",
                                "we",
                                "can",
                                "her",
                                "has",
                                "there",
                                "been",
                                "if",
                                "more",
                                "when",
                                "will",
                                "would",
                                "who",
                                "so",
                                "no",
                                "tokenizer",
                                "inference",
                                "server",
                                "attention",
                                "residual",
                                "throughput",
                                "latency",
                                "model's",
                                "don't",
                                "Hello,",
                                "world.",
                                "2024",
                                "1,337",
                                "(example)",
                                "\"quoted\"",
                                "naïve",
                                "café",
                                "résumé",
                                "München",
                                "Zürich",
                                "international",
                                "responsibility"};
  const size_t n = sizeof(words) / sizeof(words[0]);
  std::string out;
  uint64_t state = 12345;
  size_t sentence = 0;
  while (out.size() < bytes) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    out += words[(state >> 33) % n];
    if (++sentence % 17 == 0) {
      out += ".\n";
    } else {
      out += ' ';
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: bench_tokenizer <tokenizer.json> [text file] [repeat]\n";
    return 2;
  }
  std::string text;
  if (argc >= 3 && std::string(argv[2]) != "-") {
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  } else {
    text = generated_text(1 << 20);
  }
  const int repeat = argc >= 4 ? std::stoi(argv[3]) : 3;
  double best = 1e9;
  size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    auto tok = attnres::Tokenizer::load(argv[1]);
    const auto t0 = std::chrono::steady_clock::now();
    tokens = tok->encode(text, false).size();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  std::cout << argv[1] << ": " << text.size() << " bytes -> " << tokens << " tokens in " << best
            << " s (" << text.size() / best / 1e6 << " MB/s, cold cache, best of " << repeat
            << ")\n";
  return 0;
}
