#include "tests/wanem/link_config.h"

#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace longhaul::wanem {
namespace {

// Splits "12.5Mbit" into 12.5 and "mbit" (lower-cased).
bool SplitNumber(absl::string_view text, double& value, std::string& suffix) {
  text = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < text.size() && (absl::ascii_isdigit(text[i]) || text[i] == '.' || text[i] == 'e' ||
                             text[i] == 'E' || text[i] == '+' || text[i] == '-')) {
    // An 'e' that starts a unit rather than an exponent is not expected in
    // these units, so treat it as part of the number.
    ++i;
  }
  if (i == 0) return false;
  if (!absl::SimpleAtod(text.substr(0, i), &value)) return false;
  suffix = absl::AsciiStrToLower(text.substr(i));
  return std::isfinite(value) && value >= 0;
}

}  // namespace

absl::StatusOr<int64_t> ParseRate(absl::string_view text) {
  double v;
  std::string unit;
  if (!SplitNumber(text, v, unit)) {
    return absl::InvalidArgumentError(absl::StrCat("bad rate '", text, "'"));
  }
  double mult;
  if (unit.empty() || unit == "bit" || unit == "bps") {
    mult = 1;
  } else if (unit == "kbit") {
    mult = 1e3;
  } else if (unit == "mbit") {
    mult = 1e6;
  } else if (unit == "gbit") {
    mult = 1e9;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("bad rate unit in '", text, "' (use kbit, Mbit, Gbit)"));
  }
  return static_cast<int64_t>(std::llround(v * mult));
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  double v;
  std::string unit;
  if (!SplitNumber(text, v, unit)) {
    return absl::InvalidArgumentError(absl::StrCat("bad size '", text, "'"));
  }
  double mult;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "kb") {
    mult = 1e3;
  } else if (unit == "mb") {
    mult = 1e6;
  } else if (unit == "gb") {
    mult = 1e9;
  } else if (unit == "kib" || unit == "k") {
    mult = 1024;
  } else if (unit == "mib" || unit == "m") {
    mult = 1024 * 1024;
  } else if (unit == "gib" || unit == "g") {
    mult = 1024.0 * 1024 * 1024;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("bad size unit in '", text, "'"));
  }
  return static_cast<int64_t>(std::llround(v * mult));
}

absl::StatusOr<double> ParseLoss(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  bool percent = absl::ConsumeSuffix(&text, "%");
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat("bad loss '", text, "'"));
  }
  if (percent) v /= 100;
  if (v < 0 || v > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss must be within [0, 1] (or 0%..100%): '", text, "'"));
  }
  return v;
}

absl::Status ApplyOverrides(absl::string_view overrides, DirectionSpec& spec) {
  for (absl::string_view item : absl::StrSplit(overrides, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const absl::string_view key = absl::StripAsciiWhitespace(kv.first);
    const std::string value(absl::StripAsciiWhitespace(kv.second));
    if (key == "rate") {
      spec.rate = value;
    } else if (key == "delay") {
      spec.delay = value;
    } else if (key == "jitter") {
      spec.jitter = value;
    } else if (key == "loss") {
      spec.loss = value;
    } else if (key == "queue") {
      spec.queue = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown link parameter '", key, "' (known: rate, delay, jitter, loss, queue)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DirectionParams> Resolve(const DirectionSpec& spec, int delays_per_round_trip) {
  DirectionParams p;
  absl::StatusOr<int64_t> rate = ParseRate(spec.rate);
  if (!rate.ok()) return rate.status();
  p.rate_bps = *rate;
  if (!absl::ParseDuration(spec.delay, &p.delay) || p.delay < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("bad delay '", spec.delay, "' (e.g. 20ms)"));
  }
  if (!absl::ParseDuration(spec.jitter, &p.jitter) || p.jitter < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("bad jitter '", spec.jitter, "' (e.g. 1ms)"));
  }
  absl::StatusOr<double> loss = ParseLoss(spec.loss);
  if (!loss.ok()) return loss.status();
  p.loss = *loss;
  if (absl::AsciiStrToLower(spec.queue) == "bdp") {
    // One BDP of the round trip, but never less than a few jumbo frames so a
    // zero-delay link still has a usable queue.
    const double bdp = static_cast<double>(p.rate_bps) / 8 *
                       absl::ToDoubleSeconds(delays_per_round_trip * p.delay);
    p.queue_bytes = std::max<int64_t>(static_cast<int64_t>(bdp), 64 * 1024);
  } else {
    absl::StatusOr<int64_t> q = ParseBytes(spec.queue);
    if (!q.ok()) return q.status();
    p.queue_bytes = *q;
  }
  return p;
}

std::string FormatRate(int64_t bps) {
  if (bps == 0) return "unlimited";
  if (bps % 1'000'000'000 == 0) return absl::StrCat(bps / 1'000'000'000, "Gbit");
  if (bps % 1'000'000 == 0) return absl::StrCat(bps / 1'000'000, "Mbit");
  if (bps % 1'000 == 0) return absl::StrCat(bps / 1'000, "kbit");
  return absl::StrCat(bps, "bit");
}

}  // namespace longhaul::wanem
