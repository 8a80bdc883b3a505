#include "runtime/prefix_index.h"

#include <algorithm>

#include "common/logging.h"

namespace kvrm {

Hash128 ChainHasher::Root(uint64_t salt) const {
  SipHash128Stream s(key_);
  s.UpdateU64(salt);  // 8 bytes: no block's input (16 + 4 n bytes) is that long
  return s.Final();
}

Hash128 ChainHasher::Next(const Hash128& parent, const int32_t* tokens, int32_t n) const {
  SipHash128Stream s(key_);
  s.UpdateU64(parent.lo);
  s.UpdateU64(parent.hi);
  int32_t i = 0;
  for (; i + 1 < n; i += 2) {
    s.UpdateU64(static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) |
                static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
  }
  if (i < n) {
    const uint32_t t = static_cast<uint32_t>(tokens[i]);
    const unsigned char b[4] = {static_cast<unsigned char>(t), static_cast<unsigned char>(t >> 8),
                                static_cast<unsigned char>(t >> 16),
                                static_cast<unsigned char>(t >> 24)};
    s.Update(b, 4);
  }
  return s.Final();
}

void PrefixIndex::Init(int64_t blocks, int32_t block_tokens, bool enabled) {
  block_tokens_ = block_tokens;
  registered_.assign(blocks, 0);
  if (!enabled) return;
  linked_.assign(blocks, 0);
  first_.assign(blocks, 0);
  parent_hash_.assign(blocks, Hash128{});
  hash_.assign(blocks, Hash128{});
  key_tokens_.assign(blocks * block_tokens, 0);
  size_t n = 1;
  while (n < static_cast<size_t>(blocks)) n <<= 1;
  buckets_.assign(n, -1);
  bucket_next_.assign(blocks, -1);
  child_buckets_.assign(n, -1);
  child_prev_.assign(blocks, -1);
  child_next_.assign(blocks, -1);
  idle_prev_.assign(blocks, -1);
  idle_next_.assign(blocks, -1);
  idle_stamp_.assign(blocks, 0);
}

void PrefixIndex::Unlink(int32_t b) {
  if (!linked_[b]) return;
  for (int32_t* link = &buckets_[Bucket(hash_[b])]; *link >= 0; link = &bucket_next_[*link]) {
    if (*link == b) {
      *link = bucket_next_[b];
      break;
    }
  }
  bucket_next_[b] = -1;
  const int32_t p = child_prev_[b], n = child_next_[b];
  (p >= 0 ? child_next_[p] : child_buckets_[Bucket(parent_hash_[b])]) = n;
  if (n >= 0) child_prev_[n] = p;
  child_prev_[b] = child_next_[b] = -1;
  linked_[b] = 0;
}

void PrefixIndex::Insert(int32_t b, const Hash128& parent, const Hash128& hash,
                         const int32_t* tokens, bool first) {
  DCHECK(!registered_[b]);
  registered_[b] = 1;
  first_[b] = first;
  linked_[b] = 1;
  parent_hash_[b] = parent;
  hash_[b] = hash;
  std::copy(tokens, tokens + block_tokens_, &key_tokens_[static_cast<size_t>(b) * block_tokens_]);
  const size_t h = Bucket(hash);
  bucket_next_[b] = buckets_[h];
  buckets_[h] = b;
  int32_t& children = child_buckets_[Bucket(parent)];
  child_prev_[b] = -1;
  child_next_[b] = children;
  if (children >= 0) child_prev_[children] = b;
  children = b;
  ++count_;
}

void PrefixIndex::Remove(int32_t b) {
  DCHECK(registered_[b]);
  Unlink(b);
  registered_[b] = 0;
  --count_;
}

void PrefixIndex::Hide(int32_t b) {
  DCHECK(registered_[b]);
  Unlink(b);
}

int32_t PrefixIndex::Find(const Hash128& parent, const Hash128& hash, const int32_t* key) const {
  for (int32_t b = buckets_[Bucket(hash)]; b >= 0; b = bucket_next_[b]) {
    if (hash_[b] == hash && parent_hash_[b] == parent &&
        std::equal(key, key + block_tokens_, tokens(b))) {
      return b;
    }
  }
  return -1;
}

int32_t PrefixIndex::FindHash(const Hash128& hash) const {
  for (int32_t b = buckets_[Bucket(hash)]; b >= 0; b = bucket_next_[b]) {
    if (hash_[b] == hash) return b;
  }
  return -1;
}

int32_t PrefixIndex::LongestChild(const Hash128& parent, const int32_t* tokens, int32_t n,
                                  int32_t* block) const {
  *block = -1;
  int32_t best = 0;
  // (Another parent's blocks share the bucket now and then: a salt's root, with every first
  // block after it, would make a long walk of it, so they count too, at a quarter each.)
  int32_t scanned = 0;
  for (int32_t b = child_buckets_[Bucket(parent)]; b >= 0 && scanned < 4 * kChildScan && best < n;
       b = child_next_[b]) {
    DCHECK(linked_[b]);
    if (!(parent_hash_[b] == parent)) {
      ++scanned;
      continue;
    }
    scanned += 4;
    const int32_t* key = this->tokens(b);
    const int32_t k = static_cast<int32_t>(std::mismatch(tokens, tokens + n, key).first - tokens);
    if (k > best) {
      best = k;
      *block = b;
    }
  }
  return best;
}

std::string PrefixIndex::CheckChildLists() const {
  if (linked_.empty()) return "";
  int64_t listed = 0, linked = 0;
  for (size_t h = 0; h < child_buckets_.size(); ++h) {
    int32_t prev = -1;
    for (int32_t b = child_buckets_[h]; b >= 0; prev = b, b = child_next_[b]) {
      if (++listed > static_cast<int64_t>(linked_.size())) return "a child list loops";
      if (!linked_[b]) return "block " + std::to_string(b) + " listed but not linked";
      if (Bucket(parent_hash_[b]) != h) return "block " + std::to_string(b) + " in another bucket";
      if (child_prev_[b] != prev) return "block " + std::to_string(b) + ": wrong prev link";
    }
  }
  for (uint8_t l : linked_) linked += l;
  if (listed != linked) {
    return std::to_string(linked) + " linked blocks, " + std::to_string(listed) + " listed";
  }
  return "";
}

void PrefixIndex::IdlePush(int32_t b) {
  idle_prev_[b] = idle_tail_;
  idle_next_[b] = -1;
  if (idle_tail_ >= 0) {
    idle_next_[idle_tail_] = b;
  } else {
    idle_head_ = b;
  }
  idle_tail_ = b;
  idle_stamp_[b] = ++idle_clock_;
  ++idle_count_;
}

void PrefixIndex::IdleRemove(int32_t b) {
  const int32_t p = idle_prev_[b], n = idle_next_[b];
  (p >= 0 ? idle_next_[p] : idle_head_) = n;
  (n >= 0 ? idle_prev_[n] : idle_tail_) = p;
  idle_prev_[b] = idle_next_[b] = -1;
  --idle_count_;
}

}  // namespace kvrm
