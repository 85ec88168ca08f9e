#include "common/net/server_admission.hpp"

namespace factory::net {

bool Admission::take_address(const std::string& address) {
  if (max_per_address_ == 0) return true;
  std::lock_guard lk(addresses_mu_);
  auto& open = open_by_address_[address];
  if (open >= max_per_address_) return false;
  ++open;
  return true;
}

void Admission::release_address(const std::string& address) {
  if (max_per_address_ == 0) return;
  std::lock_guard lk(addresses_mu_);
  auto it = open_by_address_.find(address);
  if (it == open_by_address_.end()) return;
  if (--it->second == 0) open_by_address_.erase(it);
}

Admission::Slot Admission::take_stranger_slot(const std::string& address, Socket& sock,
                                              std::size_t thread) {
  std::lock_guard lk(mu_);
  auto& mine = strangers_by_address_[address];
  if (strangers_total_ < strangers_.max_total && mine < strangers_.max_per_address) {
    ++mine;
    ++strangers_total_;
    return Slot::granted;
  }
  if (mine == 0) strangers_by_address_.erase(address);
  if (mine == 0 || waiting_total_ >= strangers_.max_waiting) return Slot::refused;
  waiting_by_address_[address].push_back({std::move(sock), thread, Clock::now()});
  ++waiting_total_;
  return Slot::waiting;
}

Admission::Released Admission::release_stranger_slot(const std::string& address, bool stopping) {
  Released out;
  std::lock_guard lk(mu_);
  auto wit = waiting_by_address_.find(address);
  if (wit != waiting_by_address_.end()) {
    auto& q = wit->second;
    const auto oldest = Clock::now() - strangers_.deadline;
    while (!q.empty() && !out.next) {
      Waiting w = std::move(q.front());
      q.pop_front();
      --waiting_total_;
      if (w.since < oldest || stopping)
        out.expired.push_back(std::move(w.sock));
      else
        out.next = std::move(w);
    }
    if (q.empty()) waiting_by_address_.erase(wit);
  }
  if (!out.next) {
    auto it = strangers_by_address_.find(address);
    if (it != strangers_by_address_.end() && --it->second == 0) strangers_by_address_.erase(it);
    if (strangers_total_ > 0) --strangers_total_;
    out.resume_accepting = unpause_locked();
  }
  return out;
}

bool Admission::room_or_pause() {
  std::lock_guard lk(mu_);
  if (room_locked()) return true;
  accept_paused_ = true;
  return false;
}

void Admission::handshake_started() {
  std::lock_guard lk(mu_);
  ++handshaking_;
}

bool Admission::handshake_ended() {
  std::lock_guard lk(mu_);
  if (handshaking_ > 0) --handshaking_;
  return unpause_locked();
}

std::unordered_map<std::string, std::deque<Admission::Waiting>> Admission::take_all_waiting() {
  std::unordered_map<std::string, std::deque<Waiting>> all;
  std::lock_guard lk(mu_);
  all.swap(waiting_by_address_);
  waiting_total_ = 0;
  return all;
}

std::size_t Admission::strangers_open() const {
  std::lock_guard lk(mu_);
  return strangers_total_;
}

std::size_t Admission::strangers_waiting() const {
  std::lock_guard lk(mu_);
  return waiting_total_;
}

}  // namespace factory::net
