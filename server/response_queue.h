// The responses of one Generate call on their way to the client.
//
// gRPC's callback API allows one write in flight per stream. Tokens come from the engine at its
// step rate whatever the client reads, so while a write is in flight the chunks that arrive for a
// completion are merged into that completion's last queued message (token ids, text and logprobs
// appended in order, the final fields taken when the completion ends) instead of each becoming a
// message of its own: a client that reads slower than the model writes gets fewer, larger
// messages, and the call holds at most one queued message per completion (per
// `max_merged_bytes` of output) beside the one in flight, not one per token. The API allows it:
// GenerateResponse.token_ids is "tokens produced since the previous message (usually one)".
//
// Not thread-safe: the reactor calls it under its own mutex.
#ifndef KVRM_SERVER_RESPONSE_QUEUE_H_
#define KVRM_SERVER_RESPONSE_QUEUE_H_

#include <cstdint>
#include <deque>

#include "kvrm/v1/kvrm.pb.h"

namespace kvrm {

class ResponseQueue {
 public:
  // No chunk is merged into a message whose chunks add up to `max_merged_bytes` (serialized)
  // with it, which keeps every message under gRPC's send limit (--max_message_bytes); a chunk
  // larger than that on its own is queued as it is.
  explicit ResponseQueue(size_t max_merged_bytes) : max_merged_bytes_(max_merged_bytes) {}

  // Queues `msg` (merging it into its completion's last queued message when it can). Returns the
  // message to start writing when no write was in flight (it is then in flight), else null.
  const v1::GenerateResponse* Push(v1::GenerateResponse msg);

  // The write in flight completed. Returns the next message to write (now in flight), or null
  // when the queue is empty (nothing in flight).
  const v1::GenerateResponse* WriteDone();

  // Drops everything not yet written (the client is gone). A write in flight stays owned here
  // until WriteDone.
  void DropQueued();

  bool writing() const { return writing_; }
  // Messages held, the one in flight included.
  size_t size() const { return entries_.size(); }
  // Chunks merged into a queued message so far.
  uint64_t merged_chunks() const { return merged_chunks_; }

 private:
  struct Entry {
    v1::GenerateResponse msg;
    size_t bytes = 0;  // the serialized sizes of the chunks in msg, added (at least its size)
  };
  const size_t max_merged_bytes_;
  // deque::push_back keeps references to other elements valid: the one in flight stays put.
  std::deque<Entry> entries_;  // front() is in flight while writing_
  bool writing_ = false;
  uint64_t merged_chunks_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_RESPONSE_QUEUE_H_
