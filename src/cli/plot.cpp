#include "cli/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "text.h"

namespace packbert::cli {

namespace {

std::string num(double v) {
  return general(v, 4);
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return o;
}

double nice_step(double range) {
  double raw = range / 5, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

// At most 4 points per pixel column (the first, lowest, highest and last of the points in it, in
// x order): the drawn line is the same as the full series', and a run of 2 million records
// draws a few thousand points, not 2 million.
std::vector<std::pair<double, double>> per_pixel(const std::vector<std::pair<double, double>>& p,
                                                 double x0, double x1, double width) {
  constexpr size_t kFew = 2000;
  if (p.size() <= kFew) return p;
  const auto column = [&](double x) {
    return static_cast<int64_t>(std::floor((x - x0) / (x1 - x0) * width));
  };
  std::vector<std::pair<double, double>> out;
  size_t i = 0;
  while (i < p.size()) {
    const int64_t c = column(p[i].first);
    size_t j = i, lo = i, hi = i;
    for (; j < p.size() && column(p[j].first) == c; ++j) {
      if (p[j].second < p[lo].second) lo = j;
      if (p[j].second > p[hi].second) hi = j;
    }
    size_t keep[4] = {i, std::min(lo, hi), std::max(lo, hi), j - 1};
    for (int k = 0; k < 4; ++k)
      if (k == 0 || keep[k] != keep[k - 1]) out.push_back(p[keep[k]]);
    i = j;
  }
  return out;
}

}  // namespace

std::string svg_plot(const std::vector<Series>& series, const std::string& title,
                     const std::string& x_label, const std::string& y_label) {
  const double W = 760, H = 460, L = 70, R = 20, T = 40, B = 60;
  double x0 = 0, x1 = 1e-9, y0 = 0, y1 = 1e-9;
  for (const Series& s : series)
    for (auto [x, y] : s.points) x1 = std::max(x1, x), y1 = std::max(y1, y);
  double xs = nice_step(x1 - x0), ys = nice_step(y1 - y0);
  x1 = std::ceil(x1 / xs) * xs;
  y1 = std::ceil(y1 / ys) * ys;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" +
                  num(H) +
                  "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" "
                  "height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + num(W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" +
       escape(title) + "</text>\n";
  for (double x = x0; x <= x1 + 1e-9; x += xs)
    o += "<line x1=\"" + num(px(x)) + "\" y1=\"" + num(T) + "\" x2=\"" + num(px(x)) + "\" y2=\"" +
         num(H - B) + "\" stroke=\"#eee\"/><text x=\"" + num(px(x)) + "\" y=\"" + num(H - B + 16) +
         "\" text-anchor=\"middle\">" + num(x) + "</text>\n";
  for (double y = y0; y <= y1 + 1e-9; y += ys)
    o += "<line x1=\"" + num(L) + "\" y1=\"" + num(py(y)) + "\" x2=\"" + num(W - R) + "\" y2=\"" +
         num(py(y)) + "\" stroke=\"#eee\"/><text x=\"" + num(L - 6) + "\" y=\"" + num(py(y) + 4) +
         "\" text-anchor=\"end\">" + num(y) + "</text>\n";
  o += "<line x1=\"" + num(L) + "\" y1=\"" + num(H - B) + "\" x2=\"" + num(W - R) + "\" y2=\"" +
       num(H - B) + "\" stroke=\"black\"/><line x1=\"" + num(L) + "\" y1=\"" + num(T) + "\" x2=\"" +
       num(L) + "\" y2=\"" + num(H - B) + "\" stroke=\"black\"/>\n";
  o += "<text x=\"" + num((L + W - R) / 2) + "\" y=\"" + num(H - 18) +
       "\" text-anchor=\"middle\">" + escape(x_label) + "</text>\n";
  o += "<text transform=\"translate(18," + num((T + H - B) / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + escape(y_label) + "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    const std::vector<std::pair<double, double>> drawn = per_pixel(s.points, x0, x1, W - L - R);
    std::string pts;
    for (auto [x, y] : drawn) pts += num(px(x)) + "," + num(py(y)) + " ";
    o += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"2\" points=\"" + pts +
         "\"/>\n";
    if (s.points.size() <= 200)  // markers where they can be told apart
      for (auto [x, y] : s.points)
        o += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"3\" fill=\"" +
             s.color + "\"/>\n";
    double ly = T + 16 + 18.0 * static_cast<double>(k);
    o += "<line x1=\"" + num(L + 14) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(L + 38) +
         "\" y2=\"" + num(ly) + "\" stroke=\"" + s.color + "\" stroke-width=\"3\"/><text x=\"" +
         num(L + 44) + "\" y=\"" + num(ly + 4) + "\">" + escape(s.name) + "</text>\n";
  }
  return o + "</svg>\n";
}

}  // namespace packbert::cli
