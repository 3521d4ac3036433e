#include "pack/histogram.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <system_error>

#include "error.h"

namespace packbert::pack {

int64_t Histogram::sequences() const {
  int64_t n = 0;
  for (int64_t c : count) n += c;
  return n;
}

int64_t Histogram::tokens() const {
  int64_t t = 0;
  for (int l = 1; l <= max_len; ++l) t += count[l] * l;
  return t;
}

namespace {

// Parses a whole field as a signed integer; false if it is not one.
bool parse_int(std::string_view field, int64_t& out) {
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), out);
  return ec == std::errc() && end == field.data() + field.size();
}

}  // namespace

Histogram parse_histogram(const std::string& text, const std::string& source, int max_len) {
  Histogram h(max_len);
  std::vector<int> seen_at(max_len + 1, 0);
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  auto fail = [&](const std::string& what) {
    throw InputError(source + ":" + std::to_string(line_no) + ": " + what);
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string f_len, f_count, extra;
    if (!(fields >> f_len)) continue;  // blank or comment-only line
    if (!(fields >> f_count)) fail("expected 'length count', found one field '" + f_len + "'");
    if (fields >> extra) fail("expected 'length count', found extra field '" + extra + "'");
    int64_t len = 0, cnt = 0;
    if (!parse_int(f_len, len)) fail("length '" + f_len + "' is not an integer");
    if (!parse_int(f_count, cnt)) fail("count '" + f_count + "' is not an integer");
    if (len < 1 || len > max_len)
      fail("length " + f_len + " is outside [1, " + std::to_string(max_len) +
           "] (raise `max_seq_len`?)");
    if (cnt < 0) fail("count " + f_count + " is negative");
    if (seen_at[len])
      fail("length " + f_len + " appears again (first at line " + std::to_string(seen_at[len]) +
           ")");
    seen_at[len] = line_no;
    h.count[len] = cnt;
  }
  if (h.sequences() == 0) throw InputError(source + ": histogram holds no sequences");
  return h;
}

Histogram read_histogram(const std::string& path, int max_len) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw InputError(path + ": cannot open for reading");
  // A histogram is a few lines per length: a file past 64 MiB (or an endless one) is not one.
  constexpr size_t kMost = size_t{64} << 20;
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= kMost && file.read(chunk, sizeof chunk))
    text.append(chunk, static_cast<size_t>(file.gcount()));
  if (file.bad()) throw InputError(path + ": read failed");
  text.append(chunk, static_cast<size_t>(file.gcount()));
  if (text.size() > kMost)
    throw InputError(path +
                     ": longer than 64 MiB, so not a length histogram (nor a sequences file)");
  return parse_histogram(text, path, max_len);
}

Histogram histogram_of(const std::vector<int>& lengths, int max_len) {
  Histogram h(max_len);
  for (int l : lengths) {
    if (l < 1 || l > max_len)
      throw InputError("sequence length " + std::to_string(l) + " is outside [1, " +
                       std::to_string(max_len) + "]");
    ++h.count[l];
  }
  return h;
}

}  // namespace packbert::pack
