#include "clients/bench/progress_bar.h"

#include <algorithm>
#include <cstdio>

namespace attnres::bench {
namespace {

std::string clock_text(double seconds) {
  if (!(seconds >= 0) || seconds > 359999) return "??:??";
  const long s = static_cast<long>(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
  if (enabled_) draw(true);
}

std::string ProgressBar::render(const std::string& label, int done, int total, double elapsed_s) {
  constexpr int kWidth = 20;
  static constexpr const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const double fraction = total > 0 ? std::clamp(static_cast<double>(done) / total, 0.0, 1.0) : 1;
  const int eighths = static_cast<int>(fraction * kWidth * 8);
  std::string bar;
  int cells = 0;
  for (; cells < eighths / 8; ++cells) bar += "█";
  if (cells < kWidth && eighths % 8) {
    bar += kEighths[eighths % 8];
    ++cells;
  }
  bar.append(kWidth - cells, ' ');
  const double rate = elapsed_s > 0 ? done / elapsed_s : 0;
  const double remaining = rate > 0 ? (total - done) / rate : -1;
  char head[64], tail[96];
  std::snprintf(head, sizeof head, "%3.0f%%|", fraction * 100);
  std::snprintf(tail, sizeof tail, "| %d/%d [%s<%s, %.2fit/s]", done, total,
                clock_text(elapsed_s).c_str(), clock_text(remaining).c_str(), rate);
  return (label.empty() ? "" : label + ": ") + head + bar + tail;
}

void ProgressBar::update(int increment) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  done_ += increment;
  draw(done_ >= total_);
}

void ProgressBar::close() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  draw(true);
  std::fputc('\n', stderr);
  closed_ = true;
}

void ProgressBar::draw(bool force) {
  if (closed_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::fprintf(stderr, "\r%s", render(label_, done_, total_, elapsed).c_str());
  std::fflush(stderr);
}

}  // namespace attnres::bench
