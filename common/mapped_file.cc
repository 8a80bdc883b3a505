#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace kvrm {

absl::Status ErrnoStatus(const std::string& path, int err) {
  const std::string msg = absl::StrCat(path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::FailedPreconditionError(msg);
}

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::unique_ptr<MappedFile>(new MappedFile(path, fd, nullptr, 0));
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(path, ": mmap failed: ", std::strerror(err)));
  }
  // Weights are read soon after opening; start the readahead now. Advisory, so errors are moot.
  (void)::madvise(base, size, MADV_WILLNEED);
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, fd, static_cast<const std::byte*>(base), size));
}

MappedFile::~MappedFile() {
  if (base_ != nullptr && ::munmap(const_cast<std::byte*>(base_), size_) != 0) {
    LOG(WARNING) << path_ << ": munmap failed: " << std::strerror(errno);
  }
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace kvrm
