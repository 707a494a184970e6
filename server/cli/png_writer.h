// The PNG writer for `attnres inspect --out`: 8-bit RGB through libpng's simplified write API
// (png_image_write_to_memory), which brings the deflate, the filters and the checksums.
// Builds without libpng (no libpng-dev) get png_writer_unavailable.cpp instead, whose
// functions throw attnres::Error saying so; everything else works.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnres::cli {

// The PNG file bytes of a width x height image, rgb row-major (3 bytes per pixel). Throws
// attnres::Error when rgb does not hold width * height * 3 bytes or libpng fails.
std::vector<uint8_t> encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb);
// Writes it; throws attnres::Error naming the path when it cannot.
void write_png_rgb(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace attnres::cli
