// A minimal PNG writer for `attnres inspect --out`: 8-bit RGB, no dependencies. The image data
// goes into zlib "stored" (uncompressed) deflate blocks, so the writer needs only the two
// checksums PNG and zlib require (CRC-32 per chunk, Adler-32 over the data), not a compressor:
// the build machines (and the GPU machine) have no zlib -dev package, and heatmaps are small.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attnres::cli {

// CRC-32 (ISO-HDLC, as PNG and zlib use it) and Adler-32 (zlib's stream checksum).
uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t size);

// The PNG file bytes of a width x height image, rgb row-major (3 bytes per pixel).
std::vector<uint8_t> encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb);
// Writes it; throws attnres::Error naming the path when it cannot.
void write_png_rgb(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace attnres::cli
