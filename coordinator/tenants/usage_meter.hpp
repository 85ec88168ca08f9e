#pragma once
// GPU usage as the tenants service meters it (docs/usage.md): each look at
// a tenant's VM (VmProvider::observe, on the leader's maintenance thread)
// folded into the record's store::GpuUsage, with the busy GPU-seconds its
// latest health sample shows. Writes are coalesced: an interval that opens
// or closes is written at once; an open interval's last-seen time and the
// busy seconds at most every `write_every`, so a coordinator killed loses
// at most that much of an interval whose VM stopped while it was down (one
// still running is found again by its instance and loses nothing).
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/store/store.hpp"
#include "coordinator/tenants/vm_provider.hpp"

namespace factory::tenants {

struct UsageMeterOptions {
  std::int64_t write_every = 60;  // seconds between writes of an unchanged interval
  // The most one look credits busy time for: a gap (no look, no fresh
  // sample) is not credited. The agent sends a sample at least every 60 s.
  std::int64_t busy_cap = 60;
  std::int64_t sample_fresh = 90;  // a health sample older than this credits nothing
};

// What usage needs of a look at the VM: the provider's observation with the
// record's card model and count (what the VM holds while it runs).
store::UsageObservation usage_observation(const store::TenantRecord& t, const VmObservation& o,
                                          std::int64_t now);
// The busy fraction summed over the sample's cards (2 cards at 50 % = 1.0).
double busy_gpus(const proto::HealthSample& s);

class UsageMeter {
 public:
  UsageMeter(store::Store& store, UsageMeterOptions opts = {}) : store_(store), opts_(opts) {}

  // One look at `tenant`'s VM folded in (written when due, see above).
  Status fold(const std::string& tenant, const store::UsageObservation& o);
  // Its delete: the open interval closed now (or at its last look, when
  // that is stale) and written, before the store archives it with the record.
  Status close_for_delete(const std::string& tenant, std::int64_t now);
  // The records' open intervals carried to the latest look this meter made
  // (written or not), with the busy seconds not yet written, for a report that is current to the
  // look, not to the last write. A meter that made none (a replica that is not the leader) leaves
  // them as written.
  void catch_up(std::vector<store::TenantRecord>& records);

 private:
  struct Pending {
    std::int64_t last_look = 0, written_at = 0;
    double busy = 0;  // busy GPU-seconds not written yet
    // The latest look that saw it running, written or not: an interval that
    // closes at its last look closes at this one, not at the last written.
    std::optional<store::UsageObservation> last_running;
  };
  // The latest running look, not yet written, folded into `u`.
  static void catch_up(store::GpuUsage& u, const std::optional<store::UsageObservation>& seen);
  store::Store& store_;
  UsageMeterOptions opts_;
  std::mutex mu_;
  std::map<std::string, Pending> pending_;
};

}  // namespace factory::tenants
