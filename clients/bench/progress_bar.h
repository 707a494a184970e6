// A tqdm-like progress bar on stderr ("label:  42%|████▏     | 42/100 [00:03<00:04, 13.02it/s]"),
// redrawn at most ten times a second from whichever thread reports progress. Disabled bars do
// nothing, so callers need no conditions (the command enables it when stderr is a terminal,
// or with --progress).
#pragma once

#include <chrono>
#include <mutex>
#include <string>

namespace attnres::bench {

class ProgressBar {
 public:
  ProgressBar(std::string label, int total, bool enabled);
  ~ProgressBar() { close(); }
  void update(int increment = 1);
  // Draws the final state and ends the line (once).
  void close();

  // The bar's text for `done` of `total` after `elapsed_s` seconds (no "\r"); for tests.
  static std::string render(const std::string& label, int done, int total, double elapsed_s);

 private:
  void draw(bool force);

  std::string label_;
  int total_;
  bool enabled_;
  bool closed_ = false;
  int done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mutex_;
};

}  // namespace attnres::bench
