#include "tests/wanem/star_emulator.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <iostream>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/wanem/netns.h"
#include "tests/wanem/relay.h"
#include "tests/wanem/star_site.h"

namespace longhaul::wanem {
namespace {

constexpr char kDevice[] = "lhw0";

class StarEmulator : public Emulator {
 public:
  explicit StarEmulator(StarOptions options) : options_(std::move(options)) {
    const std::string base = absl::StrCat(kNamespacePrefix, getpid());
    for (int k = 1; k <= sites(); ++k) {
      specs_.push_back(
          {absl::StrCat(base, "-", k), kDevice, StarSiteAddress(k), kStarPrefixLen, options_.mtu});
    }
    tun_fds_.assign(sites(), -1);
  }
  ~StarEmulator() override { Stop(); }

  absl::Status Start() override {
    for (int k = 0; k < sites(); ++k) {
      absl::StatusOr<int> fd = CreateSite(specs_[k]);
      if (!fd.ok()) return fd.status();
      tun_fds_[k] = *fd;
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) return absl::InternalError("eventfd failed");
    std::vector<Downlink*> downlinks;
    for (int k = 0; k < sites(); ++k) {
      // Seeds two apart per site: StarSite derives the downlink's from it.
      site_objs_.push_back(std::make_unique<StarSite>(
          k + 1, tun_fds_[k], stop_fd_, options_.links[k], options_.seed + 2 * k, options_.mtu));
      downlinks.push_back(&site_objs_.back()->downlink());
    }
    for (auto& site : site_objs_) site->Connect(downlinks);
    for (auto& site : site_objs_) {
      threads_.emplace_back([s = site.get()] { s->Run(); });
    }
    return absl::OkStatus();
  }

  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    StopThreadsAndDeleteSites(stop_fd_, absl::MakeSpan(threads_), absl::MakeSpan(tun_fds_), specs_);
  }

  absl::Status SetCut(bool cut, absl::string_view which) override {
    return ForDirections(which, [cut](StarSite& site, bool up, bool down) {
      if (up) site.set_uplink_cut(cut);
      if (down) site.downlink().set_cut(cut);
    });
  }

  absl::Status SetBurstLoss(double loss, absl::string_view which) override {
    return ForDirections(which, [loss](StarSite& site, bool up, bool down) {
      if (up) site.set_uplink_burst_loss(loss);
      if (down) site.downlink().set_burst_loss(loss);
    });
  }

  std::string InfoJson() const override {
    std::string out = absl::StrCat("{\"pid\":", getpid(), ",\"sites\":", sites(), ",\"dev\":\"",
                                   kDevice, "\",\"mtu\":", options_.mtu);
    absl::StrAppend(&out, ",\"ns\":[");
    for (int k = 0; k < sites(); ++k) {
      absl::StrAppend(&out, k ? "," : "", "\"", specs_[k].ns, "\"");
    }
    absl::StrAppend(&out, "],\"addr\":[");
    for (int k = 0; k < sites(); ++k) {
      absl::StrAppend(&out, k ? "," : "", "\"", specs_[k].address, "\"");
    }
    return absl::StrCat(out, "]}");
  }

  std::string StatsJson() const override {
    std::string out = InfoJson();
    out.pop_back();  // The closing brace: the links join the info object.
    for (const auto& site : site_objs_) {
      const int mtu = options_.mtu;
      absl::StrAppend(&out, ",\"site", site->index(), "\":{\"up\":",
                      DirectionStatsJson(site->uplink_counters(), site->uplink_params(),
                                         site->uplink_cut(), mtu),
                      ",\"down\":",
                      DirectionStatsJson(site->downlink().counters(), site->downlink().params(),
                                         site->downlink().cut(), mtu),
                      ",\"dropped_unroutable\":", site->dropped_unroutable(), "}");
    }
    return absl::StrCat(out, "}");
  }

  std::string ReadyFileText() const override {
    std::string out = absl::StrCat("LHW_PID=", getpid(), "\nLHW_SITES=", sites());
    for (int k = 0; k < sites(); ++k) {
      absl::StrAppend(&out, "\nLHW_NS_", k + 1, "=", specs_[k].ns, "\nLHW_ADDR_", k + 1, "=",
                      specs_[k].address);
    }
    absl::StrAppend(&out, "\nLHW_DEV=", kDevice, "\nLHW_MTU=", options_.mtu,
                    "\nLHW_CONTROL=", options_.control, "\n");
    return out;
  }

  std::string Summary() const override {
    std::string out;
    auto line = [&out](int k, absl::string_view dir, const DirectionCounters& c) {
      absl::StrAppend(&out, "longhaul-wanem site", k, " ", dir, ": forwarded ",
                      c.forwarded_packets.load(), " packets (", c.forwarded_bytes.load(),
                      " bytes), dropped by queue ", c.dropped_queue.load(), ", by loss ",
                      c.dropped_loss.load(), ", by cut ", c.dropped_cut.load(), ", by overflow ",
                      c.dropped_overflow.load(), "\n");
    };
    for (const auto& site : site_objs_) {
      line(site->index(), "up", site->uplink_counters());
      line(site->index(), "down", site->downlink().counters());
    }
    return out;
  }

 private:
  // Calls `apply(site, up, down)` for the directions `which` names: "" or
  // "all" (every site, both ways), or "K [up|down|both]".
  absl::Status ForDirections(absl::string_view which,
                             absl::FunctionRef<void(StarSite&, bool up, bool down)> apply) {
    std::vector<absl::string_view> words = absl::StrSplit(which, ' ', absl::SkipEmpty());
    if (words.empty() || words[0] == "all") {
      for (auto& site : site_objs_) apply(*site, true, true);
      return absl::OkStatus();
    }
    int k;
    absl::string_view site_word = words[0];
    absl::ConsumePrefix(&site_word, "site");
    if (!absl::SimpleAtoi(site_word, &k) || k < 1 || k > sites() || words.size() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown link '", which, "' (all, or K [up|down|both], K in 1..", sites(), ")"));
    }
    const absl::string_view dir = words.size() > 1 ? words[1] : "both";
    if (dir != "up" && dir != "down" && dir != "both") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown direction '", dir, "' (up, down, both)"));
    }
    if (site_objs_.empty()) return absl::OkStatus();
    apply(*site_objs_[k - 1], dir != "down", dir != "up");
    return absl::OkStatus();
  }

  int sites() const { return static_cast<int>(options_.links.size()); }

  StarOptions options_;
  std::vector<SiteSpec> specs_;
  std::vector<int> tun_fds_;
  int stop_fd_ = -1;
  std::vector<std::unique_ptr<StarSite>> site_objs_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<Emulator> NewStarEmulator(StarOptions options) {
  return std::make_unique<StarEmulator>(std::move(options));
}

}  // namespace longhaul::wanem
