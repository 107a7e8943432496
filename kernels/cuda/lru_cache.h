// A bounded map that forgets its least recently used entry when full: the cache of cuDNN
// graphs and plans (cudnn_attention.h), whose entries hold device-side resources and must not
// grow with every shape a long run meets. Host code only.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <unordered_map>
#include <utility>

namespace dhp::cuda {

template <class Key, class Value, class Hash = std::hash<Key>>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // The entry of `key`, made by make() when missing (evicting the least recently used entry
  // when the cache is full). A throwing make() leaves the cache as it was.
  template <class Make>
  Value& get(const Key& key, Make&& make) {
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      ++hits_;
      return it->second->second;
    }
    Value v = make();
    if (order_.size() == capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++evictions_;
    }
    order_.emplace_front(key, std::move(v));
    index_.emplace(key, order_.begin());
    ++misses_;
    return order_.front().second;
  }

  void clear() {
    index_.clear();
    order_.clear();
  }

  const Value* find(const Key& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &it->second->second;
  }
  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }
  size_t evictions() const { return evictions_; }

 private:
  using Entry = std::pair<Key, Value>;
  size_t capacity_;
  std::list<Entry> order_;  // most recently used first
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
  size_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace dhp::cuda
