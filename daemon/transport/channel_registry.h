#ifndef LONGHAUL_DAEMON_TRANSPORT_CHANNEL_REGISTRY_H_
#define LONGHAUL_DAEMON_TRANSPORT_CHANNEL_REGISTRY_H_

// The channels a component is using right now, so that another thread can
// abort them all (a shutdown, a cancelled transfer, a new attempt replacing
// an old one) and wait until their users have let go of them.

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "daemon/transport/transport.h"

namespace longhaul::transport {

// Thread-safe. Holds pointers, not channels: the thread that registers a
// channel keeps owning it and must keep it alive while its Registration
// lives. The registry's lock is taken inside its callers' locks, never
// around them: call it with any of the caller's mutexes held, but do not
// take one from inside ForEach.
class ChannelRegistry {
 public:
  // Removes its channel from the registry on destruction (or Reset). An
  // empty one (after Close) registered nothing. Move-only.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration() { Reset(); }

    explicit operator bool() const { return registry_ != nullptr; }
    // Removes the channel now. Does nothing when empty.
    void Reset();

   private:
    friend class ChannelRegistry;
    Registration(ChannelRegistry* registry, Channel* channel)
        : registry_(registry), channel_(channel) {}

    ChannelRegistry* registry_ = nullptr;
    Channel* channel_ = nullptr;
  };

  ChannelRegistry() = default;
  ChannelRegistry(const ChannelRegistry&) = delete;
  ChannelRegistry& operator=(const ChannelRegistry&) = delete;
  // Every Registration is gone by then.
  ~ChannelRegistry();

  // Registers `channel` until the returned Registration goes. After Close()
  // it registers nothing and returns an empty Registration: the caller then
  // drops the channel unused.
  [[nodiscard]] Registration Add(Channel& channel) ABSL_LOCKS_EXCLUDED(mu_);

  // Aborts every registered channel (Channel::Abort: any thread may).
  // Channels registered later are not affected.
  void AbortAll() ABSL_LOCKS_EXCLUDED(mu_);
  // AbortAll, and every later Add registers nothing: for a shutdown, where a
  // channel arriving after it must not run.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Calls fn on every registered channel, under the registry's lock: `fn`
  // may call the channel's thread-safe methods (Abort, LimitPacingRate) and
  // must not block or take a lock that is held around calls into this
  // registry.
  void ForEach(absl::FunctionRef<void(Channel&)> fn) ABSL_LOCKS_EXCLUDED(mu_);

  bool empty() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until no channel is registered. The caller holds none of the
  // locks that the channels' users need before they let go.
  void WaitUntilEmpty() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Remove(Channel* channel) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_set<Channel*> channels_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace longhaul::transport

#endif  // LONGHAUL_DAEMON_TRANSPORT_CHANNEL_REGISTRY_H_
