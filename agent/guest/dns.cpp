#include "agent/guest/dns.hpp"

#include <algorithm>
#include <regex>
#include <sstream>

#include "common/atomic_file.hpp"
#include "common/cidr.hpp"
#include "common/subprocess.hpp"

namespace factory::agent {

namespace {

bool is_loopback(const std::string& addr) {
  auto a = Ipv4Cidr::parse_address(addr);
  if (a) return (*a >> 24) == 127;
  return addr == "::1";
}

}  // namespace

std::vector<std::string> parse_resolv_conf(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word, addr;
    ls >> word >> addr;
    if (word == "nameserver" && !addr.empty() && !is_loopback(addr)) out.push_back(addr);
  }
  return out;
}

std::vector<std::string> parse_resolvectl_status(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  static const std::regex re(R"(^\s*(?:Current DNS Server|DNS Servers):\s*(.*)$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, re)) continue;
    std::istringstream ws(m[1].str());
    std::string addr;
    while (ws >> addr) {
      // resolvectl may print "10.43.0.10#dns.example" (DNS over TLS names).
      addr = addr.substr(0, addr.find('#'));
      if (!is_loopback(addr) && std::find(out.begin(), out.end(), addr) == out.end())
        out.push_back(addr);
    }
  }
  return out;
}

std::vector<std::string> guest_dns_servers(const GuestEnv& env) {
  std::vector<std::string> found;
  for (const char* f : {"/run/systemd/resolve/resolv.conf", "/etc/resolv.conf"}) {
    auto text = read_file(env.path(f));
    if (!text) continue;
    found = parse_resolv_conf(*text);
    if (!found.empty()) break;
  }
  if (found.empty()) {
    CommandSpec spec;
    spec.argv = {"resolvectl", "status"};
    spec.timeout = std::chrono::seconds(10);
    auto r = run_command(spec);
    if (r && r->ok()) found = parse_resolvectl_status(r->output);
  }
  std::vector<std::string> unique;
  for (auto& s : found)
    if (std::find(unique.begin(), unique.end(), s) == unique.end()) unique.push_back(s);
  return unique;
}

}  // namespace factory::agent
