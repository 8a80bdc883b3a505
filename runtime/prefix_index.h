// The prefix cache's index over the blocks of one KV tier (the pager keeps one per tier).
//
// Content-keyed chains (as vLLM's block hashes): a full block's chain hash is a keyed 128-bit
// SipHash of the chain hash before it (for a history's first block, of the cache salt) and the
// block's own tokens, so it names everything the block's K/V was computed from. A registered
// block is keyed by its parent's chain hash and its tokens, compared in full on a lookup (only
// a collision of the keyed 128-bit parent hash could return another history's KV: with a key
// drawn at start-up nobody can aim for one). Nothing in a key names another block: a block
// whose parent was evicted stays findable, and is found again once the same tokens are cached
// before it, in either tier (the pager's MatchPrefix walks both indexes a block at a time).
//
// Registered blocks nobody holds are idle: they sit on a list in release order (the oldest
// first), each stamped with when it was released, and are what eviction takes.
//
// Owner: the pager (no locking). Sized at start-up; nothing allocates afterwards.
#ifndef KVRM_RUNTIME_PREFIX_INDEX_H_
#define KVRM_RUNTIME_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/siphash.h"

namespace kvrm {

// Chain hashes of token blocks under one key.
class ChainHasher {
 public:
  explicit ChainHasher(SipKey key = {}) : key_(key) {}
  // What a history's first block chains from: its salt (namespaces never share a chain).
  Hash128 Root(uint64_t salt) const;
  // The chain hash of a block of `n` tokens after `parent`.
  Hash128 Next(const Hash128& parent, const int32_t* tokens, int32_t n) const;

 private:
  SipKey key_;
};

class PrefixIndex {
 public:
  // `blocks` ids; when `enabled` is false only registered() works (always false).
  void Init(int64_t blocks, int32_t block_tokens, bool enabled);

  bool registered(int32_t b) const { return registered_[b] != 0; }
  // A registered block's chain hash and the one before it.
  const Hash128& hash(int32_t b) const { return hash_[b]; }
  const Hash128& parent_hash(int32_t b) const { return parent_hash_[b]; }
  // Whether b is a history's first block (its parent hash is a salt's root).
  bool first(int32_t b) const { return first_[b] != 0; }
  // Registered and not hidden.
  bool linked(int32_t b) const { return !linked_.empty() && linked_[b] != 0; }
  const int32_t* tokens(int32_t b) const {
    return &key_tokens_[static_cast<size_t>(b) * block_tokens_];
  }
  int64_t count() const { return count_; }

  // Registers b (it must not be registered): `hash` is ChainHasher::Next(parent, tokens).
  void Insert(int32_t b, const Hash128& parent, const Hash128& hash, const int32_t* tokens,
              bool first);
  // Unregisters b (it must not be idle).
  void Remove(int32_t b);
  // Keeps b registered (held, or idle until evicted) but found by no lookup: its content is
  // not what its key says (a failed copy into it).
  void Hide(int32_t b);
  // The registered block with this key (`hash` as for Insert), or -1.
  int32_t Find(const Hash128& parent, const Hash128& hash, const int32_t* tokens) const;
  // A registered block with this chain hash, or -1 (tokens unchecked: for eviction order and
  // whether a chain goes on in this tier, never to hand out KV).
  int32_t FindHash(const Hash128& hash) const;
  // Of the linked blocks after `parent` (whole ones and tails), the one whose key shares the
  // longest run of leading tokens with tokens[0, n) (n <= block_tokens; a tail's key ends in
  // -1, which no token is): writes it to *block and returns that length, 0 (and -1) when none
  // shares the first token. The most recently registered win ties, and at most kChildScan of
  // the parent's blocks are compared (a salt's root has every history's first block after it;
  // blocks of other parents in the same bucket count a quarter each).
  int32_t LongestChild(const Hash128& parent, const int32_t* tokens, int32_t n,
                       int32_t* block) const;
  static constexpr int32_t kChildScan = 32;
  // The per-parent lists' consistency (for KvPager::CheckInvariants): every linked block in its
  // parent's bucket once, no other, links both ways; "" when so, else what is wrong.
  std::string CheckChildLists() const;

  // The idle list.
  void IdlePush(int32_t b);
  void IdleRemove(int32_t b);
  int32_t idle_head() const { return idle_head_; }
  int32_t idle_next(int32_t b) const { return idle_next_[b]; }
  uint64_t idle_stamp(int32_t b) const { return idle_stamp_[b]; }
  int64_t idle_count() const { return idle_count_; }

 private:
  size_t Bucket(const Hash128& hash) const { return hash.lo & (buckets_.size() - 1); }
  void Unlink(int32_t b);

  int32_t block_tokens_ = 0;
  std::vector<uint8_t> registered_;
  std::vector<uint8_t> linked_;  // registered and findable (not hidden)
  std::vector<uint8_t> first_;
  std::vector<Hash128> parent_hash_, hash_;
  std::vector<int32_t> key_tokens_;  // [blocks][block_tokens]
  std::vector<int32_t> buckets_;     // chain hash -> first block, -1: none
  std::vector<int32_t> bucket_next_;
  // Linked blocks by parent hash, the most recently registered first (LongestChild).
  std::vector<int32_t> child_buckets_;  // parent hash -> first block, -1: none
  std::vector<int32_t> child_prev_, child_next_;
  std::vector<int32_t> idle_prev_, idle_next_;
  std::vector<uint64_t> idle_stamp_;  // when each idle block was released (idle_clock_)
  uint64_t idle_clock_ = 0;
  int32_t idle_head_ = -1, idle_tail_ = -1;
  int64_t idle_count_ = 0;
  int64_t count_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_PREFIX_INDEX_H_
