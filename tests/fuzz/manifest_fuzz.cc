// Fuzzes manifest validation (storage/manifest.h) with serialized
// v1::Manifest messages, as a peer sends them in an OpenRequest. A manifest
// that validates must satisfy what the receiver relies on before it creates
// a single file: every path relative and clean, no duplicates, chunk
// arithmetic in range. Those properties are re-checked here independently of
// the validator.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "longhaul/v1/peer.pb.h"
#include "storage/chunk_plan.h"
#include "storage/manifest.h"

namespace {

void Fail(const char* what, const std::string& path) {
  std::fprintf(stderr, "manifest_fuzz: validated manifest breaks a contract: %s: \"%s\"\n", what,
               path.c_str());
  std::abort();
}

void CheckPath(const std::string& path, size_t max_len) {
  if (path.empty()) Fail("empty path", path);
  if (path.size() > max_len) Fail("path too long", path);
  if (path.front() == '/') Fail("absolute path", path);
  if (path.find('\0') != std::string::npos) Fail("NUL in path", path);
  std::string_view rest(path);
  while (true) {
    size_t slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    if (part.empty() || part == "." || part == "..") Fail("bad path component", path);
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
}

void CheckValid(const longhaul::v1::Manifest& m, const longhaul::storage::ManifestLimits& limits) {
  if (m.chunk_size() < limits.min_chunk_size || m.chunk_size() > limits.max_chunk_size) {
    Fail("chunk size out of limits", std::to_string(m.chunk_size()));
  }
  if (static_cast<uint64_t>(m.files_size()) > limits.max_files) Fail("too many files", "");
  std::set<std::string> files;
  for (const auto& f : m.files()) {
    CheckPath(f.path(), limits.max_path_length);
    if (!files.insert(f.path()).second) Fail("duplicate path", f.path());
    if (f.size() > limits.max_file_size) Fail("file too large", f.path());
    if (longhaul::storage::ChunkCount(f, m.chunk_size()) > UINT32_MAX) Fail("too many chunks", f.path());
    if ((f.mode() & ~07777u) != 0) Fail("mode bits", f.path());
  }
  for (const auto& f : m.files()) {
    for (size_t slash = f.path().find('/'); slash != std::string::npos;
         slash = f.path().find('/', slash + 1)) {
      if (files.count(f.path().substr(0, slash))) Fail("file is a parent of another", f.path());
    }
  }
  for (const std::string& d : m.empty_dirs()) {
    CheckPath(d, limits.max_path_length);
    if (files.count(d)) Fail("empty dir is also a file", d);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  longhaul::v1::Manifest manifest;
  if (!manifest.ParseFromArray(data, static_cast<int>(size))) return 0;
  longhaul::storage::ManifestLimits defaults;
  if (longhaul::storage::ValidateManifest(manifest, defaults).ok()) CheckValid(manifest, defaults);
  // Tight limits reach the limit checks with small inputs.
  longhaul::storage::ManifestLimits tight;
  tight.max_files = 4;
  tight.max_file_size = 1 << 20;
  tight.max_path_length = 16;
  if (longhaul::storage::ValidateManifest(manifest, tight).ok()) CheckValid(manifest, tight);
  return 0;
}
