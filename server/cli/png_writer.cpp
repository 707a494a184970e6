// PNG layout: the 8-byte signature, then chunks of (length, type, data, CRC-32 of type + data):
// IHDR (size, 8-bit RGB), IDAT (a zlib stream of the filtered rows), IEND. Each row is
// prefixed with filter type 0 (none). The zlib stream is a 2-byte header, deflate blocks of
// type 0 ("stored": 1 header byte, LEN, ~LEN, then up to 65535 raw bytes), and the Adler-32 of
// the raw data, big-endian.
#include "server/cli/png_writer.h"

#include <algorithm>
#include <array>
#include <fstream>

#include "engine/core/error.h"

namespace attnres::cli {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  return table;
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void put_chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32(out, crc32(out.data() + start, out.size() - start));
}

std::vector<uint8_t> zlib_stored(const std::vector<uint8_t>& raw) {
  std::vector<uint8_t> z = {0x78, 0x01};  // deflate, 32K window; header check (0x7801 % 31 == 0)
  constexpr size_t kMaxBlock = 65535;
  size_t pos = 0;
  do {
    const size_t len = std::min(kMaxBlock, raw.size() - pos);
    const bool last = pos + len == raw.size();
    z.push_back(last ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    z.push_back(static_cast<uint8_t>(len & 0xFF));
    z.push_back(static_cast<uint8_t>(len >> 8));
    z.push_back(static_cast<uint8_t>(~len & 0xFF));
    z.push_back(static_cast<uint8_t>((~len >> 8) & 0xFF));
    z.insert(z.end(), raw.begin() + static_cast<long>(pos),
             raw.begin() + static_cast<long>(pos + len));
    pos += len;
  } while (pos < raw.size());
  put_u32(z, adler32(raw.data(), raw.size()));
  return z;
}

}  // namespace

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = crc_table()[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t size) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < size; ++i) {
    a = (a + data[i]) % kMod;
    b = (b + a) % kMod;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width < 1 || height < 1 || rgb.size() != static_cast<size_t>(width) * height * 3) {
    throw Error("PNG: image of " + std::to_string(width) + " x " + std::to_string(height) +
                " needs " + std::to_string(static_cast<size_t>(width) * height * 3) +
                " RGB bytes, got " + std::to_string(rgb.size()));
  }
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> header;
  put_u32(header, static_cast<uint32_t>(width));
  put_u32(header, static_cast<uint32_t>(height));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, adaptive, no interlace
  put_chunk(png, "IHDR", header);
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(height) * (1 + static_cast<size_t>(width) * 3));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);  // filter: none
    const auto row = rgb.begin() + static_cast<long>(y) * width * 3;
    raw.insert(raw.end(), row, row + static_cast<long>(width) * 3);
  }
  put_chunk(png, "IDAT", zlib_stored(raw));
  put_chunk(png, "IEND", {});
  return png;
}

void write_png_rgb(const std::string& path, int width, int height,
                   const std::vector<uint8_t>& rgb) {
  const std::vector<uint8_t> png = encode_png_rgb(width, height, rgb);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  out.close();
  if (!out) throw Error(path + ": cannot write the PNG file");
}

}  // namespace attnres::cli
