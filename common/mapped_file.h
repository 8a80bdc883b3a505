// A whole file memory-mapped read-only (PROT_READ, MAP_PRIVATE): the weights files' loaders
// (safetensors, GGUF) read tensors in place from it. Released (munmap + close) by the destructor;
// immutable after Open, so safe to read from any thread.
#ifndef KVRM_COMMON_MAPPED_FILE_H_
#define KVRM_COMMON_MAPPED_FILE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvrm {

class MappedFile {
 public:
  // NOT_FOUND when the file does not exist, PERMISSION_DENIED when it cannot be read,
  // INVALID_ARGUMENT naming the path when it is not a regular file, RESOURCE_EXHAUSTED when the
  // mapping fails. An empty file maps to data() == nullptr, size() == 0.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return base_; }
  size_t size() const { return size_; }

 private:
  MappedFile(std::string path, int fd, const std::byte* base, size_t size)
      : path_(std::move(path)), fd_(fd), base_(base), size_(size) {}

  std::string path_;
  int fd_ = -1;
  const std::byte* base_ = nullptr;
  size_t size_ = 0;
};

// The status of a failed system call on `path` (errno `err`): NOT_FOUND, PERMISSION_DENIED, or
// FAILED_PRECONDITION, with the path and strerror.
absl::Status ErrnoStatus(const std::string& path, int err);

}  // namespace kvrm

#endif  // KVRM_COMMON_MAPPED_FILE_H_
