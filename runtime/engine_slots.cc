// Engine: the per-slot logic on the owner thread. Every slot state transition happens here:
// admission (kFree -> kPrefilling), prefill completion (-> kDecoding), preemption (-> kPaused),
// resumption (kPaused -> kDecoding or kPrefilling), and finishing (-> kFree).
#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "runtime/engine.h"

namespace kvrm {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// Physical block holding logical position `pos` of a slot, from a descriptor row.
int32_t HotBlock(const StepDescriptor& d, int32_t slot, int64_t pos, int32_t block_tokens) {
  const int64_t kept = KeptPosition(pos, block_tokens, d.far.sink_blocks, d.far_dropped[slot]);
  return static_cast<int32_t>(
      PhysicalToken(d.SlotRunsData(slot), d.num_runs[slot], block_tokens, kept) / block_tokens);
}

// Whether a descriptor row writes physical block `block`: the block of its input token's
// position, or of one of its drafts' positions.
bool WritesBlock(const StepDescriptor& d, int32_t slot, int32_t block, int32_t block_tokens) {
  const int64_t first = d.position[slot];
  const int64_t last = first + (d.max_draft > 0 ? d.num_draft[slot] : 0);
  for (int64_t pos = first; pos <= last; pos = (pos / block_tokens + 1) * block_tokens) {
    if (HotBlock(d, slot, pos, block_tokens) == block) return true;
  }
  return false;
}

}  // namespace

void Engine::SetState(int32_t slot, SlotState to) {
  const SlotState from = slots_[slot].state;
  bool ok = false;
  switch (to) {
    case SlotState::kPrefilling:  // admission, or resume by recompute
      ok = from == SlotState::kFree || from == SlotState::kPaused;
      break;
    case SlotState::kDecoding:  // prompt done, or resume by swap-in
      ok = from == SlotState::kPrefilling || from == SlotState::kPaused;
      break;
    case SlotState::kPaused:  // preemption under KV pressure
      ok = from == SlotState::kDecoding || from == SlotState::kPrefilling;
      break;
    case SlotState::kFinishing:  // EOS, stop, length, cancel, deadline, error
      ok = from != SlotState::kFree;
      break;
    case SlotState::kFree:  // output flushed, KV released
      ok = from == SlotState::kFinishing;
      break;
  }
  CHECK(ok) << "slot " << slot << ": no transition " << SlotStateName(from) << " -> "
            << SlotStateName(to);
  slots_[slot].state = to;
}

int64_t Engine::UnallocatedReservation(int32_t slot) const {
  const Slot& s = slots_[slot];
  if (s.state == SlotState::kFree || s.state == SlotState::kPaused || !pager_) return 0;
  return std::max<int64_t>(0, s.reserve_blocks - pager_->NumBlocks(slot));
}

int64_t Engine::UnallocatedReservations(int32_t except) const {
  int64_t total = 0;
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (i != except) total += UnallocatedReservation(i);
  }
  return total;
}

void Engine::TakePosted() {
  std::vector<std::unique_ptr<GenerationRequest>> posted;
  std::vector<uint64_t> cancels;
  bool cancel_all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted.swap(posted_);
    cancels.swap(cancels_);
    cancel_all = cancel_all_;
    cancel_all_ = false;
  }
  for (auto& r : posted) waiting_.push_back(std::move(r));
  if (cancels.empty() && !cancel_all) return;
  auto cancelled = [&](uint64_t handle) {
    return cancel_all || std::find(cancels.begin(), cancels.end(), handle) != cancels.end();
  };
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (slots_[i].state != SlotState::kFree && cancelled(slots_[i].request->handle)) {
      FinishSlot(i, FinishReason::kCancelled, {});
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (cancelled((*it)->handle)) {
      std::unique_ptr<GenerationRequest> r = std::move(*it);
      it = waiting_.erase(it);
      FinishQueued(std::move(r), FinishReason::kCancelled);
    } else {
      ++it;
    }
  }
}

void Engine::ExpireDeadlines(absl::Time now) {
  auto expired = [&](const GenerationRequest& r) {
    return r.time_limit > absl::ZeroDuration() && now - r.arrival >= r.time_limit;
  };
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (slots_[i].state != SlotState::kFree && expired(*slots_[i].request)) {
      StreamChunk last;
      if (slots_[i].text) last.text = slots_[i].text->Finish();
      FinishSlot(i, FinishReason::kTimeLimit, std::move(last));
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (expired(**it)) {
      std::unique_ptr<GenerationRequest> r = std::move(*it);
      it = waiting_.erase(it);
      FinishQueued(std::move(r), FinishReason::kTimeLimit);
    } else {
      ++it;
    }
  }
}

void Engine::NoteTransfer(int32_t slot) {
  transfer_owners_.emplace_back(PlanFence(), slots_[slot].request->handle);
}

bool Engine::RetireTransfers() {
  if (!transport_) return false;
  bool failed_any = false;
  absl::Status error;
  // completed() first: the transport records a batch's failure before it counts the batch as
  // completed, so every failed batch up to `completed` is in `failed` (in the other order a
  // batch failing in between would be retired unreported).
  const uint64_t completed = transport_->completed();
  const std::vector<uint64_t> failed = transport_->TakeFailedFences(&error);
  if (!failed.empty()) {
    // A failed copy leaves its destination blocks undefined: the requests whose KV it moved end
    // with ERROR; everyone else goes on. Moves are planned with the last fence of three batches
    // (see SubmitTransfers), so a failure of fence f concerns plans recorded at f, f+1 or f+2.
    // Host blocks a failed offload was writing leave the prefix cache.
    LOG(ERROR) << "transport: " << failed.size() << " batch(es) failed: " << error;
    pager_->DiscardFailedOffloads(failed);
    for (const auto& [fence, handle] : transfer_owners_) {
      bool hit = false;
      for (uint64_t f : failed) hit |= fence >= f && fence <= f + 2;
      if (!hit) continue;
      for (int32_t i = 0; i < options_.slots; ++i) {
        if (slots_[i].state != SlotState::kFree && slots_[i].request->handle == handle) {
          FinishSlot(i, FinishReason::kError, {}, "", std::string(error.message()));
          failed_any = true;
        }
      }
    }
  }
  pager_->RetireUpTo(completed);
  transfer_owners_.erase(std::remove_if(transfer_owners_.begin(), transfer_owners_.end(),
                                        [&](const auto& e) { return e.first <= completed; }),
                         transfer_owners_.end());
  return failed_any;
}

void Engine::ResumePaused() {
  if (!pager_) return;
  // Decoding slots each need room for their next block; resume only beyond that, so a resumed
  // request does not immediately push another one out.
  int64_t headroom = 0;
  for (const Slot& s : slots_) headroom += 2 * (s.state == SlotState::kDecoding);
  // A waiting newcomer of a higher priority, with a slot free for it, goes first: Admit (next)
  // admits it or pauses lower-priority requests for it, and a request resumed now would only be
  // paused again once its grace ran out.
  int32_t waiting_priority = std::numeric_limits<int32_t>::min();
  for (const auto& r : waiting_) waiting_priority = std::max(waiting_priority, r->priority);
  bool slot_free = false;
  for (const Slot& s : slots_) slot_free |= s.state == SlotState::kFree;
  for (;;) {
    int32_t pick = -1;
    for (int32_t i = 0; i < options_.slots; ++i) {
      const Slot& s = slots_[i];
      if (s.state != SlotState::kPaused) continue;
      if (pick < 0 || s.request->priority > slots_[pick].request->priority ||
          (s.request->priority == slots_[pick].request->priority &&
           s.admit_seq < slots_[pick].admit_seq)) {
        pick = i;
      }
    }
    if (pick < 0) return;
    if (slot_free && slots_[pick].request->priority < waiting_priority) return;
    Slot& s = slots_[pick];
    int64_t need = s.swapped ? pager_->NumBlocks(pick) + 1
                             : HistoryBlocksNeeded(static_cast<int64_t>(s.history.size()));
    // A resumed history must land in few enough runs that its first decode steps need no
    // compaction: one that paused because no extent could take its tail runs would otherwise be
    // resumed into the same fragmented space, fail again and pause again, round after round (a
    // livelock under KV pressure). It waits until the space that the others free makes room.
    // A cached prefix it attaches (recompute) brings its own runs: at most all but one.
    const int32_t runs = std::max(1, options_.max_runs - 1);
    // (A prompt being scored is prefilled whole: its tokens need their logits. Matching with
    // no runs still clears what an earlier match left for AttachCachedPrefix below.)
    const CachedPrefix prefix = MatchCachedPrefix(
        s.history,
        s.swapped || (s.generated == 0 && NeedsEveryPromptRow(*s.request)) ? 0 : runs - 1,
        s.request->cache_salt);
    need -= prefix.blocks;
    if (pager_->free_device_blocks() - prefix.idle < need + headroom) return;
    if (s.swapped) {
      if (!pager_->MakeRoomInRuns(pager_->NumBlocks(pick), runs)) return;
      const absl::Status st = pager_->PlanSwapIn(pick, PlanFence(), &moves_);
      if (!st.ok()) return;
      NoteTransfer(pick);
      s.swapped = false;
      SetState(pick, SlotState::kDecoding);
      s.resumed_step = steps_ + 1;
    } else {
      // (The cached prefix is attached first, so that making room cannot evict it. The new
      // blocks it took, host blocks' and a tail's copies, are of those the history needed.)
      const AttachedPrefix attached = AttachCachedPrefix(pick);
      const int64_t attached_new = pager_->NumBlocks(pick) - prefix.blocks;
      ReleaseBehindWindow(pick, attached.tokens);
      if (!pager_->MakeRoomInRuns(need - attached_new, runs - prefix.runs)) {
        kv_->Release(pick);
        return;
      }
      CHECK_OK(pager_->Grow(pick, FirstGrowTokens(static_cast<int64_t>(s.history.size()))));
      CountPrefixLookup(s.history.size(), attached);
      s.prefilled = attached.tokens;
      SetState(pick, SlotState::kPrefilling);
      s.resumed_step = steps_ + 1;
    }
    ++headroom;
  }
}

void Engine::Admit(absl::Time now) {
  // Paused requests come back before new ones of their priority or lower are let in (no
  // starvation by newcomers); a newcomer of a higher priority goes first, as it would have
  // preempted them.
  bool any_paused = false;
  int32_t paused_priority = std::numeric_limits<int32_t>::min();
  if (pager_) {
    for (const Slot& s : slots_) {
      if (s.state != SlotState::kPaused) continue;
      any_paused = true;
      paused_priority = std::max(paused_priority, s.request->priority);
    }
  }
  const int32_t usable = pager_ ? options_.slots : static_slots_;
  for (int32_t i = 0; i < usable && !waiting_.empty(); ++i) {
    if (slots_[i].state != SlotState::kFree) continue;
    // Highest priority first; FCFS within a priority (the deque is in arrival order).
    auto best = waiting_.begin();
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->priority > (*best)->priority) best = it;
    }
    if (any_paused && (*best)->priority <= paused_priority) return;
    const int64_t prompt = static_cast<int64_t>((*best)->prompt.size());
    int64_t reserve_blocks = 0;
    // Leaves the match in prefix_match_ for AttachCachedPrefix below.
    // (A prompt to be scored matches nothing: max_runs 0.)
    const int32_t match_runs = NeedsEveryPromptRow(**best) ? 0 : options_.max_runs;
    CachedPrefix prefix =
        MatchCachedPrefix((*best)->prompt, match_runs, (*best)->cache_salt, /*host=*/true);
    if (pager_) {
      // The prompt, its first generated token, and one block of growth per decoding slot; under
      // kPromptAndOutput the whole expected output, beside what others have set aside.
      int64_t need = HistoryBlocksNeeded(prompt);
      if (options_.reserve == ReservePolicy::kPromptAndOutput) {
        reserve_blocks = HistoryBlocksNeeded(
            std::min<int64_t>(prompt + (*best)->max_new_tokens, options_.max_context) - 1);
        need = reserve_blocks;
      }
      // Blocks found in the prefix cache are not needed anew, but idle ones stop counting as
      // free once attached. (Those found in the host tier need new device blocks.)
      auto missing = [&] {
        int64_t headroom = 0;
        if (options_.reserve != ReservePolicy::kPromptAndOutput) {
          for (const Slot& s : slots_) headroom += s.state == SlotState::kDecoding;
        }
        return need - prefix.blocks + headroom -
               (pager_->free_device_blocks() - prefix.idle - UnallocatedReservations(-1));
      };
      // Room in blocks is not room in runs. A prompt placed over more runs than the run table
      // holds must be compacted into free extents before it decodes, and is paused to the host
      // tier when none exist: its prefill spent, its KV copied out and back. It waits instead,
      // as for blocks, while the requests running free whole runs as they finish (with none
      // running, every block is free or idle and it fits). One run is left for its growth.
      auto fits_runs = [&] {
        return pager_->CouldFitInRuns(HistoryBlocksNeeded(prompt) - prefix.blocks,
                                      std::max(1, options_.max_runs - 1 - prefix.runs));
      };
      const int64_t short_by = missing();
      if (short_by > 0 || !fits_runs()) {
        // A newcomer that outranks running requests makes room by pausing them (lowest priority,
        // then most recently admitted, first), as vLLM's priority scheduling preempts: it does
        // not wait for lower-priority generations to finish. Equal priorities stay FCFS. None is
        // paused when all of them together hold too few blocks; otherwise one at a time, each
        // pause's effect measured before the next (a block it shares with another request, or
        // one the newcomer's own prompt matches, frees nothing for it), until it has the room
        // in blocks and in runs.
        int64_t freeable = 0;
        int32_t victim = NewcomerVictim((*best)->priority, &freeable);
        if (victim < 0 || freeable < short_by) {
          if (short_by > 0) return;
          bool running = false;
          for (const Slot& s : slots_) running |= s.state != SlotState::kFree;
          if (running) return;
        } else {
          for (;;) {
            any_paused = true;
            paused_priority = std::max(paused_priority, slots_[victim].request->priority);
            PauseSlot(victim);
            // A swap-out frees its device blocks once copied: send and wait now (nothing is
            // running; the copies take microseconds on a GPU).
            if (pager_->pending_blocks() > 0) DrainTransfers();
            // The pause changed the prefix cache under the match (released blocks became idle,
            // a swap-out's room in the host tier evicted idle host blocks): match again.
            prefix = MatchCachedPrefix((*best)->prompt, match_runs, (*best)->cache_salt,
                                       /*host=*/true);
            if (missing() <= 0 && fits_runs()) break;
            victim = NewcomerVictim((*best)->priority, &freeable);
            if (victim < 0) return;  // those paused resume when room returns
          }
        }
      }
    }
    std::unique_ptr<GenerationRequest> r = std::move(*best);
    waiting_.erase(best);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --queued_;
    }
    Slot& slot = slots_[i];
    slot.request = std::move(r);
    SetState(i, SlotState::kPrefilling);
    slot.admitted = now;
    slot.reserve_blocks = reserve_blocks;
    slot.admit_seq = ++admissions_;
    // Fresh per request: the previous occupant's preemption grace and usage are not this one's.
    slot.resumed_step = 0;
    slot.generated = 0;
    // Where the history may end: the pager places its runs to grow in place up to there. (Not
    // under far history or window release, whose slots hold a bounded window of blocks that
    // they keep recycling.)
    if (pager_ && !bounded_slots()) {
      pager_->ExpectTokens(
          i, std::min<int64_t>(prompt + slot.request->max_new_tokens, options_.max_context));
    }
    const AttachedPrefix attached = AttachCachedPrefix(i);
    slot.cached_tokens = attached.tokens;
    const absl::Status grown = kv_->Grow(i, FirstGrowTokens(prompt));
    if (!grown.ok()) {
      FinishSlot(i, FinishReason::kError, {}, "", std::string(grown.message()));
      continue;
    }
    CountPrefixLookup(prompt, attached);
    GenerationRequest& req = *slot.request;
    slot.history.clear();
    slot.history.reserve(options_.max_context);
    slot.history.assign(req.prompt.begin(), req.prompt.end());
    slot.prefilled = slot.cached_tokens;
    slot.position = slot.cached_tokens;
    // (A cached prefix longer than the window: the first chunk reads only its last blocks.)
    ReleaseBehindWindow(i, slot.cached_tokens);
    slot.generated = 0;
    slot.swapped = false;
    slot.grammar_state = req.grammar ? req.grammar->start() : 0;
    TrackThinking(i, /*token=*/-1);
    slot.drafts_verified = slot.drafts_accepted = 0;
    slot.prompt_logprobs.clear();
    slot.pooled_rows = 0;
    if (req.pooling != Pooling::kNone) {
      slot.pooled.resize(model_->config.hidden_size);  // (allocated by the slot's first)
      std::fill(slot.pooled.begin(), slot.pooled.end(), 0.0f);
    }
    if (req.prompt_logprobs >= 0) {
      // Entry 0 (the first prompt token) has no score; the others come chunk by chunk.
      slot.prompt_logprobs.reserve(req.prompt.size());
      TokenLogprobs first;
      first.token = req.prompt[0];
      slot.prompt_logprobs.push_back(first);
    }
    observer_->OnAdmitted(req, now - req.arrival);
    samplers_[i]->Reset(req.sampling, req.prompt);
    const Tokenizer* tok = model_->tokenizer.get();
    // The last prompt tokens give the first generated token's text its context.
    const size_t ctx = std::min<size_t>(5, req.prompt.size());
    // DecodeKeeping with nothing kept is Decode(ids, skip_special_tokens=true).
    slot.text = std::make_unique<TextStream>(
        [tok, kept = req.kept_special_tokens](absl::Span<const int32_t> ids) {
          return tok->DecodeKeeping(ids, kept);
        },
        req.stop_sequences, std::vector<int32_t>(req.prompt.end() - ctx, req.prompt.end()),
        req.include_stop_str_in_output);
  }
}

int32_t Engine::NewcomerVictim(int32_t priority, int64_t* freeable) const {
  // The running requests of a lower priority, not resumed within the grace: the lowest
  // priority, then the latest admitted, is the victim; `freeable` gets what all of them hold
  // (blocks and unallocated reservations: an upper bound on what pausing them all frees, shared
  // and matched blocks included).
  int32_t victim = -1;
  *freeable = 0;
  for (int32_t i = 0; i < options_.slots; ++i) {
    const Slot& s = slots_[i];
    if (s.state != SlotState::kDecoding && s.state != SlotState::kPrefilling) continue;
    if (s.request->priority >= priority || InResumeGrace(s)) continue;
    *freeable += pager_->NumBlocks(i) + UnallocatedReservation(i);
    if (victim < 0 || RanksBelow(s, slots_[victim])) victim = i;
  }
  return victim;
}

bool Engine::RanksBelow(const Slot& a, const Slot& b) {
  if (a.request->priority != b.request->priority) return a.request->priority < b.request->priority;
  return a.admit_seq > b.admit_seq;
}

bool Engine::InResumeGrace(const Slot& s) const {
  return s.resumed_step > 0 && steps_ + 1 - s.resumed_step < kResumeGraceSteps;
}

void Engine::DrainTransfers() {
  FlushMoves();
  transport_drain_wait_ += transport_->WaitFor(transport_->next_fence() - 1);
  // The one retire path: failed copies first (their requests end, their host blocks leave the
  // cache), so that no block a failed copy wrote is retired as good and registered.
  RetireTransfers();
}

Engine::PreemptResult Engine::PreemptOne(int32_t requester) {
  // Only a request that ranks below the requester (lower priority, or the same priority and
  // admitted later) may be paused for it: the oldest request of the highest priority then never
  // waits, so the system always makes progress. Among those, the lowest priority and then the
  // most recently admitted goes first. Prefilling requests count: their KV is cheap to rebuild.
  // A request resumed in the last few steps is left alone (no pause/resume thrash): if it is the
  // only candidate, the requester waits a step instead.
  const Slot& req = slots_[requester];
  int32_t victim = -1;
  bool recent = false;
  for (int32_t i = 0; i < options_.slots; ++i) {
    const Slot& s = slots_[i];
    if (i == requester) continue;
    if (s.state != SlotState::kDecoding && s.state != SlotState::kPrefilling) continue;
    if (!RanksBelow(s, req)) continue;
    if (InResumeGrace(s)) {
      recent = true;
      continue;
    }
    if (victim < 0 || RanksBelow(s, slots_[victim])) victim = i;
  }
  if (victim < 0) return recent ? PreemptResult::kWait : PreemptResult::kNone;
  PauseSlot(victim);
  return PreemptResult::kPaused;
}

void Engine::FlushMoves() {
  // Moves planned so far go out as their own batch, so that moves planned next may read what
  // these write (a swap-in followed by a compaction or a swap-out of the same blocks): batches
  // run in order, while the planner may reorder moves within one.
  if (!moves_.empty() || (pager_ && !pager_->offload_moves().empty())) {
    required_fence_ = std::max(required_fence_, SubmitTransfers(0));
  }
}

void Engine::PauseSlot(int32_t slot) {
  FlushMoves();
  Slot& v = slots_[slot];
  // Swap its KV to the host tier as merged transfer groups, or drop it and recompute on resume
  // (a prefill of its history) where that is cheaper (a short history) or the host tier is full.
  // Nothing is running when this is called, so the moves need no gate.
  const bool short_history =
      static_cast<int64_t>(v.history.size()) <= options_.recompute_max_tokens;
  if (v.state == SlotState::kDecoding && !short_history &&
      pager_->PlanSwapOut(slot, PlanFence(), &moves_).ok()) {
    v.swapped = true;
    NoteTransfer(slot);
  } else {
    // What it had written stays in the prefix cache: the recompute may find it there.
    RegisterCachedPrefix(slot);
    kv_->Release(slot);
    v.prefilled = 0;
  }
  SetState(slot, SlotState::kPaused);
  ++preemptions_;
  LOG(INFO) << "paused " << v.request->request_id << " (" << (v.swapped ? "swap" : "recompute")
            << ") under KV pressure";
}

bool Engine::PrepareSlotKv(int32_t slot, int32_t position) {
  if (!GrowSlotKv(slot, static_cast<int64_t>(position) + 1)) return false;
  if (pager_ && pager_->NumRuns(slot) > options_.max_runs) FlushMoves();
  if (pager_ && pager_->NumRuns(slot) > options_.max_runs) {
    if (!pager_->PlanCompaction(slot, PlanFence(), &moves_)) {
      // No free extent can take the tail runs: wait in the host tier until one can.
      PauseSlot(slot);
      return false;
    }
    NoteTransfer(slot);
  }
  return true;
}

bool Engine::GrowSlotKv(int32_t slot, int64_t tokens) {
  absl::Status st = kv_->Grow(slot, tokens);
  while (absl::IsResourceExhausted(st) && pager_) {
    if (pager_->pending_blocks() > 0) {
      // Blocks held for copies (planned or in flight) come back once the transport has done
      // them: send what is planned, wait, retire, rather than pause anyone. Rare: only under
      // pressure, and the copies take microseconds.
      DrainTransfers();
      if (slots_[slot].state == SlotState::kFree) return false;  // its own copy failed
      CHECK(pager_->pending_blocks() == 0) << "blocks still held after the transport drained";
    } else {
      const PreemptResult r = PreemptOne(slot);
      if (r == PreemptResult::kWait) return false;  // stays decoding; tries again next step
      if (r == PreemptResult::kNone) break;
    }
    st = kv_->Grow(slot, tokens);
  }
  if (absl::IsResourceExhausted(st) && pager_) {
    // Everyone else ranks above this request: it waits, paused, until they make room.
    PauseSlot(slot);
    return false;
  }
  if (!st.ok()) {
    FinishSlot(slot, FinishReason::kError, {}, "", std::string(st.message()));
    return false;
  }
  return true;
}

int32_t Engine::BuildDescriptor() {
  StepDescriptor& d = descriptors_[committed_ ^ 1];
  int32_t active = 0;
  double draft_threshold = 0;
  // Draft rows fill the pass only up to the rows it takes while reading each weight once.
  int32_t draft_room = 0;
  if (options_.speculative_tokens > 0) {
    int32_t decoding = 0;
    for (const Slot& s : slots_) decoding += s.state == SlotState::kDecoding;
    draft_threshold = DraftThreshold(decoding);
    const int32_t one_read = backend_->one_read_rows();
    draft_room = one_read > 0 ? std::max(0, one_read - decoding)
                              : options_.slots * options_.speculative_tokens;
  }
  for (int32_t i = 0; i < options_.slots; ++i) {
    d.active[i] = 0;
    if (d.max_draft > 0) d.num_draft[i] = 0;
    Slot& slot = slots_[i];
    if (slot.state != SlotState::kDecoding) continue;
    if (!PrepareSlotKv(i, slot.position)) continue;
    if (slot.state != SlotState::kDecoding) continue;
    if (pager_ && pager_->NumRuns(i) > options_.max_runs) continue;  // waits for room
    d.active[i] = 1;
    d.position[i] = slot.position;
    d.token[i] = slot.next_token;
    d.adapter[i] = slot.request->lora_adapter;
    if (d.max_draft > 0) d.num_draft[i] = StageDrafts(i, draft_threshold, &draft_room, &d);
    d.num_runs[i] = kv_->RunTable(i, d.SlotRuns(i));
    if (bounded_slots()) d.far_dropped[i] = pager_->Dropped(i);
    if (far_.enabled()) d.far_summaries[i] = far_.SummariesAt(slot.position, options_.block_tokens);
    ++active;
  }
  // A slot paused while building later rows may have been marked active earlier: drop it.
  active = RecountActiveRows();
  staged_draft_rows_ = d.draft_rows();
  return active;
}

double Engine::DraftThreshold(int32_t rows) const {
  // A pass of R decode rows takes fixed + per_row * R (step_cost_) and gives about one token a
  // row, so a token costs (fixed + per_row * R) / R; one more row costs per_row and gives a
  // token with the draft's acceptance probability q: it pays when
  // q > per_row * R / (fixed + per_row * R), the rows' share of the pass. Near 0 while the pass
  // is read-bound (few rows: reading the weights dominates), near 1 once it is compute-bound.
  // (The fit is linear; a pass's real cost steps up where its rows stop fitting one read of the
  // weights, which BuildDescriptor keeps drafts from crossing: Backend::one_read_rows.)
  double fixed = 0, per_row = 0;
  bool split = false;
  if (rows <= 0 || !step_cost_.Estimate(&fixed, &per_row, &split) || !split) return 0;
  return per_row * rows / (fixed + per_row * rows);
}

double Engine::SlotAcceptance(const Slot& s) const {
  // The engine's rate (itself pulled toward 1/2 until it has a record) weighs as two verified
  // drafts of the slot's own.
  constexpr double kPriorWeight = 2;
  const double engine = (spec_accepted_decayed_ + 0.5) / (spec_verified_decayed_ + 1);
  return (s.drafts_accepted + kPriorWeight * engine) / (s.drafts_verified + kPriorWeight);
}

int32_t Engine::StageDrafts(int32_t i, double threshold, int32_t* room, StepDescriptor* d) {
  Slot& slot = slots_[i];
  const GenerationRequest& r = *slot.request;
  // Drafts past the request's last token or the context would be verified for nothing.
  const int32_t k = std::min({options_.speculative_tokens, r.max_new_tokens - slot.generated - 1,
                              options_.max_context - 1 - slot.position, *room});
  int32_t* draft = d->draft.data() + static_cast<size_t>(i) * d->max_draft;
  slot.forced_drafts = 0;
  if (k <= 0) return 0;
  int32_t n = 0;
  if (const int32_t forced = ThinkingForcedToken(i); forced >= 0) {
    // The rest of the thinking budget's forced end: certain, so drafted in full.
    const std::vector<int32_t>& end = r.thinking_budget.forced;
    n = std::min<int32_t>(k, static_cast<int32_t>(end.size()) - slot.thinking_forced);
    std::copy_n(end.begin() + slot.thinking_forced, n, draft);
    slot.forced_drafts = n;
  } else if (r.grammar) {
    // Jump-forward: text the constraint forces (a JSON schema's keys and punctuation) is
    // certain, and the longest tokens spelling it are likely the model's own: drafted whatever
    // the acceptance rate, as far as the constraint forces.
    n = r.grammar->ForcedTokens(slot.grammar_state, !r.ignore_eos, k, draft);
    slot.forced_drafts = n;
  }
  if (n == 0) {
    // Draft j is accepted with about q^j (q the per-token rate): propose those that pay.
    const double q = SlotAcceptance(slot);
    int32_t worth = 0;
    for (double p = q; worth < k && p > threshold; p *= q) ++worth;
    if (worth <= 0) return 0;
    n = ProposeNgramDraft(slot.history, slot.next_token, options_.speculative_ngram, worth, draft);
  }
  if (n == 0) return 0;
  // Room for the drafts' K/V. Growing for them never pauses anyone: only into free blocks,
  // leaving one per slot for everyone's next token, and only where the run table stays within
  // its width; otherwise the drafts shrink to the room the slot has.
  const int64_t need = int64_t{slot.position} + 1 + n;
  const int64_t have = kv_->Capacity(i);
  if (need > have) {
    bool grown = false;
    if (pager_ == nullptr) {
      grown = kv_->Grow(i, need).ok();
    } else {
      const int64_t more = pager_->BlocksFor(need) - pager_->BlocksFor(have);
      grown = pager_->NumRuns(i) + more <= options_.max_runs &&
              pager_->free_device_blocks() - more >= options_.slots && kv_->Grow(i, need).ok();
      CHECK(!grown || pager_->NumRuns(i) <= options_.max_runs)
          << "draft growth widened slot " << i << "'s run table past max runs";
    }
    if (!grown) n = static_cast<int32_t>(std::max<int64_t>(0, have - slot.position - 1));
  }
  slot.forced_drafts = std::min(slot.forced_drafts, n);
  *room -= n;
  return n;
}

int32_t Engine::RecountActiveRows() {
  StepDescriptor& d = descriptors_[committed_ ^ 1];
  int32_t active = 0;
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (d.active[i] && slots_[i].state != SlotState::kDecoding) d.active[i] = 0;
    active += d.active[i];
  }
  return active;
}

bool Engine::SampledOnDevice(int32_t i) const {
  const SamplingConfig& c = slots_[i].request->sampling;
  if (c.logprobs || c.num_logit_bias > 0 || c.allowed_tokens || c.bad_words ||
      c.repetition_penalty != 1.0f || c.presence_penalty != 0.0f || c.frequency_penalty != 0.0f) {
    return false;
  }
  // A structured output's token mask is applied on the host, and a forced token is no draw.
  if (slots_[i].request->grammar || ThinkingForcedToken(i) >= 0) return false;
  // While min_tokens holds, EOS and the stop tokens are masked (SampleNext): on the host.
  return !MasksStopTokens(i);
}

int32_t Engine::ThinkingForcedToken(int32_t i) const {
  const Slot& slot = slots_[i];
  if (slot.thinking_forced < 0) return -1;
  return slot.request->thinking_budget.forced[slot.thinking_forced];
}

namespace {

// Whether `history` followed by `token` ends with `seq` (not empty).
bool EndsWith(const std::vector<int32_t>& history, int32_t token, absl::Span<const int32_t> seq) {
  if (seq.empty() || seq.back() != token || history.size() + 1 < seq.size()) return false;
  return std::equal(seq.begin(), seq.end() - 1, history.end() - (seq.size() - 1));
}

}  // namespace

void Engine::TrackThinking(int32_t i, int32_t token) {
  Slot& slot = slots_[i];
  const GenerationRequest& r = *slot.request;
  const ThinkingBudget& budget = r.thinking_budget;
  if (budget.max_tokens < 0) return;
  const int32_t n = static_cast<int32_t>(budget.forced.size());
  if (token >= 0 && slot.thinking_forced >= 0) {
    // A forced token (the only choice): the block is closed once the whole end is written.
    if (token == budget.forced[slot.thinking_forced]) {
      if (++slot.thinking_forced == n) {
        slot.thinking_forced = -1;
        slot.thinking = false;
      }
      return;
    }
    slot.thinking_forced = -1;  // (not a forced token: followed as any other below)
  }
  if (token < 0) {  // admission
    slot.thinking = budget.starts_inside;
    slot.thinking_tokens = 0;
    slot.thinking_block = 0;
    slot.thinking_forced = -1;
  } else if (slot.thinking) {
    ++slot.thinking_tokens;
    ++slot.thinking_block;
    if (EndsWith(slot.history, token, budget.end)) {
      slot.thinking = false;
      return;
    }
  } else if (EndsWith(slot.history, token, budget.start)) {
    slot.thinking = true;
    slot.thinking_block = 0;
  }
  if (!slot.thinking || slot.thinking_tokens < budget.max_tokens) return;
  // Spent: the end is forced from the next token on; a reply already writing it (the block's
  // last tokens a beginning of `forced`) goes on from where it is.
  int32_t from = 0;
  for (int32_t k = std::min(n - 1, slot.thinking_block); k > 0; --k) {
    if (EndsWith(slot.history, token, absl::MakeConstSpan(budget.forced.data(), k))) {
      from = k;
      break;
    }
  }
  // Under a structured output, only where the constraint allows the whole rest of the end;
  // elsewhere the constraint leads, and the budget is tried again after the next token.
  if (r.grammar != nullptr) {
    int32_t state = slot.grammar_state;
    for (int32_t k = from; k < n; ++k) {
      state = r.grammar->Next(state, budget.forced[k]);
      if (state == structured::Grammar::kDead) return;
    }
  }
  slot.thinking_forced = from;
  ++thinking_budget_ends_;
}

bool Engine::MasksStopTokens(int32_t i) const {
  const Slot& slot = slots_[i];
  const GenerationRequest& r = *slot.request;
  const bool has_stops = (!r.ignore_eos && !eos_ids_.empty()) || !r.stop_token_ids.empty();
  return has_stops && slot.generated < r.min_tokens;
}

bool Engine::MarkDeviceSampling() {
  StepDescriptor& d = descriptors_[committed_];
  bool any = false;
  for (int32_t i = 0; i < options_.slots; ++i) {
    DeviceSampling& ds = d.sampling[i];
    ds = DeviceSampling{};
    // (A row with drafts is verified on the host; no backend that samples verifies drafts.)
    if (!d.active[i] || (d.max_draft > 0 && d.num_draft[i] > 0) || !SampledOnDevice(i)) continue;
    const SamplingConfig& c = slots_[i].request->sampling;
    ds.on_device = 1;
    sampled_tokens_[i] = -1;  // a backend that leaves the row unwritten fails it, not repeats
    ds.temperature = c.temperature;
    if (c.temperature > 0) {
      // The host sampler takes top_k >= vocab as off; the device's range is [0, vocab]
      // (CheckDeviceSampling), and one row out of it would fail the whole step.
      ds.top_k = c.top_k < model_->config.vocab_size ? c.top_k : 0;
      ds.top_p = c.top_p;
      ds.min_p = c.min_p;
      ds.uniform = samplers_[i]->DrawUniform();
    }
    any = true;
  }
  return any;
}

bool Engine::ScoresPrompt(int32_t i) const {
  const Slot& s = slots_[i];
  return s.request != nullptr && s.request->prompt_logprobs >= 0 && s.generated == 0;
}

int64_t Engine::HistoryBlocksNeeded(int64_t tokens) const {
  const int64_t need = pager_->BlocksFor(tokens + 1);
  return bounded_slots() ? std::min(need, slot_peak_blocks_) : need;
}

int64_t Engine::FirstGrowTokens(int64_t tokens) const {
  // Far history, window release: the prompt grows chunk by chunk (PickPrefillChunks) and its
  // distant blocks go back to the pool as it goes, so a long prompt never holds more than its
  // working set.
  return bounded_slots() ? std::min<int64_t>(tokens, options_.prefill_chunk) : tokens;
}

CachedPrefix Engine::MatchCachedPrefix(absl::Span<const int32_t> tokens, int32_t max_runs,
                                       uint64_t salt, bool host) {
  CachedPrefix m;
  prefix_match_.clear();
  if (!pager_ || !options_.prefix_caching || tokens.empty() || max_runs <= 0) return m;
  // At most the blocks before the one holding the last token: that token is always prefilled
  // (it gives the first output's logits), and the slot never writes into a shared block.
  // Under window release only the blocks within the window of the prefix's end are needed.
  // (And, after them, a cached tail of another history that went on from there: copied, not
  // prefilled.)
  pager_->MatchPrefix(tokens, static_cast<int32_t>((tokens.size() - 1) / options_.block_tokens),
                      &prefix_match_, salt, host && options_.prefix_cache_offload, release_window_,
                      /*tail=*/options_.prefix_cache_partial_blocks);
  // Runs: each stretch of physically consecutive device blocks, and each stretch of host blocks
  // with device blocks after it (its new blocks are placed apart; a stretch at the end joins the
  // prompt's own growth). Cut where one more would pass max_runs. (Blocks behind the window,
  // -1, come first and are attached as dropped.)
  int32_t runs = 0;
  // (A tail's copy is the first block of the prompt's own growth.)
  for (size_t i = 0; i < prefix_match_.size(); ++i) {
    const PrefixBlock& b = prefix_match_[i];
    if (b.tier == KvTier::kHost || b.block < 0 || b.tokens > 0) continue;
    const bool first = i == 0 || prefix_match_[i - 1].block < 0;
    const bool after_host = !first && prefix_match_[i - 1].tier == KvTier::kHost;
    const bool new_run = first || after_host || b.block != prefix_match_[i - 1].block + 1;
    const int32_t more = (after_host ? 1 : 0) + (new_run ? 1 : 0);
    if (runs + more > max_runs) {
      // A shorter prefix's window reaches back past the blocks behind this one's (-1s, not
      // looked for): under a window the match is all or nothing.
      if (prefix_match_[0].block < 0) {
        prefix_match_.clear();
        runs = 0;
      } else {
        prefix_match_.resize(i);
      }
      break;
    }
    runs += more;
  }
  m.runs = runs;
  // (Host blocks need new device blocks: they count among the blocks a prompt still needs; so
  // does a tail, which is held while its copy is made.)
  for (const PrefixBlock& b : prefix_match_) {
    if (b.tier == KvTier::kDevice && b.block >= 0) {
      m.blocks += b.tokens == 0;
      m.idle += pager_->IdleCached(b.block);
    }
  }
  return m;
}

AttachedPrefix Engine::AttachCachedPrefix(int32_t slot) {
  AttachedPrefix a;
  if (prefix_match_.empty()) return a;
  // Host blocks are copied back ahead of the step that prefills the rest (which waits for every
  // batch).
  uint64_t written_at = 0;
  const int32_t blocks =
      pager_->AttachPrefix(slot, prefix_match_, PlanFence(), &moves_, &written_at);
  int64_t from_host = 0;
  for (int32_t i = 0; i < blocks; ++i) {
    const PrefixBlock& b = prefix_match_[i];
    from_host += b.tier == KvTier::kHost && b.block >= 0;
    a.tokens += b.tokens > 0 ? b.tokens : options_.block_tokens;
    if (b.tokens > 0) a.copied = b.tokens;  // (the last entry)
  }
  a.from_host = from_host * options_.block_tokens;
  // (A block copied in part is copied on the device, ahead of the step too; if that fails, so
  // does this request.)
  if (a.copied > 0 || from_host > 0) NoteTransfer(slot);
  // A host block whose offload is still in flight: if that copy fails, so does this request (it
  // would prefill on top of undefined KV).
  if (from_host > 0 && written_at > 0) {
    transfer_owners_.emplace_back(written_at, slots_[slot].request->handle);
  }
  prefix_match_.clear();  // attached once
  return a;
}

void Engine::CountPrefixLookup(size_t tokens, const AttachedPrefix& found) {
  if (!pager_ || !options_.prefix_caching) return;
  prefix_queries_ += tokens;
  prefix_hits_ += found.tokens;
  prefix_copied_ += found.copied;
  prefix_host_hits_ += found.from_host;
}

void Engine::RegisterCachedPrefix(int32_t slot, bool ended) {
  if (!pager_ || !options_.prefix_caching) return;
  const Slot& s = slots_[slot];
  // KV is written for the history's first `prefilled` tokens while prefilling, for all of it
  // (every token but the next input) while decoding.
  const int32_t written =
      s.state == SlotState::kDecoding
          ? std::min<int32_t>(s.position, static_cast<int32_t>(s.history.size()))
          : s.state == SlotState::kPrefilling ? s.prefilled : 0;
  const absl::Span<const int32_t> tokens = absl::MakeConstSpan(s.history).first(written);
  pager_->RegisterPrefix(slot, tokens, s.request->cache_salt);
  if (ended && options_.prefix_cache_partial_blocks) {
    pager_->RegisterTail(slot, tokens, s.request->cache_salt);
  }
}

void Engine::DropSummarized(int32_t slot, int32_t summaries) {
  const int32_t before = pager_->Dropped(slot);
  if (summaries <= before) return;
  pager_->DropBlocks(slot, far_.sink_blocks, summaries);
  far_summarized_ += summaries - before;
}

void Engine::ReleaseBehindWindow(int32_t slot, int64_t position) {
  if (release_window_ <= 0 || pager_->OnHost(slot)) return;
  const int32_t before = pager_->Dropped(slot);
  // (At most every block it holds: a one-token window's next position may not be grown yet.)
  const int32_t target =
      std::min<int64_t>(BlocksBehindWindow(position, release_window_, options_.block_tokens),
                        before + pager_->NumBlocks(slot));
  if (target <= before) return;
  // The blocks about to go are registered first (they stay cached, idle), so that a
  // conversation's next turn finds all of the history.
  RegisterCachedPrefix(slot);
  pager_->DropBlocks(slot, /*sink_blocks=*/0, target);
  window_released_ += target - before;
}

void Engine::CostFit::Add(double units, double seconds) {
  constexpr double kKeep = 0.875;  // weight 1/8 for the newest sample
  w = kKeep * w + 1;
  n = kKeep * n + units;
  t = kKeep * t + seconds;
  nn = kKeep * nn + units * units;
  nt = kKeep * nt + units * seconds;
}

bool Engine::CostFit::Estimate(double* fixed_s, double* per_unit_s, bool* split) const {
  if (w <= 0 || n <= 0) return false;
  const double mean_n = n / w, mean_t = t / w;
  const double var = nn / w - mean_n * mean_n;
  const double cov = nt / w - mean_n * mean_t;
  if (split) *split = var > 1.0 && cov > 0;
  if (var > 1.0 && cov > 0) {
    *per_unit_s = cov / var;
    *fixed_s = std::max(0.0, mean_t - *per_unit_s * mean_n);
  } else {  // samples all of one size so far: no way to split the cost
    *per_unit_s = mean_t / mean_n;
    *fixed_s = 0;
  }
  return *per_unit_s > 0;
}

int32_t Engine::PrefillTokenBudget(int32_t decoding) const {
  int32_t budget = std::max(options_.block_tokens, options_.step_token_budget - decoding);
  if (options_.max_prefill_stall <= 0 || decoding == 0) return budget;
  double fixed = 0, per_unit = 0;
  double cap = -1;
  if (fuse_prefill_) {
    // The chunk rides in the decode pass: it adds per_row a token, on a pass that costs
    // fixed + per_row * decoding without it (engine.h: step_cost_). Until passes of different
    // sizes were timed the two are not told apart: a block's worth then (which times one).
    bool split = false;
    if (step_cost_.Estimate(&fixed, &per_unit, &split)) {
      cap = split ? options_.max_prefill_stall * (fixed + per_unit * decoding) / per_unit
                  : options_.block_tokens;
    }
  } else if (decode_step_avg_s_ > 0 && prefill_cost_.Estimate(&fixed, &per_unit)) {
    const double room = options_.max_prefill_stall * decode_step_avg_s_ - fixed;
    // When even a chunk's fixed cost exceeds the limit, a block's worth still goes through each
    // step (prompts must progress, and a tiny chunk would pay the fixed cost for nothing).
    cap = room >= per_unit ? room / per_unit : options_.block_tokens;
  }
  if (cap < 0) return budget;  // nothing measured yet
  // (+1e-6: a cap that is a whole number up to rounding of the fit keeps that number.)
  return std::max(1, std::min(budget, static_cast<int32_t>(std::min(cap + 1e-6, 1e9))));
}

bool Engine::PickPrefillChunks() {
  // The slot admitted first goes first, so prefill is FCFS across slots; the step's prefill
  // tokens left after a prompt's last chunk go to the next one (as many prompts as the backend
  // takes in one pass). Far history grows the prompt's KV here; a slot that cannot have it this
  // step yields to the next one.
  num_chunks_ = 0;
  // The step's token budget: decode rows first, the chunks get the rest (at least one block's
  // worth, so a prompt always progresses). Decode rows: the decoding slots' and their drafts'.
  int32_t decoding = staged_draft_rows_;
  for (const Slot& s : slots_) decoding += s.state == SlotState::kDecoding;
  int32_t budget = std::min(backend_->max_chunk_tokens(), PrefillTokenBudget(decoding));
  bool all_logits = false;  // a chunk of the step returns every row's logits
  for (uint64_t after = 0; budget > 0 && num_chunks_ < chunk_capacity_;) {
    int32_t pick = -1;
    for (int32_t i = 0; i < options_.slots; ++i) {
      if (slots_[i].state == SlotState::kPrefilling && slots_[i].admit_seq > after &&
          (pick < 0 || slots_[i].admit_seq < slots_[pick].admit_seq)) {
        pick = i;
      }
    }
    if (pick < 0) break;
    const Slot& slot = slots_[pick];
    after = slot.admit_seq;
    int32_t n = std::min(budget, static_cast<int32_t>(slot.history.size()) - slot.prefilled);
    if (ScoresPrompt(pick)) {
      // One prompt being scored a step: the chunk logits hold one chunk's every row.
      if (all_logits) continue;
      n = std::min(n, kMaxAllLogitsRows);
    }
    // No compaction for a prompt: a chunk reads a run table of any width (SetPrefillChunk).
    if (bounded_slots() && !GrowSlotKv(pick, slot.prefilled + n)) continue;
    all_logits |= ScoresPrompt(pick);
    SetPrefillChunk(num_chunks_++, pick, n);
    budget -= n;
  }
  // Growing a slot's KV may have paused (or, its copy failing, ended) a slot given a chunk
  // before it.
  if (bounded_slots()) KeepPrefillingChunks();
  // Where each chunk's logits go: a row each, the one scoring its prompt every row.
  float* next = chunk_logits_.data();
  const int32_t vocab = backend_->vocab_size();
  for (int32_t k = 0; k < num_chunks_; ++k) {
    const Slot& s = slots_[chunks_[k].slot];
    // Logits only where a token is sampled: the end of a fresh prompt (a recomputed history
    // resumes with the token it had already sampled); every row's for a prompt being scored;
    // none for an embedding (it samples nothing).
    const bool wanted =
        (chunk_last_[k] && s.generated == 0 && s.request->pooling == Pooling::kNone) ||
        chunks_[k].all_logits;
    chunk_logit_rows_[k] = wanted ? next : nullptr;
    if (wanted) {
      next += static_cast<size_t>(chunks_[k].all_logits ? chunks_[k].tokens.size() : 1) * vocab;
    }
  }
  return num_chunks_ > 0;
}

void Engine::SetPrefillChunk(int32_t k, int32_t pick, int32_t n) {
  Slot& slot = slots_[pick];
  PrefillChunk& chunk = chunks_[k];
  const int32_t total = static_cast<int32_t>(slot.history.size());
  StepDescriptor& d = descriptors_[committed_ ^ 1];  // its row is free: the slot is not decoding
  chunk.slot = pick;
  chunk.start = slot.prefilled;
  chunk.tokens = absl::MakeConstSpan(slot.history).subspan(slot.prefilled, n);
  chunk.num_runs = kv_->RunTable(
      pick, absl::MakeSpan(d.runs).subspan(static_cast<size_t>(pick) * d.max_runs, d.max_runs));
  chunk.runs = d.SlotRunsData(pick);
  chunk_last_[k] = slot.prefilled + n == total;
  chunk.all_logits = ScoresPrompt(pick);
  chunk.adapter = slot.request->lora_adapter;
  // Embeddings: the chunk's rows among those the pooling takes and not summed yet.
  chunk.hidden = nullptr;
  chunk.hidden_begin = chunk.hidden_end = 0;
  if (slot.request->pooling != Pooling::kNone) {
    const auto [first, end] = PooledRows(slot.request->pooling, total);
    const int32_t start = slot.prefilled;
    chunk.hidden_begin = std::clamp(std::max(first, slot.pooled_rows) - start, 0, n);
    chunk.hidden_end = std::clamp(end - start, 0, n);
    if (chunk.hidden_end > chunk.hidden_begin) chunk.hidden = slot.pooled.data();
  }
  chunk.far_dropped = bounded_slots() ? pager_->Dropped(pick) : 0;
  if (pager_ && pager_->NumRuns(pick) > d.max_runs) {
    // The run table is wider than the descriptor row: the CPU prefill reads runs through the
    // pager's own table instead (same blocks, no width limit).
    std::vector<KvRun>& runs = prefill_runs_[pick];
    runs.resize(pager_->NumRuns(pick));
    chunk.num_runs = kv_->RunTable(pick, absl::MakeSpan(runs));
    chunk.runs = runs.data();
  }
}

bool Engine::KeepPrefillingChunks() {
  int32_t kept = 0;
  for (int32_t k = 0; k < num_chunks_; ++k) {
    if (slots_[chunks_[k].slot].state != SlotState::kPrefilling) continue;
    if (kept != k) {
      std::swap(chunks_[kept], chunks_[k]);
      std::swap(chunk_last_[kept], chunk_last_[k]);
      std::swap(chunk_logit_rows_[kept], chunk_logit_rows_[k]);
    }
    ++kept;
  }
  num_chunks_ = kept;
  return kept > 0;
}

void Engine::PreStageNext(uint64_t running_step) {
  if (!pager_) return;
  // While the step runs: make room for every active slot's next position now, so the next
  // descriptor is ready and its transfers are staged. Compaction moves that read the block the
  // running step writes (the slot's hot block) wait for the step; the rest start at once.
  const StepDescriptor& running = descriptors_[committed_];
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (!running.active[i] || slots_[i].state != SlotState::kDecoding) continue;
    // The running step's token is this request's last (its max_new_tokens): no next position
    // to make room for, nor runs to compact for a step it will not take.
    if (slots_[i].generated + 1 >= slots_[i].request->max_new_tokens) continue;
    if (!kv_->Grow(i, static_cast<int64_t>(running.position[i]) + 2).ok()) continue;
    if (pager_->NumRuns(i) <= options_.max_runs) continue;
    const size_t before = moves_.size();
    if (!pager_->PlanCompaction(i, PlanFence(), &moves_)) continue;
    NoteTransfer(i);
    for (size_t m = before; m < moves_.size();) {
      if (moves_[m].src_tier == KvTier::kDevice &&
          WritesBlock(running, i, moves_[m].src, options_.block_tokens)) {
        gated_moves_.push_back(moves_[m]);
        moves_.erase(moves_.begin() + m);
      } else {
        ++m;
      }
    }
  }
  if (MovesPlanned()) required_fence_ = std::max(required_fence_, SubmitTransfers(running_step));
}

void Engine::FinishPrefillChunks(const StepResult& result) {
  for (int32_t k = 0; k < num_chunks_; ++k) FinishPrefillChunk(k, result);
}

void Engine::FinishPrefillChunk(int32_t k, const StepResult& result) {
  const PrefillChunk& chunk = chunks_[k];
  const float* logits = chunk_logit_rows_[k];
  const int32_t pick = chunk.slot;
  Slot& slot = slots_[pick];
  if (!result.prefill_status.ok()) {
    LOG(ERROR) << "prefill failed for " << slot.request->request_id << ": "
               << result.prefill_status;
    FinishSlot(pick, FinishReason::kError, {}, "", std::string(result.prefill_status.message()));
    return;
  }
  slot.prefilled += static_cast<int32_t>(chunk.tokens.size());
  slot.position = slot.prefilled;
  // The prompt's full blocks are shareable from now on (by a request admitted next step).
  RegisterCachedPrefix(pick);
  // The chunk wrote the summaries its last row reads: their blocks go back to the pool.
  if (far_.enabled()) {
    DropSummarized(pick, far_.SummariesAt(slot.prefilled - 1, options_.block_tokens));
  }
  // (After registering: the prompt's blocks behind the window stay in the prefix cache.)
  ReleaseBehindWindow(pick, slot.prefilled);
  const int32_t vocab = backend_->vocab_size();
  const int32_t rows = static_cast<int32_t>(chunk.tokens.size());
  if (chunk.all_logits) {
    // Row r's logits score history token start + r + 1 (those not scored yet: a chunk redone
    // after a pause scores nothing twice).
    const int32_t top = slot.request->prompt_logprobs;
    for (int32_t r = 0; r < rows; ++r) {
      const size_t target = static_cast<size_t>(chunk.start) + r + 1;
      if (target >= slot.request->prompt.size() || target != slot.prompt_logprobs.size()) continue;
      slot.prompt_logprobs.push_back(ToTokenLogprobs(
          ScoreToken(absl::MakeConstSpan(logits + static_cast<size_t>(r) * vocab, vocab),
                     slot.history[target], top)));
    }
  }
  if (chunk.hidden != nullptr) {
    slot.pooled_rows = std::max(slot.pooled_rows, chunk.start + chunk.hidden_end);
  }
  if (!chunk_last_[k]) return;
  if (slot.request->pooling != Pooling::kNone) {
    // An embedding ends here: the mean of its pooled rows, nothing sampled.
    const auto [first, end] =
        PooledRows(slot.request->pooling, static_cast<int32_t>(slot.history.size()));
    StreamChunk last;
    last.embedding = slot.pooled;
    if (end - first > 1) {
      const float inv = 1.0f / static_cast<float>(end - first);
      for (float& v : last.embedding) v *= inv;
    }
    FinishSlot(pick, FinishReason::kStop, std::move(last), "", "");
    return;
  }
  SetState(pick, SlotState::kDecoding);
  if (slot.generated > 0) return;  // a recomputed history: decoding resumes with next_token
  // The last row's logits give the first token.
  const size_t last = chunk.all_logits ? static_cast<size_t>(rows - 1) * vocab : 0;
  EmitToken(pick, SampleNext(pick, absl::MakeSpan(chunk_logit_rows_[k] + last, vocab)));
}

void Engine::FinishDecode(const StepResult& result) {
  const StepDescriptor& d = descriptors_[committed_];
  if (!result.decode_status.ok()) {
    LOG(ERROR) << "decode step failed: " << result.decode_status;
    for (int32_t i = 0; i < options_.slots; ++i) {
      if (d.active[i] && slots_[i].state != SlotState::kFree) {
        FinishSlot(i, FinishReason::kError, {}, "",
                   std::string(result.decode_status.message()));
      }
    }
    return;
  }
  const int32_t vocab = backend_->vocab_size();
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (!d.active[i] || slots_[i].state == SlotState::kFree) continue;
    Slot& slot = slots_[i];
    slot.history.push_back(d.token[i]);  // its KV is now in the cache
    ++slot.position;
    // The step summarized the blocks that left the window: they go back to the pool.
    if (far_.enabled()) DropSummarized(i, d.far_summaries[i]);
    // Window release: the next row's window has moved past these.
    ReleaseBehindWindow(i, slot.position);
    if (d.sampling[i].on_device) {
      const int32_t token = sampled_tokens_[i];
      if (token < 0 || token >= vocab) {
        FinishSlot(i, FinishReason::kError, {}, "",
                   absl::StrCat("the backend sampled token ", token, ", outside the vocabulary"));
        continue;
      }
      ++device_sampled_;
      SampleResult sample;
      sample.token = token;
      EmitToken(i, sample);
      continue;
    }
    const size_t first_row = static_cast<size_t>(i) * d.logit_rows_per_slot();
    const int32_t drafts = d.max_draft > 0 ? d.num_draft[i] : 0;
    // Row 0's token, and with speculative decoding the drafts': row j's logits follow the input
    // token and drafts [0, j). Each token is sampled as without drafts (the same sampler,
    // penalties, masks and random stream, after the same tokens); while it equals the next
    // draft, that draft's row is the row the next step would have run, and its logits give the
    // token after it. The first token that differs (or the one after the last draft) ends the
    // slot's step; the K/V the later drafts wrote lies past the history and is overwritten as it
    // grows. (With a draft that is one token, not a distribution, this is speculative sampling's
    // accept-or-resample rule exactly.)
    const int32_t* draft = d.draft.data() + static_cast<size_t>(i) * d.max_draft;
    int32_t verified = 0, accepted = 0;
    for (int32_t j = 0;; ++j) {
      const SampleResult sample =
          SampleNext(i, absl::MakeSpan(&logits_[(first_row + j) * vocab], vocab));
      EmitToken(i, sample);
      const bool match = j < drafts && sample.token == draft[j];
      verified += j < drafts;
      accepted += match;
      if (!match || slot.state != SlotState::kDecoding) break;  // (or it just finished)
      // The draft is the slot's next token: its K/V, written by row j + 1, joins the history.
      slot.history.push_back(draft[j]);
      ++slot.position;
    }
    if (slot.state == SlotState::kDecoding) ReleaseBehindWindow(i, slot.position);
    if (drafts == 0) continue;
    // Jump-forward drafts are not prompt lookup's: its acceptance rate leaves them out.
    if (slot.forced_drafts == 0) {
      slot.drafts_verified += verified;
      slot.drafts_accepted += accepted;
      spec_verified_decayed_ += verified;
      spec_accepted_decayed_ += accepted;
    }
    ++spec_drafts_;
    spec_draft_tokens_ += drafts;
    spec_accepted_ += accepted;
  }
  if (options_.speculative_tokens > 0) {
    // Acceptance is a recent rate: a slot's record halves over about 7 of its steps (drafting or
    // not, so that one that stopped drafting drifts back to the engine's rate and tries again),
    // the engine's over about 70 steps.
    for (int32_t i = 0; i < options_.slots; ++i) {
      if (!d.active[i] || slots_[i].state == SlotState::kFree) continue;
      slots_[i].drafts_verified *= 0.9;
      slots_[i].drafts_accepted *= 0.9;
    }
    spec_verified_decayed_ *= 0.99;
    spec_accepted_decayed_ *= 0.99;
  }
}

SampleResult Engine::SampleNext(int32_t slot_index, absl::Span<float> logits) {
  const GenerationRequest& r = *slots_[slot_index].request;
  if (const int32_t forced = ThinkingForcedToken(slot_index); forced >= 0) {
    // The thinking budget is spent: its end is the only choice (the distribution's one token).
    // It takes a sampled token's draw, so that the tokens after it are drawn as they would be.
    if (r.sampling.temperature > 0) samplers_[slot_index]->DrawUniform();
    SampleResult sample;
    sample.token = forced;
    if (r.sampling.logprobs && r.sampling.top_logprobs > 0) {
      sample.num_top = 1;
      sample.top_ids[0] = forced;
      sample.top_logprobs[0] = 0;
    }
    return sample;
  }
  if (MasksStopTokens(slot_index)) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    const auto mask = [&](int32_t id) {
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) logits[id] = kMasked;
    };
    if (!r.ignore_eos) {
      for (int32_t id : eos_ids_) mask(id);
    }
    for (int32_t id : r.stop_token_ids) mask(id);
  }
  if (r.grammar) {
    // After the min_tokens mask: an end token it masked stays masked.
    r.grammar->MaskLogits(slots_[slot_index].grammar_state, logits, eos_ids_, !r.ignore_eos);
  }
  // Nothing reads the row after the draw: the support's -inf mask is skipped.
  return samplers_[slot_index]->Sample(logits, /*mask_support=*/false);
}

void Engine::EmitToken(int32_t slot_index, const SampleResult& sample) {
  Slot& slot = slots_[slot_index];
  GenerationRequest& r = *slot.request;
  if (sample.logprob == -std::numeric_limits<float>::infinity() && !r.grammar) {
    // No distribution: every logit was masked (allowed_token_ids all held back by min_tokens,
    // say) or not a number. The sampler's token 0 would be a token nobody chose (a constraint's
    // own case is told apart below, with its state).
    StreamChunk chunk;
    chunk.text = slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kError, std::move(chunk), "",
               "no token can be sampled: every logit is masked (allowed_token_ids, bad_words, "
               "min_tokens, stop_token_ids) or not a number");
    return;
  }
  const int32_t token = sample.token;
  samplers_[slot_index]->Accept(token);
  ++slot.generated;
  ++tokens_generated_;
  const absl::Time now = clock_->Now();
  if (slot.generated == 1) {
    slot.first_token = now;
    observer_->OnFirstToken(r, now - r.arrival);
  } else {
    observer_->OnNextToken(r, now - slot.last_token);
  }
  slot.last_token = now;
  slot.next_token = token;

  StreamChunk chunk;
  chunk.token_ids.push_back(token);
  if (slot.generated == 1) {
    chunk.prompt_tokens = static_cast<int32_t>(r.prompt.size());
    chunk.cached_prompt_tokens = slot.cached_tokens;
  }
  if (slot.generated == 1 && r.prompt_logprobs >= 0) {
    chunk.prompt_logprobs = std::move(slot.prompt_logprobs);
    slot.prompt_logprobs.clear();
  }
  if (r.sampling.logprobs) {
    chunk.logprobs.push_back(ToTokenLogprobs(sample));
  }
  const bool is_eos =
      !r.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  bool grammar_done = false;
  if (r.grammar) {
    // The mask admits only tokens that continue a match (and the end where it is whole); a
    // token outside it can only come from a row whose every logit was -inf or NaN.
    const int32_t next = is_eos ? slot.grammar_state : r.grammar->Next(slot.grammar_state, token);
    if (next == structured::Grammar::kDead || (is_eos && !r.grammar->accepting(next))) {
      chunk.text = slot.text->Finish();
      FinishSlot(slot_index, FinishReason::kError, std::move(chunk), "",
                 absl::StrCat("structured output: token ", token,
                              " does not continue the constraint (no token could be sampled)"));
      return;
    }
    slot.grammar_state = next;
    grammar_done = r.grammar->terminal(next);
  }
  TrackThinking(slot_index, token);
  if (is_eos) {
    chunk.text = slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kEos, std::move(chunk));
    return;
  }
  // Text of the tokens before the min_tokens-th is not searched for stop sequences.
  TextStream::Delta delta = slot.text->Push(token, slot.generated >= r.min_tokens);
  chunk.text = std::move(delta.text);
  if (delta.stopped) {
    FinishSlot(slot_index, FinishReason::kStop, std::move(chunk), delta.matched_stop);
    return;
  }
  if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
      r.stop_token_ids.end()) {
    chunk.text += slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kStop, std::move(chunk),
               model_->tokenizer->Decode({token}, false));
    return;
  }
  if (grammar_done) {
    // The text is a whole match and no token can follow: done, without a step for the end token.
    chunk.text += slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kStop, std::move(chunk));
    return;
  }
  if (slot.generated >= r.max_new_tokens || slot.position + 1 >= options_.max_context) {
    chunk.text += slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kLength, std::move(chunk));
    return;
  }
  r.sink->OnChunk(std::move(chunk));
}

void Engine::FinishSlot(int32_t slot_index, FinishReason reason, StreamChunk last,
                        std::string matched_stop, std::string error) {
  Slot& slot = slots_[slot_index];
  GenerationRequest& r = *slot.request;
  const absl::Time now = clock_->Now();
  FinishInfo info;
  info.reason = reason;
  info.matched_stop = std::move(matched_stop);
  info.error = std::move(error);
  info.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  info.completion_tokens = slot.generated;
  info.cached_prompt_tokens = slot.cached_tokens;
  info.queue_time_ms = Ms(slot.admitted - r.arrival);
  info.time_to_first_token_ms = slot.generated > 0 ? Ms(slot.first_token - r.arrival) : 0;
  info.total_time_ms = Ms(now - r.arrival);
  // A history that ends well stays in the prefix cache (the next turn of a conversation starts
  // with it); after an error its KV is not trusted.
  if (reason != FinishReason::kError) RegisterCachedPrefix(slot_index, /*ended=*/true);
  SetState(slot_index, SlotState::kFinishing);
  // Its adapter is let go of before the client hears of the end (the adapter is read by no step
  // after this one), so that a client that unloads it then finds its slot free.
  if (r.lora_adapter >= 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLoraLocked(r.lora_adapter);
  }
  observer_->OnFinished(r, info);
  r.sink->OnFinished(std::move(last), info);
  kv_->Release(slot_index);
  SetState(slot_index, SlotState::kFree);
  slot.reserve_blocks = 0;
  slot.request.reset();
  slot.text.reset();
  slot.swapped = false;
  // Publish before `outstanding_` drops, so that a WaitIdle() caller sees the freed slot.
  PublishStats();
  std::lock_guard<std::mutex> lock(mu_);
  if (--outstanding_ == 0) idle_cv_.notify_all();
}

void Engine::FinishQueued(std::unique_ptr<GenerationRequest> request, FinishReason reason) {
  FinishInfo info;
  info.reason = reason;
  info.prompt_tokens = static_cast<int32_t>(request->prompt.size());
  info.queue_time_ms = Ms(clock_->Now() - request->arrival);
  info.total_time_ms = info.queue_time_ms;
  if (request->lora_adapter >= 0) {  // before the client hears of the end, as in FinishSlot
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLoraLocked(request->lora_adapter);
  }
  observer_->OnFinished(*request, info);
  request->sink->OnFinished({}, info);
  std::lock_guard<std::mutex> lock(mu_);
  --queued_;
  if (--outstanding_ == 0) idle_cv_.notify_all();
}

}  // namespace kvrm
