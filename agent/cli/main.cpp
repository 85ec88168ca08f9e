// factory-agent: provisions a guest VM at first boot and reports to the coordinator.
#include <iostream>

int main() {
  std::cerr << "factory-agent: not built yet\n";
  return 1;
}
