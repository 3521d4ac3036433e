// Line plots as standalone SVG (no dependencies): what `demo` draws for loss/accuracy curves.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace packbert::cli {

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (x, y)
};

// An SVG document with axes, ticks, a legend and one polyline (with markers) per series.
std::string svg_plot(const std::vector<Series>& series, const std::string& title,
                     const std::string& x_label, const std::string& y_label);

}  // namespace packbert::cli
