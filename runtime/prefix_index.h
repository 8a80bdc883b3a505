// The prefix cache's index over the blocks of one KV tier (the pager keeps one per tier).
//
// A registered block's key is (its parent block, the parent's generation, its block_tokens
// tokens); the parent is the registered block before it in the history, or -1 with the cache
// salt in place of a generation for a history's first block. So a block is found only after
// exactly the same chain of tokens, and keys are compared in full: a hash collision can never
// return another history's KV. A block's generation is bumped when it leaves the cache, so that
// children registered under its old content never match whatever it holds next.
//
// Registered blocks nobody holds are idle: they sit on a list in release order (the oldest
// first), each stamped with when it was released, and are what eviction takes.
//
// Owner: the pager (no locking). Sized at start-up; nothing allocates afterwards.
#ifndef KVRM_RUNTIME_PREFIX_INDEX_H_
#define KVRM_RUNTIME_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvrm {

class PrefixIndex {
 public:
  // `blocks` ids; when `enabled` is false only registered() works (always false).
  void Init(int64_t blocks, int32_t block_tokens, bool enabled);

  bool registered(int32_t b) const { return registered_[b] != 0; }
  uint32_t gen(int32_t b) const { return gen_[b]; }
  int32_t parent(int32_t b) const { return key_parent_[b]; }
  uint64_t parent_gen(int32_t b) const { return key_parent_gen_[b]; }
  const int32_t* tokens(int32_t b) const {
    return &key_tokens_[static_cast<size_t>(b) * block_tokens_];
  }
  // Whether b's key still leads to it: a root, or a child of its parent's current content.
  bool ParentCurrent(int32_t b) const {
    return key_parent_[b] < 0 ||
           (registered_[key_parent_[b]] && gen_[key_parent_[b]] == key_parent_gen_[b]);
  }
  int64_t count() const { return count_; }

  // Registers b under a key (b must not be registered).
  void Insert(int32_t b, int32_t parent, uint64_t parent_gen, const int32_t* tokens);
  // Moves a registered b to another key.
  void Rekey(int32_t b, int32_t parent, uint64_t parent_gen, const int32_t* tokens);
  // Unregisters b (it must not be idle) and bumps its generation.
  void Remove(int32_t b);
  // Bumps b's generation (its children stop matching) without unregistering it.
  void BumpGen(int32_t b) { ++gen_[b]; }
  // The registered block with this key, or -1.
  int32_t Find(int32_t parent, uint64_t parent_gen, const int32_t* tokens) const;

  // The idle list.
  void IdlePush(int32_t b);
  void IdleRemove(int32_t b);
  int32_t idle_head() const { return idle_head_; }
  int32_t idle_next(int32_t b) const { return idle_next_[b]; }
  uint64_t idle_stamp(int32_t b) const { return idle_stamp_[b]; }
  int64_t idle_count() const { return idle_count_; }

 private:
  size_t Bucket(int32_t parent, uint64_t parent_gen, const int32_t* tokens) const;
  void Link(int32_t b, int32_t parent, uint64_t parent_gen, const int32_t* tokens);
  void Unlink(int32_t b);

  int32_t block_tokens_ = 0;
  std::vector<uint8_t> registered_;
  std::vector<int32_t> key_parent_;
  std::vector<uint64_t> key_parent_gen_;  // a root's: the salt
  std::vector<uint32_t> gen_;
  std::vector<int32_t> key_tokens_;  // [blocks][block_tokens]
  std::vector<int32_t> buckets_;     // hash -> first block, -1: none
  std::vector<int32_t> bucket_next_;
  std::vector<int32_t> idle_prev_, idle_next_;
  std::vector<uint64_t> idle_stamp_;  // when each idle block was released (idle_clock_)
  uint64_t idle_clock_ = 0;
  int32_t idle_head_ = -1, idle_tail_ = -1;
  int64_t idle_count_ = 0;
  int64_t count_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_PREFIX_INDEX_H_
