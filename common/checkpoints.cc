#include "common/checkpoints.h"

#include <fnmatch.h>

#include <cctype>
#include <cstddef>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace longhaul {
namespace {

bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

}  // namespace

bool NaturalLess(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (IsDigit(a[i]) && IsDigit(b[j])) {
      size_t ri = i, rj = j;
      while (ri < a.size() && IsDigit(a[ri])) ++ri;
      while (rj < b.size() && IsDigit(b[rj])) ++rj;
      std::string_view da = a.substr(i, ri - i), db = b.substr(j, rj - j);
      // Compare values: strip leading zeros, then longer is bigger, then digits.
      size_t za = da.find_first_not_of('0'), zb = db.find_first_not_of('0');
      std::string_view va = za == std::string_view::npos ? "" : da.substr(za);
      std::string_view vb = zb == std::string_view::npos ? "" : db.substr(zb);
      if (va.size() != vb.size()) return va.size() < vb.size();
      if (va != vb) return va < vb;
      if (da.size() != db.size()) return da.size() > db.size();  // "01" before "1"
      i = ri;
      j = rj;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

absl::Status ValidateCheckpointMarker(std::string_view marker) {
  const absl::string_view m(marker.data(), marker.size());
  if (m.empty()) return absl::OkStatus();
  bool bad = m.front() == '/' || m.back() == '/' || m.find('\0') != absl::string_view::npos;
  for (absl::string_view comp : absl::StrSplit(m, '/')) bad = bad || comp == "." || comp == ".." || comp.empty();
  if (!bad) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint marker '", absl::CHexEscape(m),
                   "' must be a file path inside the checkpoint: relative, without '.' or '..' "
                   "(e.g. model.index.json)"));
}

bool IsCommitMarker(const std::vector<std::string>& globs, std::string_view path) {
  const std::string full(path);
  const size_t slash = path.rfind('/');
  const std::string base(slash == std::string_view::npos ? path : path.substr(slash + 1));
  for (const std::string& g : globs) {
    if (fnmatch(g.c_str(), base.c_str(), 0) == 0) return true;
    if (fnmatch(g.c_str(), full.c_str(), FNM_PATHNAME) == 0) return true;
  }
  return false;
}

std::string GlobMatchingOnly(std::string_view path) {
  std::string glob;
  glob.reserve(path.size());
  for (char c : path) {
    if (c == '*' || c == '?' || c == '[' || c == '\\') glob.push_back('\\');
    glob.push_back(c);
  }
  return glob;
}

}  // namespace longhaul
