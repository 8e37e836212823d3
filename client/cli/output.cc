#include "client/cli/output.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/units_parse.h"
#include "longhaul/client.h"

namespace longhaul::cli {
namespace {


std::string Rate(double bytes_per_sec) { return absl::StrFormat("%.0f Mbit/s", bytes_per_sec * 8 / 1e6); }

// The recent rate counts only while chunks move: a paused, queued or ended
// transfer keeps the last sample the daemon took, which says nothing now.
bool Moving(const v1::TransferStatus& s) {
  return s.state() == v1::RUNNING && s.rate_bytes_per_sec() > 0 && s.bytes_done() < s.bytes_total();
}

std::string Eta(const v1::TransferStatus& s) {
  if (!Moving(s)) return "--";
  double seconds = (s.bytes_total() - s.bytes_done()) / s.rate_bytes_per_sec();
  if (seconds >= 3600) return absl::StrFormat("%.0fh%02.0fm", std::floor(seconds / 3600), std::fmod(seconds / 60, 60));
  if (seconds >= 60) return absl::StrFormat("%.0fm%02.0fs", std::floor(seconds / 60), std::fmod(seconds, 60));
  return absl::StrFormat("%.0fs", seconds);
}

// Terminal columns of UTF-8 `s` (one per code point).
size_t Columns(absl::string_view s) {
  return std::count_if(s.begin(), s.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// The first `columns` columns of UTF-8 `s`, not splitting a code point.
std::string FirstColumns(absl::string_view s, size_t columns) {
  size_t seen = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && seen++ == columns)
      return std::string(s.substr(0, i));
  }
  return std::string(s);
}

double Fraction(const v1::TransferStatus& s) {
  if (s.bytes_total() == 0) return IsEndState(s.state()) ? 1.0 : 0.0;
  return std::min(1.0, static_cast<double>(s.bytes_done()) / s.bytes_total());
}

}  // namespace

JsonObject& JsonObject::Add(absl::string_view key, absl::string_view value) {
  fields_.emplace_back(std::string(key), JsonString(value));
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, double value) {
  fields_.emplace_back(std::string(key), std::isfinite(value) ? absl::StrFormat("%.3f", value) : "0");
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, uint64_t value) {
  fields_.emplace_back(std::string(key), absl::StrCat(value));
  return *this;
}
JsonObject& JsonObject::Add(absl::string_view key, bool value) {
  fields_.emplace_back(std::string(key), value ? "true" : "false");
  return *this;
}
JsonObject& JsonObject::AddRaw(absl::string_view key, std::string raw) {
  fields_.emplace_back(std::string(key), std::move(raw));
  return *this;
}
std::string JsonObject::str() const {
  std::vector<std::string> parts;
  for (const auto& [k, v] : fields_) parts.push_back(absl::StrCat(JsonString(k), ": ", v));
  return absl::StrCat("{", absl::StrJoin(parts, ", "), "}");
}

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string JsonArray(const std::vector<std::string>& raw_items) {
  return absl::StrCat("[", absl::StrJoin(raw_items, ", "), "]");
}

std::string StateName(v1::TransferState state) { return v1::TransferState_Name(state); }

JsonObject TransferJson(const v1::TransferStatus& s) {
  JsonObject o;
  // Live: the recent rate while chunks move. Ended: the average over the
  // time it ran, of the bytes that arrived.
  double goodput = 0;
  if (Moving(s)) {
    goodput = s.rate_bytes_per_sec() * 8 / 1e6;
  } else if (IsEndState(s.state()) && s.seconds() > 0) {
    goodput = s.bytes_done() * 8 / 1e6 / s.seconds();
  }
  o.Add("id", s.id())
      .Add("state", StateName(s.state()))
      .Add("bytes", s.bytes_total())
      .Add("bytes_done", s.bytes_done())
      .Add("files", s.files())
      .Add("files_unchanged", s.files_unchanged())
      .Add("chunks", s.chunks_total())
      .Add("chunks_done", s.chunks_done())
      .Add("seconds", s.seconds())
      .Add("goodput_mbit", goodput)
      .Add("bytes_sent", s.bytes_sent())
      .Add("resent_bytes", s.resent_bytes())
      .Add("streams", static_cast<uint64_t>(s.active_streams()))
      .Add("attempts", static_cast<uint64_t>(s.attempts()))
      .Add("destination", absl::StrCat(s.spec().dest_site(), ":/", s.spec().dest_export(), "/",
                                       s.spec().dest_path()));
  std::vector<std::string> skipped;
  for (const v1::SkippedEntry& e : s.skipped()) {
    skipped.push_back(JsonObject().Add("path", e.path()).Add("why", e.why()).str());
  }
  o.AddRaw("skipped", JsonArray(skipped));
  if (s.spec().dry_run()) {
    std::vector<std::string> send;
    for (const std::string& p : s.would_send()) send.push_back(JsonString(p));
    o.Add("dry_run", true).AddRaw("would_send", JsonArray(send));
    o.Add("would_send_count", s.would_send_count());
  }
  // What the publish replaced, deleted and pruned at the destination.
  if (s.has_publish_report()) {
    const v1::PublishReport& r = s.publish_report();
    auto strings = [](const auto& list) {
      std::vector<std::string> out;
      for (const std::string& p : list) out.push_back(JsonString(p));
      return JsonArray(out);
    };
    o.AddRaw("report", JsonObject()
                           .Add("replaced", r.replaced())
                           .AddRaw("changed", strings(r.changed()))
                           .Add("changed_count", r.changed_count())
                           .AddRaw("deleted", strings(r.deleted()))
                           .Add("deleted_count", r.deleted_count())
                           .AddRaw("pruned", strings(r.pruned()))
                           .Add("trash", r.trash())
                           .str());
  }
  // Pull and third-party copy: where the data comes from, and who asked.
  if (!s.spec().source_site().empty()) {
    o.Add("source", absl::StrCat(s.spec().source_site(), ":/", s.spec().source_export(), "/",
                                 s.spec().source_path()));
  }
  if (!s.spec().requested_by().empty()) o.Add("requested_by", s.spec().requested_by());
  // Fan-out: every destination's own progress, in chain order.
  if (s.destinations_size() > 0) {
    std::vector<std::string> destinations;
    for (const v1::DestinationStatus& d : s.destinations()) {
      JsonObject one;
      one.Add("destination", DestinationText(d.destination()))
          .Add("id", d.transfer_id())
          .Add("state", StateName(d.state()))
          .Add("bytes", d.bytes_total())
          .Add("bytes_done", d.bytes_done())
          .Add("bytes_sent", d.bytes_sent())
          .Add("relay_by", d.relay_by());
      if (!d.error().empty()) one.Add("error", d.error());
      destinations.push_back(one.str());
    }
    o.AddRaw("destinations", JsonArray(destinations));
  }
  if (!s.error().empty()) o.Add("error", s.error());
  return o;
}

std::string DestinationText(const v1::Destination& d) {
  return absl::StrCat(d.site(), ":/", d.export_name(), "/", d.path());
}

std::string DestinationLines(const v1::TransferStatus& s) {
  std::string out;
  for (const v1::DestinationStatus& d : s.destinations()) {
    const double pct = d.bytes_total() ? 100.0 * d.bytes_done() / d.bytes_total() : 100.0;
    absl::StrAppend(&out, absl::StrFormat("\n  %-10s %5.1f%%  %s  %s", StateName(d.state()), pct,
                                          DestinationText(d.destination()),
                                          d.relay_by().empty()
                                              ? std::string("(from the source)")
                                              : absl::StrCat("(relayed by ", d.relay_by(), ")")));
    if (!d.error().empty()) absl::StrAppend(&out, ": ", d.error());
  }
  return out;
}

std::string SkippedLines(const v1::TransferStatus& s) {
  std::string out;
  for (const v1::SkippedEntry& e : s.skipped()) {
    absl::StrAppend(&out, "\n  skipped ", e.path(), ": ", e.why());
  }
  return out;
}

std::string RateText(const v1::TransferStatus& s) {
  if (Moving(s)) return Rate(s.rate_bytes_per_sec());
  if (IsEndState(s.state()) && s.bytes_done() > 0 && s.seconds() > 0) {
    return absl::StrCat("avg ", Rate(s.bytes_done() / s.seconds()));
  }
  return "";
}

// What the publish did to what was at the destination: one line per kind,
// then the paths named (the report names at most 1000 of each).
std::string ReportLines(const v1::TransferStatus& s) {
  if (!s.has_publish_report()) return "";
  const v1::PublishReport& r = s.publish_report();
  std::string out;
  if (r.replaced()) {
    absl::StrAppend(&out, "\n  replaced the previous version: ", r.changed_count(),
                    " files changed, ", r.deleted_count(), " deleted; kept in ", r.trash());
  }
  for (const std::string& p : r.changed())
    absl::StrAppend(&out, "\n  changed ", p.empty() ? "." : p);
  for (const std::string& p : r.deleted()) absl::StrAppend(&out, "\n  deleted ", p);
  for (const std::string& p : r.pruned()) absl::StrAppend(&out, "\n  pruned ", p);
  return out;
}

std::string DryRunText(const v1::TransferStatus& s) {
  std::string out =
      absl::StrCat("dry run: would send ", s.would_send_count(), " of ", s.files(), " files");
  if (s.files_unchanged() > 0) absl::StrAppend(&out, " (", s.files_unchanged(), " unchanged)");
  const v1::PublishReport& r = s.publish_report();
  if (r.replaced()) {
    absl::StrAppend(&out, "; would replace the destination: ", r.changed_count(),
                    " files changed, ", r.deleted_count(),
                    " deleted (the old version kept in the trash)");
  }
  for (const std::string& p : s.would_send()) absl::StrAppend(&out, "\n  send ", p);
  for (const std::string& p : r.changed())
    absl::StrAppend(&out, "\n  replace ", p.empty() ? "." : p);
  for (const std::string& p : r.deleted()) absl::StrAppend(&out, "\n  delete ", p);
  for (const std::string& p : r.pruned()) absl::StrAppend(&out, "\n  prune ", p);
  return out;
}

std::string ProgressBar(const v1::TransferStatus& s, int width) {
  // One column stays free: a line that fills the last column leaves the
  // cursor pending a wrap, and some terminals then scroll on the next "\r".
  const size_t room = static_cast<size_t>(std::max(width, 20) - 1);
  constexpr size_t kMinBar = 10;
  // Fields by importance; the last ones are dropped first when they do not fit.
  std::vector<std::string> fields = {absl::StrFormat("%.1f%%", Fraction(s) * 100)};
  if (s.state() != v1::RUNNING) fields.push_back(StateName(s.state()));
  if (const std::string rate = RateText(s); !rate.empty()) fields.push_back(rate);
  fields.push_back(absl::StrCat(FormatBytes(s.bytes_done()), " / ", FormatBytes(s.bytes_total())));
  if (Moving(s)) fields.push_back(absl::StrCat("ETA ", Eta(s)));
  if (s.active_streams() > 0) fields.push_back(absl::StrCat(s.active_streams(), " streams"));
  auto stats_width = [&](size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n; ++i) w += 2 + Columns(fields[i]);
    return w;
  };
  // An error outranks every field but the percentage: it keeps room for
  // its label, a readable start and where the whole text is, when it can.
  const std::string where = absl::StrCat(" (longhaul status ", s.id(), ")");
  const std::string label = IsEndState(s.state()) ? "  error: " : "  retrying: ";
  const size_t error_room = s.error().empty() ? 0 : Columns(label) + 12 + Columns(where);
  auto fit = [&](size_t reserve) {
    size_t kept = fields.size();
    while (kept > 1 && kMinBar + 2 + stats_width(kept) + reserve > room) --kept;
    return kept;
  };
  size_t kept = fit(error_room);
  if (kMinBar + 2 + stats_width(kept) + error_room > room) kept = fit(0);
  fields.resize(kept);
  std::string stats;
  for (const std::string& f : fields) absl::StrAppend(&stats, "  ", f);
  if (!s.error().empty()) {
    // The error is cut to what fits; the whole text is one command away.
    const size_t used = kMinBar + 2 + Columns(stats) + Columns(label) + Columns(where);
    if (used + 12 <= room) {
      const size_t budget = room - used;
      std::string error = s.error();
      if (Columns(error) > budget) error = FirstColumns(error, budget - 3) + "...";
      absl::StrAppend(&stats, label, error, where);
    } else if (kMinBar + 2 + Columns(stats) + Columns(label) <= room) {
      absl::StrAppend(&stats, IsEndState(s.state()) ? "  error" : "  retrying");
    }
  }
  const size_t bar = std::max(kMinBar, room - 2 - Columns(stats));
  const size_t filled = static_cast<size_t>(std::round(Fraction(s) * bar));
  return absl::StrCat("[", std::string(filled, '#'), std::string(bar - filled, '.'), "]", stats);
}

std::string ProgressLine(const v1::TransferStatus& s) {
  std::string line =
      absl::StrFormat("%s %s %.1f%% %s/%s", s.id(), StateName(s.state()), Fraction(s) * 100,
                      FormatBytes(s.bytes_done()), FormatBytes(s.bytes_total()));
  if (const std::string rate = RateText(s); !rate.empty()) absl::StrAppend(&line, " ", rate);
  absl::StrAppend(&line, " streams=", s.active_streams());
  if (s.skipped_size() > 0) absl::StrAppend(&line, " skipped=", s.skipped_size());
  if (!s.error().empty()) absl::StrAppend(&line, " error=\"", s.error(), "\"");
  return line;
}

namespace {

std::string SourceText(const v1::TransferSpec& spec) {
  if (!spec.source_site().empty()) {
    return absl::StrCat(spec.source_site(), ":/", spec.source_export(), "/", spec.source_path());
  }
  return absl::StrJoin(spec.sources(), " ");
}

std::string RouteLines(const v1::TransferStatus& s) {
  std::string out = absl::StrCat("\n  source:      ", SourceText(s.spec()));
  if (!s.spec().requested_by().empty())
    absl::StrAppend(&out, " (requested by ", s.spec().requested_by(), ")");
  absl::StrAppend(&out, "\n  destination: ", s.spec().dest_site(), ":/", s.spec().dest_export(),
                  "/", s.spec().dest_path());
  for (const v1::Destination& d : s.spec().also())
    absl::StrAppend(&out, "\n  also:        ", DestinationText(d));
  return out;
}

}  // namespace

std::string SpecText(const v1::TransferSpec& spec) {
  std::string out = absl::StrCat(SourceText(spec), " -> ", spec.dest_site(), ":/",
                                 spec.dest_export(), "/", spec.dest_path());
  for (const v1::Destination& d : spec.also()) absl::StrAppend(&out, " + ", DestinationText(d));
  return out;
}

std::string StatusText(const v1::TransferStatus& s) {
  std::string out =
      absl::StrFormat("%s %s %.1f%% %s/%s", s.id(), StateName(s.state()), Fraction(s) * 100,
                      FormatBytes(s.bytes_done()), FormatBytes(s.bytes_total()));
  if (const std::string rate = RateText(s); !rate.empty()) absl::StrAppend(&out, " ", rate);
  if (s.active_streams() > 0) absl::StrAppend(&out, " streams=", s.active_streams());
  absl::StrAppend(&out, RouteLines(s));
  if (!s.error().empty()) {
    absl::StrAppend(&out,
                    IsEndState(s.state()) ? "\n  error:       " : "\n  last error:  ", s.error());
  }
  return absl::StrCat(out, DestinationLines(s), SkippedLines(s), ReportLines(s));
}

std::string Fold(absl::string_view text, int width) {
  const size_t room = static_cast<size_t>(std::max(width, 20) - 1);
  constexpr absl::string_view kIndent = "    ";
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::string current;
    bool first_word = true;
    for (absl::string_view word : absl::StrSplit(line, ' ')) {
      if (first_word) {
        current = std::string(word);
        first_word = false;
      } else if (Columns(current) + 1 + Columns(word) <= room) {
        absl::StrAppend(&current, " ", word);
      } else {
        out.push_back(std::move(current));
        current = absl::StrCat(kIndent, word);
      }
      // A word wider than a line (a long path) is cut where the line ends.
      while (Columns(current) > room) {
        std::string head = FirstColumns(current, room);
        current = absl::StrCat(kIndent, current.substr(head.size()));
        out.push_back(std::move(head));
      }
    }
    out.push_back(std::move(current));
  }
  return absl::StrJoin(out, "\n");
}

std::string DetailText(const v1::TransferStatus& s) {
  return absl::StrCat(Summary(s), RouteLines(s));
}

std::string Summary(const v1::TransferStatus& s) {
  if (s.state() == v1::COMPLETED) {
    double mbit = s.seconds() > 0 ? s.bytes_total() * 8 / 1e6 / s.seconds() : 0;
    std::string out = absl::StrFormat("%s completed: %s in %llu files, %.2f s, %.0f Mbit/s, resent %s",
                                      s.id(), FormatBytes(s.bytes_total()), s.files(), s.seconds(), mbit,
                                      FormatBytes(s.resent_bytes()));
    if (s.files_unchanged() > 0) absl::StrAppend(&out, ", ", s.files_unchanged(), " files unchanged");
    if (s.skipped_size() > 0) absl::StrAppend(&out, ", ", s.skipped_size(), " skipped");
    if (s.destinations_size() > 0) {
      absl::StrAppend(&out, ", ", s.destinations_size(), " destinations, source sent ",
                      FormatBytes(s.bytes_sent()));
    }
    return absl::StrCat(out, DestinationLines(s), SkippedLines(s), ReportLines(s));
  }
  std::string out = absl::StrCat(s.id(), " ", StateName(s.state()));
  if (!s.error().empty()) absl::StrAppend(&out, ": ", s.error());
  return absl::StrCat(out, DestinationLines(s), SkippedLines(s));
}

}  // namespace longhaul::cli
