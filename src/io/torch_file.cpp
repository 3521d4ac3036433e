#include "io/torch_file.h"

#include <cstring>
#include <map>
#include <memory>
#include <deque>
#include <unordered_map>

#include "error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/zip.h"

namespace packbert::io {

namespace {

// What a global names, resolved by its module and name (nothing is imported or called).
enum class Global { ordered_dict, rebuild_tensor, rebuild_parameter, storage_type };

enum class Kind {
  none,
  boolean,
  integer,
  real,
  string,
  tuple,
  list,
  dict,
  global,
  storage,
  tensor
};

const char* kind_name(Kind k) {
  static const char* names[] = {"None", "bool", "int",    "float",   "str",   "tuple",
                                "list", "dict", "global", "storage", "tensor"};
  return names[static_cast<int>(k)];
}

// One pickled object. Containers hold indexes into the machine's heap, so objects that refer to
// each other (the memo allows cycles) are freed with the heap, never by recursion.
struct Value {
  Kind kind = Kind::none;
  int64_t i = 0;           // int, bool; storage: its element count
  double f = 0;            // float
  std::string s;           // str; storage: its key
  std::vector<int> items;  // tuple, list; dict: key, value, key, value, ...
  Global global{};         // global
  std::string dtype;       // storage type global, storage, tensor: F32, F16, ...
  int storage = -1;        // tensor: the storage value
  int64_t offset = 0;      // tensor: storage offset in elements
  std::vector<int64_t> shape, stride;
};

class Unpickler {
 public:
  Unpickler(std::string_view program, std::string where) : p_(program), where_(std::move(where)) {}

  // Where the program ended (past its STOP): the legacy format puts several pickles in a row.
  size_t end() const { return pos_; }

  // Runs the program to STOP; returns the result's heap index.
  int run() {
    for (;;) {
      at_ = pos_;
      const unsigned char op = byte();
      switch (op) {
        case 0x80:  // PROTO
          if (byte() > 5) fail("pickle protocol above 5");
          break;
        case 0x95:  // FRAME: a length hint
          (void)le(8);
          break;
        case '(':  // MARK
          marks_.push_back(stack_.size());
          break;
        case '.':  // STOP
          if (stack_.size() != 1 || !marks_.empty())
            fail("STOP with a stack of " + std::to_string(stack_.size()));
          return stack_.back();
        case '0':  // POP
          (void)pop();
          break;
        case '1':  // POP_MARK
          (void)pop_mark();
          break;
        case '2':  // DUP
          push_index(top());
          break;
        case 'N':
          push(Kind::none);
          break;
        case 0x88:  // NEWTRUE
        case 0x89:  // NEWFALSE
          push(Kind::boolean).i = op == 0x88;
          break;
        case 'K':  // BININT1
          push(Kind::integer).i = static_cast<int64_t>(le(1));
          break;
        case 'M':  // BININT2
          push(Kind::integer).i = static_cast<int64_t>(le(2));
          break;
        case 'J':  // BININT
          push(Kind::integer).i = static_cast<int32_t>(le(4));
          break;
        case 0x8a:    // LONG1
        case 0x8b: {  // LONG4
          const uint64_t n = le(op == 0x8a ? 1 : 4);
          if (n > 8) fail("integer of " + std::to_string(n) + " bytes");
          uint64_t v = n ? le(static_cast<int>(n)) : 0;
          if (n && n < 8 && (v >> (8 * n - 1) & 1)) v |= ~uint64_t{0} << (8 * n);  // sign
          push(Kind::integer).i = static_cast<int64_t>(v);
          break;
        }
        case 'G': {  // BINFLOAT, big-endian
          uint64_t bits = 0;
          for (int k = 0; k < 8; ++k) bits = bits << 8 | byte();
          double d;
          std::memcpy(&d, &bits, 8);
          push(Kind::real).f = d;
          break;
        }
        case 'X':  // BINUNICODE
        case 'T':  // BINSTRING
        case 'B':  // BINBYTES
          push_string(le(4));
          break;
        case 0x8c:  // SHORT_BINUNICODE
        case 'U':   // SHORT_BINSTRING
        case 'C':   // SHORT_BINBYTES
          push_string(le(1));
          break;
        case 0x8d:  // BINUNICODE8
        case 0x8e:  // BINBYTES8
          push_string(le(8));
          break;
        case ')':
          push(Kind::tuple);
          break;
        case ']':
          push(Kind::list);
          break;
        case '}':
          push(Kind::dict);
          break;
        case 't': {  // TUPLE
          std::vector<int> items = pop_mark();
          push(Kind::tuple).items = std::move(items);
          break;
        }
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          std::vector<int> items(op - 0x84);
          for (size_t k = items.size(); k-- > 0;) items[k] = pop();
          push(Kind::tuple).items = std::move(items);
          break;
        }
        case 'a': {  // APPEND
          const int v = pop();
          of(top(), Kind::list, "APPEND").items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<int> items = pop_mark();
          std::vector<int>& list = of(top(), Kind::list, "APPENDS").items;
          list.insert(list.end(), items.begin(), items.end());
          break;
        }
        case 's': {  // SETITEM
          const int v = pop(), k = pop();
          std::vector<int>& dict = of(top(), Kind::dict, "SETITEM").items;
          dict.push_back(k), dict.push_back(v);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<int> items = pop_mark();
          if (items.size() % 2) fail("SETITEMS with an odd number of items");
          std::vector<int>& dict = of(top(), Kind::dict, "SETITEMS").items;
          dict.insert(dict.end(), items.begin(), items.end());
          break;
        }
        case 'q':  // BINPUT
          memo_[static_cast<uint32_t>(le(1))] = top();
          break;
        case 'r':  // LONG_BINPUT
          memo_[static_cast<uint32_t>(le(4))] = top();
          break;
        case 0x94:  // MEMOIZE
          memo_[static_cast<uint32_t>(memo_.size())] = top();
          break;
        case 'h':    // BINGET
        case 'j': {  // LONG_BINGET
          const uint32_t key = static_cast<uint32_t>(le(op == 'h' ? 1 : 4));
          auto it = memo_.find(key);
          if (it == memo_.end()) fail("memo key " + std::to_string(key) + " was never stored");
          push_index(it->second);
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line(), name = line();
          push_global(module, name);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const std::string name = string_of(pop()), module = string_of(pop());
          push_global(module, name);
          break;
        }
        case 'Q':  // BINPERSID
          push_storage(pop());
          break;
        case 'R': {  // REDUCE
          const int args = pop(), callable = pop();
          reduce(of(callable, Kind::global, "REDUCE"), of(args, Kind::tuple, "REDUCE's arguments"));
          break;
        }
        case 'b': {  // BUILD: state set on an object; only an OrderedDict's attributes (_metadata)
          (void)pop();
          of(top(), Kind::dict, "BUILD");
          break;
        }
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("unsupported pickle opcode ") + hex +
               " (only what torch.save writes for a state_dict is read)");
        }
      }
    }
  }

  const Value& value(int i) const { return heap_[static_cast<size_t>(i)]; }
  size_t heap_size() const { return heap_.size(); }
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(where_ + " byte " + std::to_string(at_) + ": " + what);
  }

 private:
  unsigned char byte() {
    if (pos_ >= p_.size()) fail("pickle ends without STOP");
    return static_cast<unsigned char>(p_[pos_++]);
  }
  uint64_t le(int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= uint64_t{byte()} << (8 * k);
    return v;
  }
  std::string line() {
    const size_t end = p_.find('\n', pos_);
    if (end == std::string_view::npos) fail("GLOBAL without a newline");
    std::string s(p_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }

  Value& push(Kind k) {
    heap_.emplace_back().kind = k;
    stack_.push_back(static_cast<int>(heap_.size() - 1));
    return heap_.back();
  }
  void push_index(int i) { stack_.push_back(i); }
  void push_string(uint64_t n) {
    if (n > p_.size() - pos_) fail("string of " + std::to_string(n) + " bytes runs past the end");
    push(Kind::string).s = std::string(p_.substr(pos_, n));
    pos_ += n;
  }
  int top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back()))
      fail("stack underflow");
    return stack_.back();
  }
  int pop() {
    const int v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<int> pop_mark() {
    if (marks_.empty()) fail("no MARK to pop to");
    std::vector<int> items(stack_.begin() + static_cast<ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Value& of(int i, Kind k, const char* what) {
    Value& v = heap_[static_cast<size_t>(i)];
    if (v.kind != k)
      fail(std::string(what) + " on a " + kind_name(v.kind) + ", expected a " + kind_name(k));
    return v;
  }
  const std::string& string_of(int i) { return of(i, Kind::string, "a name").s; }

  void push_global(const std::string& module, const std::string& name) {
    static const std::pair<const char*, const char*> storages[] = {
        {"FloatStorage", "F32"},  {"HalfStorage", "F16"}, {"BFloat16Storage", "BF16"},
        {"DoubleStorage", "F64"}, {"LongStorage", "I64"}, {"IntStorage", "I32"}};
    Value g;
    g.kind = Kind::global;
    if (module == "collections" && name == "OrderedDict") {
      g.global = Global::ordered_dict;
    } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
      g.global = Global::rebuild_tensor;
    } else if (module == "torch._utils" && name == "_rebuild_parameter") {
      g.global = Global::rebuild_parameter;
    } else {
      for (const auto& [type, dtype] : storages)
        if (module == "torch" && name == type) g.global = Global::storage_type, g.dtype = dtype;
      if (g.dtype.empty())
        fail("refused global '" + module + "." + name +
             "' (a state_dict needs only OrderedDict, torch tensors and the float, half, "
             "bfloat16, double, long and int storages; nothing in the file is executed)");
    }
    heap_.push_back(std::move(g));
    stack_.push_back(static_cast<int>(heap_.size() - 1));
  }

  // ('storage', <storage type>, key, location, numel), and in the legacy format a sixth item,
  // the view metadata (None: storage views are refused).
  void push_storage(int pid) {
    const Value& t = of(pid, Kind::tuple, "a persistent id");
    auto is = [&](size_t k, Kind kind) { return value(t.items[k]).kind == kind; };
    if (t.items.size() == 6 && !is(5, Kind::none))
      fail("a storage view (legacy view metadata): not written by torch.save of a state_dict");
    if ((t.items.size() != 5 && t.items.size() != 6) || !is(0, Kind::string) ||
        value(t.items[0]).s != "storage" ||
        !is(1, Kind::global) || value(t.items[1]).global != Global::storage_type ||
        !is(2, Kind::string) || !is(4, Kind::integer) || value(t.items[4]).i < 0)
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    Value s;
    s.kind = Kind::storage;
    s.dtype = value(t.items[1]).dtype;
    s.s = value(t.items[2]).s;
    s.i = value(t.items[4]).i;
    heap_.push_back(std::move(s));
    stack_.push_back(static_cast<int>(heap_.size() - 1));
  }

  std::vector<int64_t> ints_of(int i, const char* what) {
    std::vector<int64_t> out;
    for (int k : of(i, Kind::tuple, what).items) {
      const Value& v = value(k);
      if (v.kind != Kind::integer) fail(std::string(what) + " holds a non-integer");
      if (v.i < 0)
        fail(std::string(what) + " holds " + std::to_string(v.i) +
             " (negative; torch.save writes sizes and strides of 0 or more)");
      out.push_back(v.i);
    }
    return out;
  }

  void reduce(const Value& callable, const Value& args) {
    const std::vector<int> a = args.items;  // (the heap may grow below)
    switch (callable.global) {
      case Global::ordered_dict:
        if (!a.empty()) fail("OrderedDict with arguments");
        push(Kind::dict);
        return;
      case Global::rebuild_parameter:  // (tensor, requires_grad, backward_hooks)
        if (a.size() != 3)
          fail("_rebuild_parameter with " + std::to_string(a.size()) + " arguments");
        of(a[0], Kind::tensor, "_rebuild_parameter");
        push_index(a[0]);
        return;
      case Global::rebuild_tensor: {
        // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        if (a.size() != 6 && a.size() != 7)
          fail("_rebuild_tensor_v2 with " + std::to_string(a.size()) + " arguments");
        of(a[0], Kind::storage, "_rebuild_tensor_v2");
        const Value& off = of(a[1], Kind::integer, "_rebuild_tensor_v2's offset");
        Value t;
        t.kind = Kind::tensor;
        t.storage = a[0];
        t.dtype = value(a[0]).dtype;
        t.offset = off.i;
        t.shape = ints_of(a[2], "a tensor's size");
        t.stride = ints_of(a[3], "a tensor's stride");
        if (t.offset < 0 || t.shape.size() != t.stride.size())
          fail("a tensor with a negative offset or sizes and strides of different lengths");
        heap_.push_back(std::move(t));
        stack_.push_back(static_cast<int>(heap_.size() - 1));
        return;
      }
      case Global::storage_type:
        fail("a storage type called as a function");
    }
  }

  std::string_view p_;
  std::string where_;
  size_t pos_ = 0, at_ = 0;
  std::deque<Value> heap_;
  std::vector<int> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, int> memo_;
};

// The tensor's elements copied out of its storage in row-major order.
std::string contiguous(const Value& t, std::string_view storage, const std::string& where) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype)),
                numel = static_cast<int64_t>(storage.size()) / es;
  int64_t count = 1, last = t.offset;
  bool past = t.offset > numel;
  for (size_t d = 0; d < t.shape.size() && count > 0; ++d) {
    const int64_t n = t.shape[d], s = t.stride[d];
    if (n == 0) count = 0;
    if (n <= 1) continue;
    if (count > numel / n) throw InputError(where + ": has more elements than its storage");
    count *= n;
    if (s > 0 && n - 1 > (numel - last) / s) past = true;
    if (!past) last += (n - 1) * s;
  }
  if (count > 0 && (past || last >= numel))
    throw InputError(where + ": offset, sizes and strides reach past its storage (" +
                     std::to_string(numel) + " elements)");
  std::string out(static_cast<size_t>(count * es), '\0');
  if (count == 0) return out;
  const size_t dims = t.shape.size();
  // The innermost dimension is copied in one piece when it is contiguous.
  const bool inner = dims > 0 && t.stride[dims - 1] == 1;
  const int64_t run = inner ? t.shape[dims - 1] : 1;
  std::vector<int64_t> idx(dims, 0);
  for (int64_t o = 0; o < count; o += run) {
    int64_t src = t.offset;
    for (size_t d = 0; d < dims; ++d) src += idx[d] * t.stride[d];
    std::memcpy(out.data() + o * es, storage.data() + src * es, static_cast<size_t>(run * es));
    for (size_t d = inner ? dims - 1 : dims; d-- > 0;) {  // odometer over the outer dimensions
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace

std::vector<TorchTensor> read_torch_file(const std::string& path) {
  return parse_torch_file(FileBytes::map(path), path);
}

namespace {

// The state_dict a pickle built (or the one a training checkpoint holds under "state_dict" or
// "model"), its tensors copied out of their storages; `storage_bytes` gives a storage's bytes by
// key.
template <typename StorageBytes>
std::vector<TorchTensor> state_dict_tensors(const Unpickler& vm, int result,
                                            const std::string& source,
                                            StorageBytes storage_bytes) {
  auto is_state_dict = [&](const Value& d) {
    if (d.kind != Kind::dict) return false;
    for (size_t k = 0; k < d.items.size(); k += 2)
      if (vm.value(d.items[k]).kind != Kind::string ||
          vm.value(d.items[k + 1]).kind != Kind::tensor)
        return false;
    return true;
  };
  const Value* dict = &vm.value(result);
  if (dict->kind == Kind::dict && !is_state_dict(*dict))
    for (size_t k = 0; k < dict->items.size(); k += 2) {
      const Value& key = vm.value(dict->items[k]);
      if (key.kind == Kind::string && (key.s == "state_dict" || key.s == "model") &&
          is_state_dict(vm.value(dict->items[k + 1]))) {
        dict = &vm.value(dict->items[k + 1]);
        break;
      }
    }
  if (!is_state_dict(*dict))
    throw InputError(source + ": holds a " + kind_name(dict->kind) +
                     " that is not a state_dict (a dict of tensors by name)");

  std::vector<TorchTensor> out;
  for (size_t k = 0; k < dict->items.size(); k += 2) {
    const Value& t = vm.value(dict->items[k + 1]);
    const Value& storage = vm.value(t.storage);
    TorchTensor o{vm.value(dict->items[k]).s, t.dtype, t.shape, {}};
    const std::string where = source + ": " + o.name;
    const std::string_view bytes_of = storage_bytes(storage.s);
    const int64_t es = static_cast<int64_t>(dtype_size(t.dtype));
    if (bytes_of.size() % es || static_cast<int64_t>(bytes_of.size()) / es != storage.i)
      throw InputError(where + ": its storage '" + storage.s + "' holds " +
                       std::to_string(bytes_of.size()) + " bytes, expected " +
                       std::to_string(storage.i) + " " + t.dtype + " elements");
    o.data = contiguous(t, bytes_of, where);
    out.push_back(std::move(o));
  }
  return out;
}

// The legacy format (torch.save before 1.6, or with _use_new_zipfile_serialization=False): five
// pickles in a row (the magic number, the protocol version 1001, the sys_info dict, the object,
// the list of storage keys), then each storage in that order as an 8-byte little-endian element
// count and its raw bytes. The pickles run on the same refusing machine as the zip format's.
std::vector<TorchTensor> parse_legacy(std::string_view b, const std::string& source) {
  // The magic number 0x1950a86a20f9469cfc6c, pickled as LONG1 of 10 bytes (wider than the machine's
  // integers, so matched as bytes).
  static const std::string_view kMagic("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
  if (b.substr(0, kMagic.size()) != kMagic)
    throw InputError(source + ": starts like a pickle but not like torch.save's legacy format "
                              "(no magic number)");
  size_t at = kMagic.size();
  auto next_pickle = [&](const char* what) {
    auto vm = std::make_unique<Unpickler>(b.substr(at), source + ": legacy " + what);
    const int result = vm->run();
    at += vm->end();
    return std::pair{std::move(vm), result};
  };
  {
    auto [vm, v] = next_pickle("protocol version");
    if (vm->value(v).kind != Kind::integer || vm->value(v).i != 1001)
      throw InputError(source + ": legacy protocol version is not 1001");
  }
  {
    auto [vm, v] = next_pickle("sys_info");
    const Value& info = vm->value(v);
    bool little = false;
    if (info.kind == Kind::dict)
      for (size_t k = 0; k < info.items.size(); k += 2)
        if (vm->value(info.items[k]).kind == Kind::string &&
            vm->value(info.items[k]).s == "little_endian")
          little = vm->value(info.items[k + 1]).kind == Kind::boolean &&
                   vm->value(info.items[k + 1]).i == 1;
    if (!little) throw InputError(source + ": big-endian tensors are not supported");
  }
  auto [object, result] = next_pickle("object");
  auto [key_vm, keys_v] = next_pickle("storage keys");
  const Value& keys = key_vm->value(keys_v);
  if (keys.kind != Kind::list)
    throw InputError(source + ": legacy storage keys are a " + kind_name(keys.kind) +
                     ", expected a list");
  std::map<std::string, std::string_view> storages;  // key -> its bytes in the file
  for (int k : keys.items) {
    const Value& key = key_vm->value(k);
    if (key.kind != Kind::string) throw InputError(source + ": a legacy storage key is not a string");
    if (b.size() - at < 8)
      throw InputError(source + ": truncated: storage '" + key.s + "' has no element count");
    uint64_t numel = 0;
    for (int i = 7; i >= 0; --i) numel = numel << 8 | static_cast<uint8_t>(b[at + i]);
    at += 8;
    // The element size is the storage type's: find it among the object's storages.
    size_t es = 0;
    for (size_t h = 0; h < object->heap_size(); ++h) {
      const Value& v = object->value(static_cast<int>(h));
      if (v.kind == Kind::storage && v.s == key.s) es = dtype_size(v.dtype);
    }
    if (es == 0) throw InputError(source + ": storage '" + key.s + "' is used by no tensor");
    if (numel > (b.size() - at) / es)
      throw InputError(source + ": truncated: storage '" + key.s + "' declares " +
                       std::to_string(numel) + " elements past the end of the file");
    storages[key.s] = b.substr(at, numel * es);
    at += numel * es;
  }
  if (at != b.size())
    throw InputError(source + ": " + std::to_string(b.size() - at) +
                     " unexpected trailing bytes after the legacy storages");
  return state_dict_tensors(*object, result, source, [&](const std::string& key) {
    auto it = storages.find(key);
    if (it == storages.end())
      throw InputError(source + ": no storage '" + key + "' in the legacy file");
    return it->second;
  });
}

}  // namespace

std::vector<TorchTensor> parse_torch_file(FileBytes file, const std::string& source) {
  const std::string_view bytes = file.view();
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80)
    return parse_legacy(bytes, source);
  if (bytes.substr(0, 2) != "PK")
    throw InputError(source + ": not a PyTorch file (torch.save writes a zip archive)");
  const ZipArchive zip = ZipArchive::parse(std::move(file), source);
  std::string prefix;
  int pickles = 0;
  for (const auto& [name, e] : zip.entries()) {
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash) == "/data.pkl")
      prefix = name.substr(0, slash + 1), ++pickles;
  }
  if (pickles != 1)
    throw InputError(source + ": " + (pickles ? "several" : "no") +
                     " <archive>/data.pkl entries (not written by torch.save)");
  if (zip.has(prefix + "byteorder") && zip.bytes(prefix + "byteorder") != "little")
    throw InputError(source + ": big-endian tensors are not supported");
  Unpickler vm(zip.bytes(prefix + "data.pkl"), source + ": data.pkl");
  const int result = vm.run();
  return state_dict_tensors(vm, result, source, [&](const std::string& key) {
    return zip.bytes(prefix + "data/" + key);
  });
}

}  // namespace packbert::io
