// Attention pictures as SVG: a grid of cells, labels on both axes.
#include <algorithm>
#include <cstdio>

#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv {

static std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string attention_svg(const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                          const std::vector<float>& weights, const std::string& title) {
  QKV_CHECK(weights.size() == rows.size() * cols.size(), "attention_svg: ", weights.size(), " weights for ",
            rows.size(), " x ", cols.size(), " labels");
  // The title may hold several lines ('\n'); CJK glyphs are about as wide as the font size.
  std::vector<std::string> lines;
  for (size_t at = 0;;) {
    size_t nl = title.find('\n', at);
    lines.push_back(title.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  size_t longest = 0;
  for (auto& l : lines) {
    size_t glyphs = 0;
    for (unsigned char ch : l) glyphs += (ch & 0xc0) != 0x80;
    longest = std::max(longest, glyphs);
  }
  const int cell = 36, left = 90, pad = 20, top = 70 + 20 * (int)lines.size();
  const int width = std::max(left + (int)cols.size() * cell + pad, pad * 2 + 15 * (int)longest);
  const int height = top + (int)rows.size() * cell + pad + 20;
  const char* font = "Noto Sans CJK JP, Noto Sans CJK SC, IPAGothic, IPAexGothic, WenQuanYi Zen Hei, sans-serif";
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"%s\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height, width, height, font);
  s += buf;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" font-size=\"15\">", pad, 24 + 20 * (int)i);
    s += buf + xml_escape(lines[i]) + "</text>\n";
  }
  for (size_t c = 0; c < cols.size(); ++c) {  // source labels across the top
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" font-size=\"20\" text-anchor=\"middle\">",
                  left + (int)c * cell + cell / 2, top - 12);
    s += buf + xml_escape(cols[c]) + "</text>\n";
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" font-size=\"20\" text-anchor=\"end\">", left - 10,
                  top + (int)r * cell + cell / 2 + 7);
    s += buf + xml_escape(rows[r]) + "</text>\n";
    for (size_t c = 0; c < cols.size(); ++c) {
      float w = std::clamp(weights[r * cols.size() + c], 0.0f, 1.0f);
      int shade = (int)(255 * (1.0f - w));
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"rgb(%d,%d,%d)\" stroke=\"#ddd\">"
                    "<title>%.3f</title></rect>\n",
                    left + (int)c * cell, top + (int)r * cell, cell, cell, shade, shade, shade, w);
      s += buf;
    }
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" font-size=\"12\" fill=\"#555\">", pad, height - 10);
  s += buf + std::string("rows: output tokens; columns: source tokens; darker = more attention") + "</text>\n</svg>\n";
  return s;
}

}  // namespace qkv
