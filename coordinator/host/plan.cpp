#include "coordinator/host/plan.hpp"

#include <ostream>

#include "coordinator/host/host_state.hpp"
#include "coordinator/host/sysfs.hpp"

namespace factory::host {

FunctionState read_function_state(const HostRoot& root, const PciAddress& addr) {
  FunctionState s;
  s.address = addr;
  const std::string dir = "/sys/bus/pci/devices/" + addr.str();
  s.driver = read_link_name(root, dir + "/driver").value_or("");
  if (auto ov = read_attr(root, dir + "/driver_override"))
    if (*ov != "(null)") s.driver_override = *ov;
  s.driverctl = driverctl_override(root, addr);
  return s;
}

std::string describe(const FunctionState& s) {
  std::string d = s.driver.empty() ? "on no driver" : "on " + s.driver;
  d +=
      s.driver_override.empty() ? ", no driver_override" : ", driver_override " + s.driver_override;
  d += s.driverctl ? ", driverctl override " + *s.driverctl : ", no driverctl override";
  return d;
}

std::vector<std::string> recovery_commands(const FunctionState& now, const FunctionState& want) {
  std::vector<std::string> cmds;
  const std::string a = now.address.str();
  const std::string dir = "/sys/bus/pci/devices/" + a;
  if (now.driverctl != want.driverctl) {
    // driverctl rebinds as it goes, so it comes first; what follows fixes up the rest.
    if (want.driverctl)
      cmds.push_back("driverctl set-override " + a + " " + *want.driverctl);
    else
      cmds.push_back("driverctl unset-override " + a);
  }
  if (now.driver_override != want.driver_override)
    cmds.push_back(echo_command(want.driver_override, dir + "/driver_override"));
  if (now.driver != want.driver) {
    if (!now.driver.empty()) cmds.push_back(echo_command(a, dir + "/driver/unbind"));
    if (!want.driver.empty())
      cmds.push_back(echo_command(a, "/sys/bus/pci/drivers/" + want.driver + "/bind"));
  }
  return cmds;
}

namespace {

void print_step(std::ostream& out, const std::string& prefix, const Step& s) {
  out << prefix << s.command;
  if (!s.note.empty()) out << "    # " << s.note;
  out << "\n";
}

std::string plan_join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// A step's error usually starts with the step's own command; it is already
// named, so it is not repeated.
std::string reason(const Step& s, const Error& e) {
  const std::string prefix = s.command + ": ";
  return e.message.rfind(prefix, 0) == 0 ? e.message.substr(prefix.size()) : e.message;
}

// Runs the finishing steps; their failures are reported but do not hide the
// main result.
void run_finish(HostPlan& plan, std::ostream& out, std::vector<std::string>& problems) {
  bool header = false;
  for (auto& s : plan.finish) {
    auto r = s.apply();
    if (r && !*r) continue;
    if (!header) out << "afterwards:\n";
    header = true;
    if (!r) {
      out << "  FAIL  " << s.command << ": " << reason(s, r.error()) << "\n";
      problems.push_back(s.command + ": " + reason(s, r.error()));
    } else {
      print_step(out, "  ok    ", s);
    }
  }
}

}  // namespace

void print_plan(std::ostream& out, const HostPlan& plan) {
  if (!plan.prepare.empty()) {
    out << "host:\n";
    for (const auto& s : plan.prepare) print_step(out, "  ", s);
  }
  for (const auto& c : plan.cards) {
    out << c.card.str() << " (" << c.summary << "):\n";
    for (const auto& s : c.steps) print_step(out, "  ", s);
  }
  if (!plan.finish.empty() && !plan.empty()) {
    out << "afterwards:\n";
    for (const auto& s : plan.finish) print_step(out, "  ", s);
  }
  for (const auto& u : plan.unchanged) out << u << "\n";
}

Status execute_plan(const HostRoot& root, HostPlan& plan, std::ostream& out) {
  std::vector<std::string> finish_problems;
  if (!plan.prepare.empty()) out << "host:\n";
  for (auto& s : plan.prepare) {
    auto r = s.apply();
    if (!r) {
      out << "  FAIL  " << s.command << ": " << reason(s, r.error()) << "\n";
      run_finish(plan, out, finish_problems);
      return Error(r.error().code, plan.verb + " stopped before touching any card: \"" + s.command +
                                       "\" failed: " + reason(s, r.error()));
    }
    print_step(out, *r ? "  ok    " : "  skip  ", s);
  }
  std::vector<std::string> done;
  for (size_t ci = 0; ci < plan.cards.size(); ++ci) {
    CardPlan& c = plan.cards[ci];
    out << c.card.str() << " (" << c.summary << "):\n";
    std::vector<Step*> applied;
    for (auto& s : c.steps) {
      auto r = s.apply();
      if (r) {
        print_step(out, *r ? "  ok    " : "  skip  ", s);
        if (*r) applied.push_back(&s);
        continue;
      }
      // The step failed: put the card back, then say exactly where it is.
      out << "  FAIL  " << s.command << ": " << reason(s, r.error()) << "\n";
      std::vector<std::string> undo_errors;
      if (plan.rollback) {
        for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
          if (!(*it)->undo) continue;
          auto u = (*it)->undo();
          if (!u) {
            out << "  rollback of \"" << (*it)->command << "\" failed: " << u.error().message
                << "\n";
            undo_errors.push_back(u.error().message);
          }
        }
      }
      std::vector<std::string> where, recover;
      bool back_as_before = true;
      for (const auto& before : c.before) {
        FunctionState now = read_function_state(root, before.address);
        if (!(now == before)) back_as_before = false;
        where.push_back(before.address.str() + " is " + describe(now));
        if (plan.rollback) {
          for (auto& cmd : recovery_commands(now, before)) recover.push_back(cmd);
        }
      }
      if (!plan.rollback) {
        // Unbind: recovering means finishing what was left undone.
        bool after = false;
        for (auto& st : c.steps) {
          if (&st == &s) after = true;
          if (after) recover.push_back(st.command);
        }
      }
      run_finish(plan, out, finish_problems);
      std::string msg = plan.verb + " " + c.card.str() + " failed at \"" + s.command +
                        "\": " + reason(s, r.error()) + "; ";
      if (plan.rollback && back_as_before)
        msg += "rolled back: " + plan_join(where, "; ") + ", as before the " + plan.verb;
      else
        msg += (plan.rollback ? "rollback incomplete: " : "") + plan_join(where, "; ") +
               (recover.empty() ? std::string() : "; to recover: " + plan_join(recover, "; "));
      if (!done.empty()) msg += " (already done: " + plan_join(done, ", ") + ")";
      if (ci + 1 < plan.cards.size()) {
        std::vector<std::string> rest;
        for (size_t k = ci + 1; k < plan.cards.size(); ++k)
          rest.push_back(plan.cards[k].card.str());
        msg += " (not attempted: " + plan_join(rest, ", ") + ")";
      }
      return Error(
          r.error().code == Errc::invalid_argument ? Errc::failed_precondition : r.error().code,
          msg);
    }
    done.push_back(c.card.str());
  }
  run_finish(plan, out, finish_problems);
  for (const auto& u : plan.unchanged) out << u << "\n";
  for (const auto& n : plan.notes) out << n << "\n";
  if (!finish_problems.empty())
    return Error(Errc::io, plan.verb + " done, but a finishing step failed: " +
                               plan_join(finish_problems, "; "));
  return ok_status();
}

}  // namespace factory::host
