// libpng's simplified API does the whole file (signature, IHDR, sRGB, adaptively filtered
// and deflated IDAT, IEND) and reports failures through png_image::message instead of
// longjmp, so no setjmp crosses C++ frames here.
#include "server/cli/png_writer.h"

#include <png.h>

#include <fstream>

#include "engine/core/error.h"

namespace attnres::cli {

std::vector<uint8_t> encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width < 1 || height < 1 || rgb.size() != static_cast<size_t>(width) * height * 3) {
    throw Error("PNG: image of " + std::to_string(width) + " x " + std::to_string(height) +
                " needs " + std::to_string(static_cast<size_t>(width) * height * 3) +
                " RGB bytes, got " + std::to_string(rgb.size()));
  }
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_RGB;
  // The worst case (incompressible data) bounds the file, so one pass suffices.
  std::vector<uint8_t> png(PNG_IMAGE_PNG_SIZE_MAX(image));
  png_alloc_size_t size = png.size();
  const int ok = png_image_write_to_memory(&image, png.data(), &size, /*convert_to_8_bit=*/0,
                                           rgb.data(), /*row_stride=*/0, /*colormap=*/nullptr);
  if (!ok) {
    const std::string message = image.message;
    png_image_free(&image);
    throw Error("PNG: libpng could not encode the " + std::to_string(width) + " x " +
                std::to_string(height) + " image: " + message);
  }
  png.resize(size);
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
