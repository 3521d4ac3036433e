#include "data/sequences.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <sstream>

#include "error.h"
#include "io/atomic_file.h"
#include "io/checksum.h"
#include "io/input_file.h"
#include "pack/assign.h"

namespace packbert::data {

static_assert(std::endian::native == std::endian::little, "files are little-endian");

namespace {

constexpr char kSeqMagic[8] = {'P', 'K', 'B', 'T', 'S', 'E', 'Q', '1'};
constexpr char kPackMagic[8] = {'P', 'K', 'B', 'T', 'P', 'C', 'K', '1'};
// Version 2: the published FNV-1a offset basis, and the sequences header grew by the held-out
// split. Version 1 files are still read.
constexpr uint32_t kVersion = 2;
constexpr size_t kSeqHeaderV1 = 64, kSeqHeader = 72, kPackHeader = 80;

constexpr size_t sequences_header(uint32_t version) {
  return version == 1 ? kSeqHeaderV1 : kSeqHeader;
}

uint64_t checksum_of(std::string_view buf, size_t header, uint32_t version) {
  return io::fnv1a(buf.data() + header, buf.size() - header, io::fnv_basis_for(version));
}

struct Writer {
  std::string buf;
  template <typename T>
  void put(const T& v) {
    buf.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void put_array(const std::vector<T>& v) {
    buf.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void pad8() { buf.append((8 - buf.size() % 8) % 8, '\0'); }
  // A file's header starts: its magic, the format version, the header's size, then `counts`.
  static Writer header(const char* magic, size_t header_bytes,
                       std::initializer_list<uint64_t> counts) {
    Writer h;
    h.buf.append(magic, 8);
    h.put(kVersion);
    h.put(static_cast<uint32_t>(header_bytes));
    for (uint64_t n : counts) h.put(n);
    return h;
  }
};

struct Reader {
  std::string_view buf;
  size_t pos;
  const std::string& path;
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  template <typename T>
  std::vector<T> get_array(uint64_t n, const char* what) {
    if (n > (buf.size() - pos) / sizeof(T))
      throw InputError(path + ": truncated: " + what + " needs " + std::to_string(n * sizeof(T)) +
                       " bytes, " + std::to_string(buf.size() - pos) + " left");
    std::vector<T> v(n);
    std::memcpy(v.data(), buf.data() + pos, n * sizeof(T));
    pos += n * sizeof(T);
    return v;
  }
  void skip_pad8() { pos += (8 - pos % 8) % 8; }
};

// Checks the magic and version and returns the version; `header(version)` is its header size.
template <typename HeaderSize>
uint32_t check_magic(std::string_view buf, const std::string& path, const char* magic,
                     HeaderSize header, const char* kind) {
  if (buf.size() < 8 || std::memcmp(buf.data(), magic, 8) != 0)
    throw InputError(path + ": not a packbert " + kind + " file (its first bytes are not " +
                     std::string(magic, 8) + ")");
  if (buf.size() < 16)
    throw InputError(path + ": truncated: " + std::to_string(buf.size()) +
                     " bytes, shorter than the " + kind + " file header");
  uint32_t version;
  std::memcpy(&version, buf.data() + 8, 4);
  if (version < 1 || version > kVersion)
    throw InputError(path + ": " + kind + " file version " + std::to_string(version) +
                     ", this packbert reads versions 1 to " + std::to_string(kVersion));
  if (buf.size() < header(version))
    throw InputError(path + ": truncated: " + std::to_string(buf.size()) +
                     " bytes, shorter than the " + std::to_string(header(version)) + "-byte " +
                     kind + " file header");
  return version;
}

template <typename T>
void check_offsets(const std::vector<T>& off, uint64_t total, const std::string& path,
                   const char* what) {
  if (off.empty() || off.front() != 0 || off.back() != total)
    throw InputError(path + ": " + what + " offsets do not span the data (corrupt file)");
  for (size_t i = 1; i < off.size(); ++i)
    if (off[i] < off[i - 1])
      throw InputError(path + ": " + what + " offsets decrease at entry " + std::to_string(i));
}

}  // namespace

void SequencesFile::append(const Example& e) {
  tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
  token_offsets.push_back(tokens.size());
  b_start.push_back(e.b_start);
  nsp_label.push_back(static_cast<int8_t>(e.nsp_label));
  mlm_positions.insert(mlm_positions.end(), e.mlm_positions.begin(), e.mlm_positions.end());
  mlm_inputs.insert(mlm_inputs.end(), e.mlm_inputs.begin(), e.mlm_inputs.end());
  mlm_offsets.push_back(mlm_positions.size());
}

std::vector<int> SequencesFile::lengths() const {
  std::vector<int> out(size());
  for (size_t i = 0; i < size(); ++i) out[i] = length(i);
  return out;
}

void write_sequences(const std::string& path, const SequencesFile& f) {
  Writer p;
  p.put_array(f.token_offsets);
  p.put_array(f.tokens);
  p.pad8();
  p.put_array(f.b_start);
  p.put_array(f.nsp_label);
  p.pad8();
  p.put_array(f.mlm_offsets);
  p.put_array(f.mlm_positions);
  p.put_array(f.mlm_inputs);
  Writer h =
      Writer::header(kSeqMagic, kSeqHeader, {f.size(), f.tokens.size(), f.mlm_positions.size()});
  h.put(f.max_seq_len);
  h.put(f.vocab_size);
  h.put(f.vocab_fingerprint);
  h.put(io::fnv1a(p.buf.data(), p.buf.size()));
  h.put(f.heldout_begin == SequencesFile::kNoSplit ? static_cast<uint64_t>(f.size())
                                                   : f.heldout_begin);
  io::write_file_atomic(path, h.buf + p.buf);
}

// The file size a header declares: `sizes` in order, each section padded to 8 bytes where
// `pad_after` says; exact in 128 bits, so a hostile count cannot wrap around.
unsigned __int128 declared_size(size_t header,
                                std::initializer_list<std::pair<unsigned __int128, bool>> sizes) {
  unsigned __int128 total = header;
  for (auto [bytes, pad_after] : sizes) {
    total += bytes;
    if (pad_after) total += (8 - static_cast<uint64_t>(total % 8)) % 8;
  }
  return total;
}

// The header's declared size against the file's, before a byte past the header is read.
void check_declared_size(unsigned __int128 declared, size_t actual, const std::string& path) {
  if (declared == actual) return;
  const std::string d = declared > (unsigned __int128)UINT64_MAX
                            ? std::string("more than 2^64")
                            : std::to_string(static_cast<uint64_t>(declared));
  if (declared > actual)
    throw InputError(path + ": truncated: " + std::to_string(actual) +
                     " bytes, its header declares " + d);
  throw InputError(path + ": " + std::to_string(actual - static_cast<uint64_t>(declared)) +
                   " unexpected trailing bytes (its header declares " + d + ")");
}

namespace {

// Every sequence of a read file consistent: its segment start and NSP label, its masked
// positions inside it and each masked once, every token and masked input inside the vocabulary
// (each refusal naming the sequence).
void check_sequences(const SequencesFile& f, uint64_t n, const std::string& path) {
  std::vector<uint64_t> masked_by(static_cast<size_t>(f.max_seq_len), 0);  // sequence + 1
  for (size_t i = 0; i < n; ++i) {
    int32_t L = f.length(i);
    if (L > f.max_seq_len || f.b_start[i] < 0 || f.b_start[i] > L || f.nsp_label[i] < 0 ||
        f.nsp_label[i] > 1)
      throw InputError(path + ": sequence " + std::to_string(i) +
                       " is inconsistent (corrupt file)");
    for (uint64_t k = f.mlm_offsets[i]; k < f.mlm_offsets[i + 1]; ++k) {
      if (f.mlm_positions[k] < 0 || f.mlm_positions[k] >= L)
        throw InputError(path + ": sequence " + std::to_string(i) + " masks position " +
                         std::to_string(f.mlm_positions[k]) + " outside its " + std::to_string(L) +
                         " tokens");
      // A position masked twice would count twice in the loss.
      uint64_t& seen = masked_by[static_cast<size_t>(f.mlm_positions[k])];
      if (seen == i + 1)
        throw InputError(path + ": sequence " + std::to_string(i) + " masks position " +
                         std::to_string(f.mlm_positions[k]) + " twice (corrupt file)");
      seen = i + 1;
      // The token a masked position is given ([MASK], random or kept): checked here, naming
      // where, not first when a batch of it is made.
      if (f.mlm_inputs[k] < 0 || f.mlm_inputs[k] >= f.vocab_size)
        throw InputError(path + ": sequence " + std::to_string(i) + " gives masked position " +
                         std::to_string(f.mlm_positions[k]) + " the id " +
                         std::to_string(f.mlm_inputs[k]) + ", outside the vocabulary of " +
                         std::to_string(f.vocab_size));
    }
    for (uint64_t k = f.token_offsets[i]; k < f.token_offsets[i + 1]; ++k)
      if (f.tokens[k] < 0 || f.tokens[k] >= f.vocab_size)
        throw InputError(path + ": sequence " + std::to_string(i) + " holds token id " +
                         std::to_string(f.tokens[k]) + ", outside the vocabulary of " +
                         std::to_string(f.vocab_size));
  }
}

}  // namespace

SequencesFile read_sequences(const std::string& path) {
  const io::FileBytes file = io::FileBytes::map(path);
  const std::string_view buf = file.view();
  SequencesFile f;
  f.format_version = check_magic(buf, path, kSeqMagic, sequences_header, "sequences");
  const size_t header = sequences_header(f.format_version);
  Reader r{buf, 16, path};
  uint64_t n = r.get<uint64_t>(), n_tokens = r.get<uint64_t>(), n_mlm = r.get<uint64_t>();
  f.max_seq_len = r.get<int32_t>();
  f.vocab_size = r.get<int32_t>();
  f.vocab_fingerprint = r.get<uint64_t>();
  uint64_t checksum = r.get<uint64_t>();
  if (f.format_version >= 2) {
    f.heldout_begin = r.get<uint64_t>();
    if (f.heldout_begin > n)
      throw InputError(path + ": held-out split starts at sequence " +
                       std::to_string(f.heldout_begin) + " of " + std::to_string(n) +
                       " (corrupt header)");
    if (f.heldout_begin == n) f.heldout_begin = SequencesFile::kNoSplit;
  }
  using u128 = unsigned __int128;
  check_declared_size(declared_size(header, {{(u128(n) + 1) * 8, false},
                                             {u128(n_tokens) * 4, true},
                                             {u128(n) * 4, false},
                                             {u128(n), true},
                                             {(u128(n) + 1) * 8, false},
                                             {u128(n_mlm) * 8, false}}),
                      buf.size(), path);
  if (checksum_of(buf, header, f.format_version) != checksum)
    throw InputError(path + ": checksum mismatch (corrupted file)");
  f.token_offsets = r.get_array<uint64_t>(n + 1, "token offsets");
  f.tokens = r.get_array<int32_t>(n_tokens, "tokens");
  r.skip_pad8();
  f.b_start = r.get_array<int32_t>(n, "segment starts");
  f.nsp_label = r.get_array<int8_t>(n, "NSP labels");
  r.skip_pad8();
  f.mlm_offsets = r.get_array<uint64_t>(n + 1, "MLM offsets");
  f.mlm_positions = r.get_array<int32_t>(n_mlm, "MLM positions");
  f.mlm_inputs = r.get_array<int32_t>(n_mlm, "MLM inputs");
  if (r.pos != buf.size())
    throw InputError(path + ": " + std::to_string(buf.size() - r.pos) +
                     " unexpected trailing bytes");
  check_offsets(f.token_offsets, n_tokens, path, "token");
  check_offsets(f.mlm_offsets, n_mlm, path, "MLM");
  if (f.max_seq_len < 1 || f.max_seq_len > (1 << 20))
    throw InputError(path + ": max_seq_len " + std::to_string(f.max_seq_len) +
                     " is outside [1, 2^20] (corrupt header)");
  check_sequences(f, n, path);
  return f;
}

uint64_t sequences_checksum(const std::string& path) {
  io::require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading");
  char h[kSeqHeaderV1];
  if (!in.read(h, kSeqHeaderV1) || std::memcmp(h, kSeqMagic, 8) != 0)
    throw InputError(path + ": not a packbert sequences file");
  uint64_t c;
  std::memcpy(&c, h + 56, 8);
  return c;
}

void write_packs(const std::string& path, const PacksFile& f) {
  Writer p;
  p.put_array(f.offsets);
  p.put_array(f.ids);
  Writer h = Writer::header(kPackMagic, kPackHeader, {f.packs(), f.ids.size()});
  h.put(f.max_seq_len);
  h.put(f.max_per_pack);
  h.put(f.sequences_checksum);
  h.put(f.lower_bound);
  char algo[16] = {};
  std::strncpy(algo, f.algo.c_str(), sizeof algo - 1);
  h.buf.append(algo, 16);
  h.put(io::fnv1a(p.buf.data(), p.buf.size()));
  io::write_file_atomic(path, h.buf + p.buf);
}

PacksFile read_packs(const std::string& path) {
  const io::FileBytes file = io::FileBytes::map(path);
  const std::string_view buf = file.view();
  const uint32_t version = check_magic(
      buf, path, kPackMagic, [](uint32_t) { return kPackHeader; }, "packs");
  Reader r{buf, 16, path};
  PacksFile f;
  uint64_t n = r.get<uint64_t>(), n_ids = r.get<uint64_t>();
  f.max_seq_len = r.get<int32_t>();
  f.max_per_pack = r.get<int32_t>();
  f.sequences_checksum = r.get<uint64_t>();
  f.lower_bound = r.get<int64_t>();
  char algo[16];
  std::memcpy(algo, buf.data() + r.pos, 16);
  r.pos += 16;
  algo[15] = '\0';
  f.algo = algo;
  uint64_t checksum = r.get<uint64_t>();
  check_declared_size(
      declared_size(kPackHeader, {{(static_cast<unsigned __int128>(n) + 1) * 8, false},
                                  {static_cast<unsigned __int128>(n_ids) * 8, false}}),
      buf.size(), path);
  if (checksum_of(buf, kPackHeader, version) != checksum)
    throw InputError(path + ": checksum mismatch (corrupted file)");
  f.offsets = r.get_array<uint64_t>(n + 1, "pack offsets");
  f.ids = r.get_array<uint64_t>(n_ids, "sequence ids");
  if (r.pos != buf.size())
    throw InputError(path + ": " + std::to_string(buf.size() - r.pos) +
                     " unexpected trailing bytes");
  check_offsets(f.offsets, n_ids, path, "pack");
  f.n_sequences = n_ids;
  return f;
}

std::string file_kind(const std::string& path) {
  io::require_text_input(path);  // (a histogram may come down a pipe; binary files never do)
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open for reading");
  char m[8];
  if (!in.read(m, 8)) return "";
  if (std::memcmp(m, kSeqMagic, 8) == 0) return "sequences";
  if (std::memcmp(m, kPackMagic, 8) == 0) return "packs";
  return "";
}

PacksFile make_packs(const SequencesFile& f, uint64_t checksum, pack::Algo algo,
                     const pack::PackOptions& options, uint64_t seed, pack::PackPlan* plan_out) {
  if (options.max_len < f.max_seq_len)
    throw InputError("`max_seq_len` " + std::to_string(options.max_len) +
                     " is below the sequences' max length " + std::to_string(f.max_seq_len));
  std::vector<int> lengths = f.lengths();
  PacksFile p;
  p.max_seq_len = options.max_len;
  p.max_per_pack = options.max_per_pack;
  p.sequences_checksum = checksum;
  p.n_sequences = f.size();
  p.lower_bound = 0;
  // Training and held-out sequences are packed apart, so no pack mixes the two and training
  // loses no sequence to the held-out split.
  const size_t split = f.has_heldout_split() ? f.heldout_begin : f.size();
  for (auto [begin, end] : {std::pair<size_t, size_t>{0, split}, {split, f.size()}}) {
    if (begin == end) continue;
    std::vector<int> part(lengths.begin() + static_cast<long>(begin),
                          lengths.begin() + static_cast<long>(end));
    pack::PackPlan plan =
        pack::run_packer(algo, pack::histogram_of(part, options.max_len), options);
    pack::PackAssignment a = pack::assign_sequences(plan, part, seed);
    p.algo = plan.algo;
    p.lower_bound =
        plan.lower_bound < 0 || p.lower_bound < 0 ? -1 : p.lower_bound + plan.lower_bound;
    const uint64_t base = p.ids.size();
    for (size_t k = 1; k < a.offsets.size(); ++k)
      p.offsets.push_back(base + static_cast<uint64_t>(a.offsets[k]));
    for (int64_t id : a.ids) p.ids.push_back(begin + static_cast<uint64_t>(id));
    if (plan_out && begin == 0) *plan_out = std::move(plan);
  }
  return p;
}

}  // namespace packbert::data
