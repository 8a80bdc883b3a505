#include "server/response_queue.h"

#include <utility>

namespace kvrm {
const v1::GenerateResponse* ResponseQueue::Push(v1::GenerateResponse msg) {
  const size_t bytes = msg.ByteSizeLong();
  if (!writing_) {
    entries_.push_back(Entry{std::move(msg), bytes});
    writing_ = true;
    return &entries_.front().msg;
  }
  // The completion's last queued message (never the one in flight, entries_.front()).
  for (size_t k = entries_.size(); k-- > 1;) {
    Entry& e = entries_[k];
    if (e.msg.index() != msg.index()) continue;
    if (e.msg.has_finished() || e.bytes + bytes > max_merged_bytes_) break;
    e.msg.mutable_token_ids()->MergeFrom(msg.token_ids());
    e.msg.mutable_text()->append(msg.text());
    // Thinking always comes before the answer, so a merged message's reasoning_text precedes its
    // text as the pieces did.
    e.msg.mutable_reasoning_text()->append(msg.reasoning_text());
    e.msg.mutable_logprobs()->MergeFrom(msg.logprobs());
    e.msg.mutable_prompt_logprobs()->MergeFrom(msg.prompt_logprobs());
    if (msg.has_prompt_usage()) *e.msg.mutable_prompt_usage() = msg.prompt_usage();
    e.msg.mutable_prompt_token_ids()->MergeFrom(msg.prompt_token_ids());
    for (v1::ToolCallDelta& d : *msg.mutable_tool_call_deltas()) {
      // A call's next piece joins its previous one; a call's first delta stays its own entry.
      const int n = e.msg.tool_call_deltas_size();
      if (n > 0 && d.id().empty() && e.msg.tool_call_deltas(n - 1).index() == d.index()) {
        e.msg.mutable_tool_call_deltas(n - 1)->mutable_arguments()->append(d.arguments());
      } else {
        *e.msg.add_tool_call_deltas() = std::move(d);
      }
    }
    if (msg.has_finished()) *e.msg.mutable_finished() = std::move(*msg.mutable_finished());
    e.bytes += bytes;
    ++merged_chunks_;
    return nullptr;
  }
  entries_.push_back(Entry{std::move(msg), bytes});
  return nullptr;
}

const v1::GenerateResponse* ResponseQueue::WriteDone() {
  if (!entries_.empty()) entries_.pop_front();
  if (entries_.empty()) {
    writing_ = false;
    return nullptr;
  }
  return &entries_.front().msg;
}

void ResponseQueue::DropQueued() {
  while (entries_.size() > (writing_ ? 1u : 0u)) entries_.pop_back();
}

}  // namespace kvrm
