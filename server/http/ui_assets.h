// The web playground's files (server/http/ui/), compiled into the binary by
// server/http/ui/embed_assets.cmake: `attnres serve` answers / with them, no files installed.
#pragma once

#include <span>
#include <string_view>

namespace attnres::server::http {

struct UiAsset {
  std::string_view name;  // the file's name in server/http/ui/, e.g. "app.js"
  std::string_view content_type;
  std::string_view body;
};

std::span<const UiAsset> ui_assets();

}  // namespace attnres::server::http
