// Streaming detokenization that is exact: the concatenated output equals decode(all ids).
//
// The token strings since the last "anchor" are decoded as a whole on every push, and only the
// part that can no longer change is returned. Text is held back while
//  - it ends in U+FFFD (an incomplete UTF-8 character from byte-level or byte tokens),
//  - the last token is a <0xAB> byte token (ByteFallback turns a whole invalid run into one
//    U+FFFD per byte, so a run is final only once it ends),
//  - Strip decoders with "stop" could still remove trailing characters.
// When everything decoded so far has been returned, the window is dropped (anchored) and later
// tokens are decoded in "continuation" mode, which skips start-of-text effects (Metaspace's
// first-token space, a leading Strip after Fuse). That keeps each push O(tokens since anchor).
#include "engine/core/error.h"
#include "engine/tokenizer/components.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode_util.h"

namespace attnres {
namespace {

// Byte length of the last n UTF-8 characters of s.
size_t tail_bytes(const std::string& s, size_t n) {
  size_t i = s.size();
  while (n > 0 && i > 0) {
    --i;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    --n;
  }
  return s.size() - i;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tok,
                                       bool skip_special_tokens)
    : tok_(std::move(tok)), skip_special_(skip_special_tokens) {
  if (!tok_) throw Error("IncrementalDecoder needs a tokenizer");
}

std::string IncrementalDecoder::push(int32_t id) {
  std::vector<std::string> s = tok_->id_strings(std::span<const int32_t>(&id, 1), skip_special_);
  if (s.empty()) return "";  // skipped special token: contributes nothing to decode()
  last_is_byte_token_ = tok_->decoder_traits_->byte_fallback && tok::parse_byte_token(s[0]) >= 0;
  window_.push_back(std::move(s[0]));
  return emit(false);
}

std::string IncrementalDecoder::flush() {
  last_is_byte_token_ = false;
  return emit(true);
}

std::string IncrementalDecoder::emit(bool final) {
  if (window_.empty()) return "";
  if (!final && last_is_byte_token_) return "";
  const std::string text = tok_->decode_strings(window_, anchored_);
  size_t limit = text.size();
  if (!final) {
    if (text.ends_with(tok::kReplacementChar)) return "";
    limit -= tail_bytes(text, tok_->decoder_traits_->total_strip_stop);
  }
  if (limit <= emitted_in_window_) return "";
  std::string out = text.substr(emitted_in_window_, limit - emitted_in_window_);
  emitted_in_window_ = limit;
  // Anchoring is exact once some text is out (so a leading Strip has done its work) and nothing
  // is held back; without a decoder the tokens are joined by spaces, which is kept simple.
  const bool can_anchor = tok_->decoder_ != nullptr &&
                          tok_->decoder_traits_->total_strip_stop == 0 &&
                          emitted_in_window_ == text.size();
  if (can_anchor) {
    window_.clear();
    emitted_in_window_ = 0;
    anchored_ = true;
  }
  return out;
}

}  // namespace attnres
