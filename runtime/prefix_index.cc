#include "runtime/prefix_index.h"

#include <algorithm>

#include "common/logging.h"

namespace kvrm {

void PrefixIndex::Init(int64_t blocks, int32_t block_tokens, bool enabled) {
  block_tokens_ = block_tokens;
  registered_.assign(blocks, 0);
  if (!enabled) return;
  key_parent_.assign(blocks, -1);
  key_parent_gen_.assign(blocks, 0);
  gen_.assign(blocks, 0);
  key_tokens_.assign(blocks * block_tokens, 0);
  size_t n = 1;
  while (n < static_cast<size_t>(blocks)) n <<= 1;
  buckets_.assign(n, -1);
  bucket_next_.assign(blocks, -1);
  idle_prev_.assign(blocks, -1);
  idle_next_.assign(blocks, -1);
  idle_stamp_.assign(blocks, 0);
}

size_t PrefixIndex::Bucket(int32_t parent, uint64_t parent_gen, const int32_t* tokens) const {
  // splitmix64 steps over the key's words.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(mix(static_cast<uint32_t>(parent)) ^ parent_gen);
  for (int32_t i = 0; i < block_tokens_; ++i) h = mix(h ^ static_cast<uint32_t>(tokens[i]));
  return h & (buckets_.size() - 1);
}

void PrefixIndex::Link(int32_t b, int32_t parent, uint64_t parent_gen, const int32_t* tokens) {
  key_parent_[b] = parent;
  key_parent_gen_[b] = parent_gen;
  std::copy(tokens, tokens + block_tokens_, &key_tokens_[static_cast<size_t>(b) * block_tokens_]);
  const size_t h = Bucket(parent, parent_gen, tokens);
  bucket_next_[b] = buckets_[h];
  buckets_[h] = b;
}

void PrefixIndex::Unlink(int32_t b) {
  const size_t h = Bucket(key_parent_[b], key_parent_gen_[b], tokens(b));
  for (int32_t* link = &buckets_[h]; *link >= 0; link = &bucket_next_[*link]) {
    if (*link == b) {
      *link = bucket_next_[b];
      break;
    }
  }
  bucket_next_[b] = -1;
}

void PrefixIndex::Insert(int32_t b, int32_t parent, uint64_t parent_gen, const int32_t* tokens) {
  DCHECK(!registered_[b]);
  registered_[b] = 1;
  Link(b, parent, parent_gen, tokens);
  ++count_;
}

void PrefixIndex::Rekey(int32_t b, int32_t parent, uint64_t parent_gen, const int32_t* tokens) {
  Unlink(b);
  Link(b, parent, parent_gen, tokens);
}

void PrefixIndex::Remove(int32_t b) {
  DCHECK(registered_[b]);
  Unlink(b);
  registered_[b] = 0;
  ++gen_[b];
  --count_;
}

int32_t PrefixIndex::Find(int32_t parent, uint64_t parent_gen, const int32_t* key) const {
  for (int32_t b = buckets_[Bucket(parent, parent_gen, key)]; b >= 0; b = bucket_next_[b]) {
    if (key_parent_[b] == parent && key_parent_gen_[b] == parent_gen &&
        std::equal(key, key + block_tokens_, tokens(b))) {
      return b;
    }
  }
  return -1;
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
