#!/usr/bin/env bash
# The checks CI runs besides the test suite (deploy/test.sh calls this):
#   format  clang-format --dry-run --Werror on the C++ lines changed since the
#           format base (below); the rest of each file is left as it is.
#   clang   one clang build (the tsan preset, build-tsan/) that serves two
#           checks. -Wthread-safety -Werror on every translation unit, so
#           ABSL_GUARDED_BY and friends are enforced: the targets the TSan
#           suites need are compiled with it, and every other unit is
#           analysed by clang without code generation
#           (deploy/clang-syntax-check.py). Then the exchange and peer suites
#           run under ThreadSanitizer; a report from any process, the daemons
#           that exchange_daemon_test starts included, fails the check.
#           ("tsa" and "tsan" name it too.) Its two halves are
#           clang-build and clang-tests (deploy/test.sh runs the first
#           during ctest).
# Usage: deploy/check.sh [format|clang|clang-build|clang-tests]...
#        (no argument: format and clang)
#
# The format base is LONGHAUL_FORMAT_BASE when set (a commit or a ref: the
# merge-base of HEAD with it is used, e.g. origin/main for a branch), else the
# commit recorded in .ci/format-base: the last commit before the check existed,
# when half the tree did not match .clang-format. A clean checkout of main has
# no other ref to compare with, and HEAD~1 would miss all but a merge's last
# commit; a recorded base checks everything written since, however it landed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

format_base() {
  local base
  if [ -n "${LONGHAUL_FORMAT_BASE:-}" ]; then
    base=$(git merge-base HEAD "$LONGHAUL_FORMAT_BASE") || {
      echo "check format: no merge-base of HEAD and $LONGHAUL_FORMAT_BASE" >&2
      return 1
    }
  else
    base=$(tr -d '[:space:]' <.ci/format-base)
  fi
  if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
    echo "check format: base commit $base is not in this clone (shallow? git fetch --unshallow)" >&2
    return 1
  fi
  echo "$base"
}

# True when the format base can be judged here: a git work tree that holds
# the base commit. A source tree without that history (an exported tarball, a
# shallow clone) has no "changed lines" to check.
format_history_available() {
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 1
  [ -n "${LONGHAUL_FORMAT_BASE:-}" ] && return 0
  git cat-file -e "$(tr -d '[:space:]' <.ci/format-base)^{commit}" 2>/dev/null
}

# Prints "FILE FIRST:LAST..." for each C++ file changed since $1, one a line:
# the line ranges the working tree added or changed; an untracked file alone
# on its line (checked whole).
changed_lines() {
  git diff -U0 --no-color --no-ext-diff --diff-filter=AMR "$1" -- '*.cc' '*.h' | awk '
    /^\+\+\+ b\// { if (file != "" && ranges != "") print file ranges; file = substr($0, 7); ranges = "" }
    /^@@ / {
      split($3, a, ","); start = substr(a[1], 2); count = (2 in a) ? a[2] : 1
      if (count > 0) ranges = ranges " " start ":" (start + count - 1)
    }
    END { if (file != "" && ranges != "") print file ranges }'
  git ls-files --others --exclude-standard -- '*.cc' '*.h'
}

check_format() {
  local base failed=0 file ranges r args
  if ! format_history_available; then
    echo "check format: SKIPPED: no git history back to the format base here" \
      "(a shallow clone or no .git); run it in a full clone" >&2
    return 0
  fi
  base=$(format_base)
  echo "check format: C++ lines changed since $(git rev-parse --short "$base")" >&2
  while read -r file ranges; do
    args=()
    for r in $ranges; do args+=("--lines=$r"); done
    clang-format --dry-run --Werror "${args[@]}" "$file" || failed=1
  done < <(changed_lines "$base")
  if [ "$failed" -ne 0 ]; then
    echo "check format: FAILED; fix with: git clang-format $(git rev-parse --short "$base")" >&2
    return 1
  fi
}

check_clang_build() {
  if command -v ccache >/dev/null; then  # as deploy/build.sh: used where present
    export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER-ccache}
    export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER-ccache}
  fi
  echo "check clang: -Wthread-safety -Werror on every unit, TSan targets built (build-tsan)" >&2
  cmake --preset tsan >/dev/null
  cmake --build --preset tsan
  python3 "$root/deploy/clang-syntax-check.py" "$root/build-tsan"
}

check_clang_tests() {
  echo "check clang: exchange and peer suites under ThreadSanitizer (build-tsan)" >&2
  local reports=$root/build-tsan/tsan-reports
  rm -rf "$reports"
  mkdir -p "$reports"
  # log_path: reports from every process, daemons included, land in files.
  local status=0
  TSAN_OPTIONS="log_path=$reports/report ${TSAN_OPTIONS:-}" \
    ctest --preset tsan -j "$(nproc)" --timeout 900 || status=$?
  if compgen -G "$reports/report*" >/dev/null; then
    cat "$reports"/report* >&2
    echo "check clang: FAILED: ThreadSanitizer reports above" >&2
    return 1
  fi
  return "$status"
}

checks=("$@")
[ ${#checks[@]} -gt 0 ] || checks=(format clang)
clang_done=0
for c in "${checks[@]}"; do
  case "$c" in
    format) check_format ;;
    clang | tsa | tsan)
      if [ "$clang_done" -eq 0 ]; then check_clang_build && check_clang_tests; fi
      clang_done=1
      ;;
    clang-build) check_clang_build ;;
    clang-tests) check_clang_tests ;;
    *) echo "check: unknown check '$c' (format, clang, clang-build or clang-tests)" >&2; exit 2 ;;
  esac
done
