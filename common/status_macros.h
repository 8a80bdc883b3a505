// Status propagation macros (Abseil 20220623 ships none).
#ifndef KVRM_COMMON_STATUS_MACROS_H_
#define KVRM_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVRM_STATUS_CONCAT_INNER_(a, b) a##b
#define KVRM_STATUS_CONCAT_(a, b) KVRM_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status kvrm_status_ = (expr);                  \
    if (!kvrm_status_.ok()) return kvrm_status_;           \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, StatusOrExpr());` declares/assigns x or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr)                                                   \
  auto KVRM_STATUS_CONCAT_(kvrm_statusor_, __LINE__) = (expr);                        \
  if (!KVRM_STATUS_CONCAT_(kvrm_statusor_, __LINE__).ok())                            \
    return std::move(KVRM_STATUS_CONCAT_(kvrm_statusor_, __LINE__)).status();         \
  lhs = std::move(KVRM_STATUS_CONCAT_(kvrm_statusor_, __LINE__)).value()

#endif  // KVRM_COMMON_STATUS_MACROS_H_
