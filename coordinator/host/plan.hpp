#pragma once
// A bind or unbind is computed first as a plan of steps, each shown as the
// shell command an admin would type, so that --dry-run prints exactly what
// would run and changes nothing. Executing runs the steps in order, checks
// that each took effect, and when a card's step fails puts that card back the
// way it was (undoing its steps in reverse) and says exactly where it is.
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "coordinator/host/host_root.hpp"
#include "coordinator/host/pci.hpp"

namespace factory::host {

struct Step {
  std::string command;  // "echo 0000:01:00.0 > /sys/bus/pci/drivers/vfio-pci/bind"
  std::string note;     // why, when it is not obvious; printed as a shell comment
  // Does it and checks that it took effect. false: nothing needed doing any
  // more (an earlier step, or driverctl itself, already did it).
  std::function<Result<bool>()> apply;
  // Puts back what apply changed; empty when there is nothing to put back.
  std::function<Status()> undo;
};

// The driver-side state of one function, for reporting and recovery.
struct FunctionState {
  PciAddress address;
  std::string driver;           // empty: no driver
  std::string driver_override;  // empty: none
  std::optional<std::string> driverctl;
  bool operator==(const FunctionState&) const = default;
};
FunctionState read_function_state(const HostRoot& root, const PciAddress& addr);
// "on nvidia, no driver_override, no driverctl override"
std::string describe(const FunctionState& s);
// Shell commands that take a function from `now` back to `want`.
std::vector<std::string> recovery_commands(const FunctionState& now, const FunctionState& want);

// The functions of one IOMMU group that move together: usually one card and
// its own audio / USB functions.
struct CardPlan {
  PciAddress card;                    // the address asked for
  std::vector<PciAddress> functions;  // everything that moves, card first
  std::string summary;                // "10de:27b8 AD104GL [L4], on nvidia, IOMMU group 13"
  std::vector<Step> steps;
  std::vector<FunctionState> before;  // as found, for rollback and its report
};

struct HostPlan {
  std::string verb;                    // "bind" or "unbind"
  bool rollback = true;                // bind: undo a failed card; unbind: report and stop
  std::vector<Step> prepare;           // host-wide, before any card: modules, persistenced
  std::vector<CardPlan> cards;         // cards with something to do
  std::vector<Step> finish;            // host-wide, always run at the end
  std::vector<std::string> unchanged;  // "0000:41:00.0: already bound to vfio-pci"
  std::vector<std::string> notes;      // printed after a successful run

  bool empty() const { return prepare.empty() && cards.empty(); }
};

// Prints the plan as commands (what --dry-run shows).
void print_plan(std::ostream& out, const HostPlan& plan);

// Runs the plan, printing each step as it completes. The error, when there is
// one, is a single line naming the step that failed, where each function of
// the card is now, and the commands that recover it if the rollback failed.
Status execute_plan(const HostRoot& root, HostPlan& plan, std::ostream& out);

}  // namespace factory::host
