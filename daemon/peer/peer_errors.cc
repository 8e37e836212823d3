#include "daemon/peer/peer_errors.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace longhaul::peer {
namespace {

// Characters after which a '/' starts an absolute path in a message.
bool StartsAPath(absl::string_view message, size_t slash) {
  if (slash == 0) return true;
  const char before = message[slash - 1];
  return before == ' ' || before == '"' || before == '\'' || before == '(' || before == '=' ||
         before == '[';
}

// Where the path that starts at `from` ends: at white space, a quote, a
// closing bracket, a comma or semicolon, or a colon that ends a clause.
size_t PathEnd(absl::string_view message, size_t from) {
  size_t end = from;
  while (end < message.size()) {
    const char c = message[end];
    if (c == ' ' || c == '"' || c == '\'' || c == ')' || c == ']' || c == ',' || c == ';') break;
    if (c == ':' && (end + 1 == message.size() || message[end + 1] == ' ')) break;
    ++end;
  }
  return end;
}

// The export-relative name of `path`, if it lies under one of `roots`.
bool UnderRoot(absl::string_view path, const std::vector<ExportRoot>& roots, std::string* out) {
  size_t best = 0;
  for (const ExportRoot& root : roots) {
    for (const std::string& prefix : {root.real_path, root.path}) {
      if (prefix.empty() || prefix.size() <= best) continue;
      if (path == prefix) {
        *out = absl::StrCat(root.name, ":");
        best = prefix.size();
      } else if (absl::StartsWith(path, prefix) && path[prefix.size()] == '/') {
        *out = absl::StrCat(root.name, ":", path.substr(prefix.size() + 1));
        best = prefix.size();
      }
    }
  }
  return best > 0;
}

}  // namespace

std::vector<ExportRoot> ResolveExportRoots(
    const std::vector<std::pair<std::string, std::string>>& exports) {
  std::vector<ExportRoot> roots;
  for (const auto& [name, path] : exports) {
    ExportRoot root{name, path, ""};
    // Trailing slashes would keep the prefix from matching.
    while (root.path.size() > 1 && root.path.back() == '/') root.path.pop_back();
    char real[PATH_MAX];
    if (realpath(path.c_str(), real) != nullptr) root.real_path = real;
    roots.push_back(std::move(root));
  }
  return roots;
}

std::string ForPeer(absl::string_view message, const std::vector<ExportRoot>& roots) {
  std::string out;
  size_t copied = 0;
  for (size_t i = 0; i < message.size(); ++i) {
    if (message[i] != '/' || !StartsAPath(message, i)) continue;
    const size_t end = PathEnd(message, i);
    std::string name;
    if (!UnderRoot(message.substr(i, end - i), roots, &name)) name = "(a path of this site)";
    absl::StrAppend(&out, message.substr(copied, i - copied), name);
    copied = end;
    i = end - 1;
  }
  absl::StrAppend(&out, message.substr(copied));
  return out;
}

}  // namespace longhaul::peer
