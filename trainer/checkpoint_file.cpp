#include "trainer/checkpoint_file.h"

#include <hdf5.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "core/check.h"
#include "core/hash.h"
#include "core/progress.h"
#include "data/h5.h"
#include "data/tokenizer.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
constexpr int kFormatVersion = 1;       // moments in the file
constexpr int kPartsFormatVersion = 2;  // moments in parts beside it
constexpr int kWeightPartsFormatVersion = 3;  // the trainable weights in the parts too
constexpr const char* kPartFormat = "dhp-checkpoint-moments";
constexpr const char* kFormat = "dhp-checkpoint";

// A failed write names what was being written and why it failed.
void h5_check(bool ok, const std::string& what) {
  if (!ok) throw Error(fmt::format("{}: {}", what, hdf5_reason()));
}

// An array's checksum: wide_hash under the attribute "wide_checksum"; checkpoints written before
// it carry FNV-1a under "checksum", and still load.
constexpr const char* kArrayChecksum = "wide_checksum";
constexpr const char* kFnvChecksum = "checksum";
uint64_t checksum(const float* x, int64_t n) { return wide_hash(x, size_t(n) * sizeof(float)); }

// Whether `loc` has a link `name`. HDF5 answers negative when the file's structure around it
// cannot be read: that is damage, and must not be reported as a name the model lacks.
bool has_link(hid_t loc, const std::string& name, const std::string& where) {
  const htri_t found = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
  DHP_CHECK(found >= 0, "{}: looking up {} failed ({}): the file is damaged", where, name,
            hdf5_reason());
  return found > 0;
}

void write_attr_i64(hid_t obj, const char* name, int64_t v) {
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 a(H5Acreate2(obj, name, H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  h5_check(a.ok() && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0, fmt::format("writing attribute {}", name));
}

void write_attr_u64(hid_t obj, const char* name, uint64_t v) {
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 a(H5Acreate2(obj, name, H5T_NATIVE_UINT64, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  h5_check(a.ok() && H5Awrite(a, H5T_NATIVE_UINT64, &v) >= 0, fmt::format("writing attribute {}", name));
}

bool read_attr(hid_t obj, const char* name, hid_t type, void* out) {
  if (H5Aexists(obj, name) <= 0) return false;
  H5 a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  return a.ok() && H5Aread(a, type, out) >= 0;
}

// A fixed-length string attribute, or "" when absent or not a string.
std::string read_string_attr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return "";
  H5 a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5 type(H5Aget_type(a), H5Tclose);
  if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) > 0) return "";
  std::string s(H5Tget_size(type), '\0');
  if (H5Aread(a, type, s.data()) < 0) return "";
  s.resize(std::strlen(s.c_str()));
  return s;
}

hid_t string_type(size_t n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, std::max<size_t>(n, 1));
  return t;
}

void write_string_attr(hid_t obj, const char* name, const std::string& s) {
  H5 type(string_type(s.size()), H5Tclose);
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  h5_check(a.ok() && H5Awrite(a, type, s.c_str()) >= 0, fmt::format("writing attribute {}", name));
}

void write_string(hid_t loc, const char* name, const std::string& s) {
  H5 type(string_type(s.size()), H5Tclose);
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 d(H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  h5_check(d.ok() && H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.c_str()) >= 0,
           fmt::format("writing {}", name));
  // As for tensors: a flipped digit in the config would otherwise resume another run.
  write_attr_u64(d, kFnvChecksum, fnv1a(s.data(), s.size()));
}

std::string read_string(hid_t loc, const char* name, const std::string& path) {
  DHP_CHECK(has_link(loc, name, fmt::format("checkpoint '{}'", path)), "checkpoint '{}' has no {}",
            path, name);
  H5 d(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose);
  H5 type(H5Dget_type(d), H5Tclose);
  std::string s(H5Tget_size(type), '\0');
  H5 mem(string_type(s.size()), H5Tclose);
  DHP_CHECK(d.ok() && type.ok() && H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.data()) >= 0,
            "checkpoint '{}': {} cannot be read ({}): the file is damaged", path, name,
            hdf5_reason());
  s.resize(std::strlen(s.c_str()));
  uint64_t want = 0;  // checkpoints written before strings had checksums have none
  if (read_attr(d, kFnvChecksum, H5T_NATIVE_UINT64, &want))
    DHP_CHECK(fnv1a(s.data(), s.size()) == want,
              "checkpoint '{}': {} does not match its checksum: the file is damaged", path, name);
  return s;
}

// A float array `name` of shape `dims` with its checksum attribute.
void write_array(hid_t loc, const std::string& name, const std::vector<int64_t>& shape, const float* x,
                 int64_t n) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  H5 space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5 d(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
       H5Dclose);
  h5_check(d.ok() && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0,
           fmt::format("writing tensor {}", name));
  write_attr_u64(d, kArrayChecksum, checksum(x, n));
}

void write_tensor(hid_t group, const ParamSpec& spec, const float* x) {
  write_array(group, spec.name, spec.shape, x, spec.numel());
}

// Reads float array `name` of `shape` into x after checking the shape, its checksum (returned)
// and that every value is finite; `where` names it in messages.
uint64_t read_array(hid_t loc, const std::string& name, const std::vector<int64_t>& shape, float* x,
                    int64_t n, const std::string& where) {
  DHP_CHECK(has_link(loc, name, where),
            "{} is missing (was it saved by a different model configuration?)", where);
  H5 d(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  DHP_CHECK(d.ok(), "{} cannot be opened: the file is damaged", where);
  H5 space(H5Dget_space(d), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(std::max(rank, 0));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const std::vector<int64_t> found(dims.begin(), dims.end());
  DHP_CHECK(found == shape, "{} has shape [{}], the model expects [{}]", where, fmt::join(found, ", "),
            fmt::join(shape, ", "));
  DHP_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) >= 0,
            "{} cannot be read: the file is damaged or truncated", where);
  uint64_t want = 0, got = 0;
  if (read_attr(d, kArrayChecksum, H5T_NATIVE_UINT64, &want)) {
    got = checksum(x, n);
  } else {
    DHP_CHECK(read_attr(d, kFnvChecksum, H5T_NATIVE_UINT64, &want), "{} has no checksum", where);
    got = fnv1a(x, size_t(n) * sizeof(float));
  }
  DHP_CHECK(got == want, "{} does not match its checksum: the file is damaged; refusing to load it", where);
  DHP_CHECK(std::all_of(x, x + n, [](float f) { return std::isfinite(f); }),
            "{} holds non-finite values (NaN or infinity): the run that saved it had diverged; "
            "refusing to load it",
            where);
  return want;
}

void read_tensor(hid_t group, const std::string& gname, const ParamSpec& spec, float* x,
                 const std::string& path) {
  read_array(group, spec.name, spec.shape, x, spec.numel(),
             fmt::format("checkpoint '{}': {}/{}", path, gname, spec.name));
}

void write_u64s(hid_t loc, const char* name, const std::vector<uint64_t>& x) {
  const hsize_t n = x.size();
  H5 space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5 d(H5Dcreate2(loc, name, H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  h5_check(d.ok() && H5Dwrite(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()) >= 0,
           fmt::format("writing {}", name));
}

void write_format(hid_t file, const char* format, int64_t version) {
  H5 root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose);
  write_string_attr(root, "format", format);
  write_attr_i64(root, "format_version", version);
}

// The format version of an open file whose root says `format`; throws naming `path` otherwise.
int64_t read_format(hid_t file, const char* format, const std::string& path, const char* what) {
  H5 root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose);
  // The root's header unreadable is damage, not another program's file.
  DHP_CHECK(root.ok() && H5Aexists(root, "format") >= 0,
            "{} '{}': its root cannot be read ({}): the file is damaged", what, path, hdf5_reason());
  int64_t version = 0;
  DHP_CHECK(read_string_attr(root, "format") == format &&
                read_attr(root, "format_version", H5T_NATIVE_INT64, &version),
            "'{}' is not a dhp {} (no format = \"{}\" and format_version)", path, what, format);
  return version;
}

// One '0' or '1' per parameter in table order: which ones the compact layout holds.
std::string trainable_mask(const ParamTable& table) {
  std::string mask;
  for (const auto& p : table.specs()) mask += p.trainable ? '1' : '0';
  return mask;
}

// What a main file records of its parts (format_version 2 and 3).
struct PartsRecord {
  std::string path;           // the main file
  int world = 0;
  int per_part = 2;           // checksums per part: m, v (and w)
  std::string mask;           // one '0' or '1' per parameter in table order
  std::vector<uint64_t> sums;
  int64_t n = 0;              // compact elements (the trainable parameters when saved)
  // Format 3: the trained parameters by name: their compact offset and shape.
  struct Weight {
    int64_t at;
    std::vector<int64_t> shape;
  };
  std::map<std::string, Weight> weights;

  // Part r's dataset `name` (m, v or w: checksum k of the part), verified against the record.
  std::vector<float> read(int r, const char* name, int k) const {
    const auto [begin, end] = AdamW::save_part(n, r, world);
    const fs::path file_path = moment_part_path(path, r, world);
    const std::string at = file_path.string();
    DHP_CHECK(fs::is_regular_file(file_path),
              "checkpoint '{}' keeps its optimizer moments{} in {} parts beside it and part {} ('{}') is "
              "missing: copy every {}.optim-*.h5 with it", path, per_part == 3 ? " and trainable weights" : "",
              world, r, at, fs::path(path).stem().string());
    H5 file(H5Fopen(at.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    DHP_CHECK(file.ok(), "'{}' is not a readable HDF5 file (damaged or truncated part of checkpoint '{}')", at, path);
    read_format(file, kPartFormat, at, "checkpoint part");
    std::vector<float> x(size_t(end - begin));
    const uint64_t sum = read_array(file, name, {end - begin}, x.data(), end - begin,
                                    fmt::format("checkpoint part '{}': {}", at, name));
    DHP_CHECK(sum == sums[size_t(per_part * r + k)],
              "checkpoint part '{}' is not the one '{}' was saved with (its checksums differ from those the "
              "checkpoint records): it belongs to another save", at, path);
    return x;
  }
  // The part holding compact offset a (AdamW::save_part: parts of n / world, the last to the end).
  int part_of(int64_t a) const {
    const int64_t s = n / world;
    return s == 0 ? world - 1 : int(std::min<int64_t>(a / s, world - 1));
  }
};

std::vector<uint64_t> read_u64s(hid_t loc, const char* name, size_t count, const std::string& path) {
  std::vector<uint64_t> x(count);
  H5 d(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose);
  H5 space(d.ok() ? H5Dget_space(d) : -1, H5Sclose);
  DHP_CHECK(space.ok() && H5Sget_simple_extent_npoints(space) == hssize_t(count) &&
                H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, x.data()) >= 0,
            "checkpoint '{}': /optim/{} is missing or damaged", path, name);
  return x;
}

PartsRecord read_parts_record(hid_t file, const std::string& path, int64_t version) {
  PartsRecord rec;
  rec.path = path;
  H5 optim(H5Gopen2(file, "optim", H5P_DEFAULT), H5Gclose);
  int64_t world = 0;
  DHP_CHECK(optim.ok() && read_attr(optim, "parts", H5T_NATIVE_INT64, &world) && world >= 1 && world <= (1 << 20),
            "checkpoint '{}': /optim parts is missing or damaged", path);
  rec.world = int(world);
  rec.per_part = version == kWeightPartsFormatVersion ? 3 : 2;
  rec.mask = read_string_attr(optim, "trainable");
  rec.sums = read_u64s(optim, "part_checksums", size_t(rec.per_part * world), path);
  if (rec.per_part == 3) {
    // One line a parameter: its name and shape ("name 4096,4096").
    std::istringstream names(read_string(optim, "weight_names", path));
    std::vector<std::pair<std::string, std::vector<int64_t>>> list;
    for (std::string line; std::getline(names, line);) {
      const size_t space = line.rfind(' ');
      DHP_CHECK(space != std::string::npos && space > 0, "checkpoint '{}': /optim/weight_names is damaged", path);
      std::vector<int64_t> shape;
      std::istringstream dims(line.substr(space + 1));
      for (std::string d; std::getline(dims, d, ',');) {
        DHP_CHECK(!d.empty() && d.size() <= 12 && d.find_first_not_of("0123456789") == std::string::npos,
                  "checkpoint '{}': /optim/weight_names is damaged", path);
        shape.push_back(std::stoll(d));
      }
      list.emplace_back(line.substr(0, space), std::move(shape));
    }
    const std::vector<uint64_t> at = read_u64s(optim, "weight_offsets", list.size() + 1, path);
    for (size_t i = 0; i < list.size(); ++i) {
      int64_t numel = 1;
      for (const int64_t d : list[i].second) numel *= d;
      DHP_CHECK(at[i] + uint64_t(numel) <= at[i + 1], "checkpoint '{}': /optim/weight_offsets is damaged", path);
      rec.weights.emplace(list[i].first, PartsRecord::Weight{int64_t(at[i]), std::move(list[i].second)});
    }
    rec.n = int64_t(at.back());
  }
  return rec;
}

// Moments kept in parts (format_version 2 and 3) loaded into `opt`: each rank reads the parts
// that hold moments it keeps, all of them verified before any is taken. A checkpoint whose
// trainable parameters differ from this run's (a group frozen or thawed since) is mapped
// through the weight arena's layout, as the moments of a one-file checkpoint are.
void load_moment_parts(const PartsRecord& rec, const ParamTable& table, AdamW& opt) {
  const std::string& mask = rec.mask;
  DHP_CHECK(mask.size() == table.specs().size(),
            "checkpoint '{}': /optim trainable lists {} parameters, the model has {}", rec.path, mask.size(),
            table.specs().size());
  // The recorded layout: its trainable parameters, each aligned as the gradient layout aligns it.
  int64_t n = 0;
  for (size_t i = 0; i < mask.size(); ++i) n += mask[i] == '1' ? table.specs()[i].padded() : 0;
  DHP_CHECK(rec.per_part == 2 || rec.n == n, "checkpoint '{}': its parts hold {} elements, the recorded layout {}",
            rec.path, rec.n, n);
  PartsRecord sized = rec;
  sized.n = n;
  const bool same_layout = mask == trainable_mask(table);
  struct Part {
    int64_t begin;
    std::vector<float> m, v;
  };
  std::vector<Part> parts;
  for (int r = 0; r < rec.world; ++r) {
    const auto [begin, end] = AdamW::save_part(n, r, rec.world);
    if (same_layout && !opt.holds_any(begin, end)) continue;
    parts.push_back(Part{begin, sized.read(r, "m", 0), sized.read(r, "v", 1)});
  }
  if (same_layout) {
    for (const Part& p : parts) opt.upload_compact(p.begin, int64_t(p.m.size()), p.m.data(), p.v.data());
    return;
  }
  std::vector<float> m(size_t(table.total()), 0.0f), v(size_t(table.total()), 0.0f);
  std::vector<float> cm, cv;
  for (Part& p : parts) cm.insert(cm.end(), p.m.begin(), p.m.end()), cv.insert(cv.end(), p.v.begin(), p.v.end());
  int64_t at = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != '1') continue;
    const ParamSpec& s = table.specs()[i];
    std::copy_n(cm.begin() + at, s.numel(), m.begin() + s.offset);
    std::copy_n(cv.begin() + at, s.numel(), v.begin() + s.offset);
    at += s.padded();
  }
  opt.upload_moments(m, v);
}

// A file about to be opened as a checkpoint: there, and then opened read-only.
H5 open_existing(const std::string& path) {
  quiet_hdf5();
  DHP_CHECK(fs::is_regular_file(path), "checkpoint '{}' not found", path);
  return H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
}

}  // namespace

// A checkpoint file opened for reading: a readable HDF5 file of a format version this dhp
// reads, its /params group open. load_checkpoint and CheckpointWeights open files this way.
struct OpenCheckpoint {
  explicit OpenCheckpoint(const std::string& p) : path(p), file(open_existing(p)) {
    DHP_CHECK(file.ok(), "'{}' is not a readable HDF5 file (damaged or truncated checkpoint)", path);
    version = read_format(file, kFormat, path, "checkpoint");
    DHP_CHECK(version >= kFormatVersion && version <= kWeightPartsFormatVersion,
              "checkpoint '{}' has format version {}; this dhp reads {} to {}", path, version, kFormatVersion,
              kWeightPartsFormatVersion);
    DHP_CHECK(has_link(file, "params", fmt::format("checkpoint '{}'", path)), "checkpoint '{}' has no /params", path);
    params.emplace(H5Gopen2(file, "params", H5P_DEFAULT), H5Gclose);
    if (version == kWeightPartsFormatVersion) parts.emplace(read_parts_record(file, path, version));
  }
  // Where `spec`'s weights are in the parts (format 3, trained when saved): its compact offset,
  // after checking its recorded shape is the model's.
  std::optional<int64_t> in_parts(const ParamSpec& spec) const {
    if (!parts) return std::nullopt;
    const auto it = parts->weights.find(spec.name);
    if (it == parts->weights.end()) return std::nullopt;
    DHP_CHECK(it->second.shape == spec.shape, "checkpoint '{}': {} has shape [{}], the model expects [{}]", path,
              spec.name, fmt::join(it->second.shape, ", "), fmt::join(spec.shape, ", "));
    return it->second.at;
  }
  std::string path;
  H5 file;
  int64_t version = 0;
  std::optional<H5> params;
  std::optional<PartsRecord> parts;  // format 3
};

namespace {

// The weights of a format-3 checkpoint into `model`, streamed: the frozen ones from /params a
// tensor at a time, the trained ones from the parts a part at a time, each verified before
// any of it is taken, and only the parts holding something the model keeps (under ZeRO-3 a
// rank keeps the weights outside the decoder layers and its own block). A damaged part found
// after others were taken leaves the model partly replaced: the caller loads another
// checkpoint over it or stops.
void stream_weights(const OpenCheckpoint& open, Model& model) {
  const ParamTable& table = model.table();
  std::vector<const ParamSpec*> from_parts;
  std::vector<float> x;
  for (const auto& s : table.specs()) {
    if (open.in_parts(s)) {
      from_parts.push_back(&s);
      continue;
    }
    x.resize(size_t(s.numel()));
    read_tensor(*open.params, "params", s, x.data(), open.path);
    model.write_params(s.offset, x.data(), s.numel());
  }
  const PartsRecord& rec = *open.parts;
  // f(spec, compact [a, b), offset of a in the spec) for the trained tensors' pieces in [begin, end).
  auto pieces = [&](int64_t begin, int64_t end, auto&& f) {
    for (const ParamSpec* s : from_parts) {
      const int64_t at = *open.in_parts(*s), a = std::max(at, begin), b = std::min(at + s->numel(), end);
      if (a < b) f(*s, a, b, a - at);
    }
  };
  for (int r = 0; r < rec.world; ++r) {
    const auto [begin, end] = AdamW::save_part(rec.n, r, rec.world);
    bool needed = false;
    pieces(begin, end, [&](const ParamSpec& s, int64_t a, int64_t b, int64_t in) {
      needed = needed || model.keeps_any(s.offset + in, b - a);
    });
    if (!needed) continue;
    const std::vector<float> w = rec.read(r, "w", 2);
    pieces(begin, end, [&](const ParamSpec& s, int64_t a, int64_t b, int64_t in) {
      model.write_params(s.offset + in, w.data() + (a - begin), b - a);
    });
  }
}

}  // namespace

SaveSnapshot snapshot_for_save(const Model& model, const AdamW* opt, const MomentParts& parts) {
  SaveSnapshot snap;
  if (opt && parts.weights) {
    // The trainable weights are in the parts: the frozen ones alone, in table order.
    for (const ParamSpec& s : model.table().specs()) {
      if (s.trainable) continue;
      snap.weights.resize(snap.weights.size() + size_t(s.numel()));
      model.read_params(s.offset, s.numel(), snap.weights.data() + (snap.weights.size() - size_t(s.numel())));
    }
  } else {
    // One rank (several write their weights in parts): its weights are whole.
    snap.weights = model.download_params();
  }
  snap.optimizer = opt != nullptr;
  if (!opt) return snap;
  snap.optimizer_step = opt->steps_taken();
  if (parts.world == 0) snap.m = opt->download_m(), snap.v = opt->download_v();
  return snap;
}

void write_checkpoint_file(const std::filesystem::path& tmp, const Config& cfg, const Model& model,
                           const AdamW* opt, const TrainState& st, const MomentParts& parts) {
  write_checkpoint_file(tmp, cfg, model.table(), snapshot_for_save(model, opt, parts), st, parts);
}

void write_checkpoint_file(const std::filesystem::path& tmp, const Config& cfg, const ParamTable& table,
                           const SaveSnapshot& snap, const TrainState& st, const MomentParts& parts,
                           bool show) {
  quiet_hdf5();
  H5 file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, newest_format_access()), H5Fclose);
  h5_check(file.ok(), fmt::format("cannot create checkpoint file '{}'", tmp.string()));
  const bool in_parts = snap.optimizer && parts.world > 0;
  const bool weights_in_parts = in_parts && parts.weights;
  int64_t frozen = 0;  // elements of the frozen parameters, one after the other
  for (const auto& s : table.specs()) frozen += s.trainable ? 0 : s.numel();
  DHP_ASSERT(int64_t(snap.weights.size()) == (weights_in_parts ? frozen : table.total()));
  write_format(file, kFormat,
               weights_in_parts ? kWeightPartsFormatVersion : in_parts ? kPartsFormatVersion : kFormatVersion);
  write_string(file, "config", to_toml(cfg));
  const int64_t param_bytes = int64_t(snap.weights.size()) * int64_t(sizeof(float));
  ByteProgress progress(fmt::format("saving {}", tmp.filename().replace_extension().string()),
                        param_bytes * (snap.optimizer && !in_parts ? 3 : 1), show);
  {
    H5 params(H5Gcreate2(file, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    int64_t at = 0;  // weights_in_parts: the next frozen parameter's
    for (const auto& s : table.specs()) {
      if (weights_in_parts && s.trainable) continue;
      write_tensor(params, s, snap.weights.data() + (weights_in_parts ? at : s.offset));
      at += s.numel();
      progress.add(s.numel() * int64_t(sizeof(float)));
    }
  }
  if (snap.optimizer) {
    H5 optim(H5Gcreate2(file, "optim", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    write_attr_i64(optim, "step", snap.optimizer_step);
    if (in_parts) {
      DHP_ASSERT(parts.checksums.size() == size_t(parts.per_part() * parts.world));
      write_attr_i64(optim, "parts", parts.world);
      write_string_attr(optim, "trainable", trainable_mask(table));
      write_u64s(optim, "part_checksums", parts.checksums);
      if (weights_in_parts) {
        std::string names;
        std::vector<uint64_t> offsets;
        for (const auto& s : table.specs())
          if (s.trainable) names += fmt::format("{} {}\n", s.name, fmt::join(s.shape, ",")), offsets.push_back(uint64_t(s.grad_offset));
        offsets.push_back(uint64_t(table.trainable_total()));
        write_string(optim, "weight_names", names);
        write_u64s(optim, "weight_offsets", offsets);
      }
    } else {
      DHP_ASSERT(int64_t(snap.m.size()) == table.total() && int64_t(snap.v.size()) == table.total());
      H5 m(H5Gcreate2(optim, "m", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      H5 v(H5Gcreate2(optim, "v", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      for (const auto& s : table.specs()) {
        write_tensor(m, s, snap.m.data() + s.offset);
        write_tensor(v, s, snap.v.data() + s.offset);
        progress.add(2 * s.numel() * int64_t(sizeof(float)));
      }
    }
  }
  {
    H5 state(H5Gcreate2(file, "state", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    write_attr_i64(state, "step", st.step);
    write_attr_u64(state, "seed", st.seed);
    write_attr_i64(state, "batch_size", st.batch_size);
    write_attr_i64(state, "sampler_epoch", st.sampler.epoch);
    write_attr_i64(state, "sampler_position", st.sampler.position);
    write_attr_i64(state, "dataset_size", st.dataset_size);
    if (st.tokenizer_hash != 0) write_attr_u64(state, "tokenizer_hash", st.tokenizer_hash);
    if (!st.special_ids.empty()) write_string_attr(state, "special_ids", st.special_ids);
    if (!st.added_tokens.empty()) write_string_attr(state, "added_tokens", st.added_tokens);
  }
  if (!st.cost_state.empty()) write_string(file, "cost_model", st.cost_state);
  h5_check(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, fmt::format("flushing '{}'", tmp.string()));
}

fs::path moment_part_path(const fs::path& main, int rank, int world) {
  fs::path p = main;
  return p.replace_extension(fmt::format(".optim-{:05d}-of-{:05d}.h5", rank, world));
}

int64_t checkpoint_file_step(const fs::path& p) {
  std::string name = p.filename().string();
  if (name.size() > 4 && name.ends_with(".tmp")) name.resize(name.size() - 4);
  if (!name.ends_with(".h5") || name.rfind("step-", 0) != 0 || name.size() < 16) return -1;
  const std::string digits = name.substr(5, 8);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  const std::string rest = name.substr(13, name.size() - 16);  // between the step and ".h5"
  const bool part = rest.size() == 21 && rest.rfind(".optim-", 0) == 0 && rest.substr(12, 4) == "-of-" &&
                    (rest.substr(7, 5) + rest.substr(16)).find_first_not_of("0123456789") == std::string::npos;
  return rest.empty() || part ? std::stoll(digits) : -1;
}

uint64_t moment_checksum(const std::vector<float>& x) { return checksum(x.data(), int64_t(x.size())); }

void write_moment_part(const fs::path& path, int64_t step, int rank, int world, int64_t begin,
                       const std::vector<float>& m, const std::vector<float>& v, const std::vector<float>* w,
                       bool show) {
  quiet_hdf5();
  H5 file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, newest_format_access()), H5Fclose);
  h5_check(file.ok(), fmt::format("cannot create checkpoint part '{}'", path.string()));
  write_format(file, kPartFormat, 1);
  {
    H5 root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose);
    write_attr_i64(root, "step", step);
    write_attr_i64(root, "rank", rank);
    write_attr_i64(root, "world", world);
    write_attr_i64(root, "begin", begin);
  }
  ByteProgress progress(fmt::format("saving {}", path.filename().replace_extension().string()),
                        int64_t((2 + (w ? 1 : 0)) * m.size() * sizeof(float)), show);
  const std::vector<int64_t> shape{int64_t(m.size())};
  write_array(file, "m", shape, m.data(), int64_t(m.size()));
  progress.add(int64_t(m.size() * sizeof(float)));
  write_array(file, "v", shape, v.data(), int64_t(v.size()));
  progress.add(int64_t(v.size() * sizeof(float)));
  if (w) {
    DHP_ASSERT(w->size() == m.size());
    write_array(file, "w", shape, w->data(), int64_t(w->size()));
    progress.add(int64_t(w->size() * sizeof(float)));
  }
  h5_check(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, fmt::format("flushing '{}'", path.string()));
}

// The step a checkpoint file records in /state, or -1 when it cannot be read.
int64_t recorded_step(const std::string& path) {
  quiet_hdf5();
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok() || H5Lexists(file, "state", H5P_DEFAULT) <= 0) return -1;
  H5 state(H5Gopen2(file, "state", H5P_DEFAULT), H5Gclose);
  int64_t step = -1;
  return state.ok() && read_attr(state, "step", H5T_NATIVE_INT64, &step) ? step : -1;
}

Config checkpoint_config(const std::string& path, const std::vector<std::string>& overrides, bool check) {
  quiet_hdf5();
  DHP_CHECK(fs::is_regular_file(path), "checkpoint '{}' not found", path);
  H5 file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  DHP_CHECK(file.ok(), "'{}' is not a readable HDF5 file (damaged or truncated checkpoint)", path);
  return parse_config(read_string(file, "config", path), path + ":/config", overrides, check);
}

TrainState load_checkpoint(const std::string& path, Model& model, AdamW* opt) {
  const std::string where = fmt::format("checkpoint '{}'", path);
  const OpenCheckpoint open(path);
  const H5& file = open.file;
  const int64_t version = open.version;
  // Formats 1 and 2: loaded fully before anything is replaced; format 3 streams (below).
  std::vector<float> staged(open.parts ? 0 : model.n_params());
  if (!open.parts)
    for (const auto& s : model.table().specs()) read_tensor(*open.params, "params", s, staged.data() + s.offset, path);

  TrainState st;
  H5 state(H5Gopen2(file, "state", H5P_DEFAULT), H5Gclose);
  DHP_CHECK(state.ok() && read_attr(state, "step", H5T_NATIVE_INT64, &st.step) &&
                read_attr(state, "seed", H5T_NATIVE_UINT64, &st.seed) &&
                read_attr(state, "batch_size", H5T_NATIVE_INT64, &st.batch_size) &&
                read_attr(state, "sampler_epoch", H5T_NATIVE_INT64, &st.sampler.epoch) &&
                read_attr(state, "sampler_position", H5T_NATIVE_INT64, &st.sampler.position) &&
                read_attr(state, "dataset_size", H5T_NATIVE_INT64, &st.dataset_size),
            "checkpoint '{}': /state is missing or damaged", path);
  read_attr(state, "tokenizer_hash", H5T_NATIVE_UINT64, &st.tokenizer_hash);  // 0: not recorded
  st.special_ids = read_string_attr(state, "special_ids");     // "": not recorded
  st.added_tokens = read_string_attr(state, "added_tokens");
  st.sampler.seed = st.seed;
  if (has_link(file, "cost_model", where)) st.cost_state = read_string(file, "cost_model", path);
  if (opt) {
    DHP_CHECK(has_link(file, "optim", where),
              "checkpoint '{}' holds weights only (no optimizer state): start a new run from it "
              "with --init instead of resuming",
              path);
    H5 optim(H5Gopen2(file, "optim", H5P_DEFAULT), H5Gclose);
    int64_t t = 0;
    DHP_CHECK(read_attr(optim, "step", H5T_NATIVE_INT64, &t), "checkpoint '{}': no optimizer step", path);
    if (version >= kPartsFormatVersion) {
      load_moment_parts(open.parts ? *open.parts : read_parts_record(file, path, version), model.table(), *opt);
      opt->set_steps_taken(t);
      if (open.parts) stream_weights(open, model);
      else model.upload_params(staged);
      return st;
    }
    H5 m(H5Gopen2(optim, "m", H5P_DEFAULT), H5Gclose);
    H5 v(H5Gopen2(optim, "v", H5P_DEFAULT), H5Gclose);
    DHP_CHECK(m.ok() && v.ok(), "checkpoint '{}': optimizer moments missing", path);
    std::vector<float> sm(model.n_params()), sv(model.n_params());
    for (const auto& s : model.table().specs()) {
      read_tensor(m, "optim/m", s, sm.data() + s.offset, path);
      read_tensor(v, "optim/v", s, sv.data() + s.offset, path);
    }
    opt->upload_moments(sm, sv);
    opt->set_steps_taken(t);
  }
  if (open.parts) stream_weights(open, model);
  else model.upload_params(staged);
  return st;
}

CheckpointWeights::CheckpointWeights(const std::string& path) : open_(std::make_unique<OpenCheckpoint>(path)) {}

CheckpointWeights::~CheckpointWeights() = default;

void CheckpointWeights::read(const ParamSpec& spec, float* out) const {
  const std::optional<int64_t> at = open_->in_parts(spec);
  if (!at) {
    read_tensor(*open_->params, "params", spec, out, open_->path);
    return;
  }
  // A tensor may span parts; tensors are read in table order, so each part is read once.
  const PartsRecord& rec = *open_->parts;
  for (int64_t a = *at; a < *at + spec.numel();) {
    const int r = rec.part_of(a);
    if (r != part_) part_w_ = rec.read(r, "w", 2), part_ = r;
    const auto [begin, end] = AdamW::save_part(rec.n, r, rec.world);
    const int64_t b = std::min(*at + spec.numel(), end);
    std::copy_n(part_w_.begin() + (a - begin), b - a, out + (a - *at));
    a = b;
  }
}

std::vector<std::string> checkpoint_params_not_in(const std::string& path, const ParamTable& table) {
  const OpenCheckpoint open(path);
  const H5& params = *open.params;
  H5G_info_t info;
  DHP_CHECK(H5Gget_info(params, &info) >= 0, "checkpoint '{}': /params cannot be listed ({})", path, hdf5_reason());
  std::vector<std::string> out;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(params, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    DHP_CHECK(n >= 0, "checkpoint '{}': /params cannot be listed ({})", path, hdf5_reason());
    std::string name(size_t(n) + 1, '\0');
    H5Lget_name_by_idx(params, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(size_t(n));
    if (!table.find(name)) out.push_back(std::move(name));
  }
  if (open.parts)  // format 3: the trained weights, in the parts
    for (const auto& [name, w] : open.parts->weights)
      if (!table.find(name)) out.push_back(name);
  return out;
}

void check_tokenizer(const std::string& path, const TrainState& st, const Tokenizer& tok) {
  // Checkpoints from before the table was recorded were all trained with dhp's own table.
  const SpecialIds saved = st.special_ids.empty()
                               ? SpecialIds{}
                               : parse_special_ids(st.special_ids, path + ":/state special_ids");
  const SpecialIds now = tok.ids();
  std::string differ;
  const std::pair<const char*, int32_t SpecialIds::*> fields[] = {
      {"pad", &SpecialIds::pad},     {"unk", &SpecialIds::unk},
      {"bos", &SpecialIds::bos},     {"eos", &SpecialIds::eos},
      {"image", &SpecialIds::image}, {"<img>", &SpecialIds::img_begin},
      {"</img>", &SpecialIds::img_end}};
  for (const auto& [name, field] : fields)
    if (saved.*field != now.*field)
      differ += fmt::format("{}{} is {} in the checkpoint, {} now", differ.empty() ? "" : "; ",
                            name, saved.*field, now.*field);
  DHP_CHECK(differ.empty(),
            "checkpoint '{}' was trained with other special token ids than tokenizer '{}' "
            "gives: {}; use the tokenizer (and data.added_tokens) it was trained with",
            path, tok.path(), differ);
  const std::vector<AddedToken> added =
      st.added_tokens.empty() ? std::vector<AddedToken>{}
                              : parse_added_tokens(st.added_tokens, path + ":/state added_tokens");
  DHP_CHECK(added == tok.added_tokens(),
            "checkpoint '{}' was trained with the added tokens {}, tokenizer '{}' now has {}; "
            "set data.added_tokens (or the added_tokens.json beside the model) to match",
            path, format_added_tokens(added), tok.path(), format_added_tokens(tok.added_tokens()));
  const uint64_t recorded = st.tokenizer_hash;
  if (recorded == 0) return;  // saved before checkpoints recorded their tokenizer
  DHP_CHECK(recorded == tok.hash(),
            "checkpoint '{}' was trained with another tokenizer than '{}' (the file's contents "
            "changed since: hash {:016x} recorded, {:016x} now); token ids would mean other "
            "words: restore the original file or set data.tokenizer to it",
            path, tok.path(), recorded, tok.hash());
}

void check_same_model(const Config& saved, const Config& now, const std::string& path) {
  // The keys, not the values: a path such as checkpoint.dir = "runs/model.v2" is no shape; and
  // the folders a run started from are not its shape (their config.json gave the keys below).
  auto shape = [](const Config& c) {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& [key, value] : config_entries(c))
      if (key.rfind("model.", 0) == 0 && key != "model.init" && key != "model.vision.init")
        out.emplace_back(key, value);
    return out;
  };
  const auto a = shape(saved), b = shape(now);
  DHP_ASSERT(a.size() == b.size());
  std::vector<std::string> differ, restate;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].second != b[i].second) {
      differ.push_back(fmt::format("{} = {} in the checkpoint, {} now", a[i].first, a[i].second, b[i].second));
      restate.push_back(fmt::format("--{}={}", a[i].first, a[i].second));
    }
  if (differ.empty()) return;
  const std::string& from = saved.model.init.empty() ? saved.model.vision.init : saved.model.init;
  throw Error(fmt::format(
      "cannot resume from '{}': the model's shape changed ({}){}; resume with the checkpoint's model settings: {}",
      path, fmt::join(differ, "; "),
      from.empty() || (now.model.init == saved.model.init && now.model.vision.init == saved.model.vision.init)
          ? ""
          : fmt::format(" (its run took them from the Hugging Face folder '{}', which this run does not name)", from),
      fmt::join(restate, " ")));
}

}  // namespace dhp
