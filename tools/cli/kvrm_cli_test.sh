#!/bin/bash
# kvrm_cli's usage errors (exit 2), RPC errors against a closed port (exit 1, "error: CODE: ..."),
# a deadline, and cancellation by SIGINT/SIGTERM while a call hangs (exit 130). Needs no kvrmd:
# the hanging peer is a plain TCP listener that never speaks HTTP/2.
set -u
set -m  # job control: background jobs keep SIGINT instead of ignoring it

CLI="${TEST_SRCDIR:-.}/kvrm/tools/cli/kvrm_cli"
[[ -x "$CLI" ]] || CLI=tools/cli/kvrm_cli
OUT="${TEST_TMPDIR:-/tmp}/out"
ERR="${TEST_TMPDIR:-/tmp}/err"
failures=0

fail() {
  echo "FAIL: $*"
  echo "  stdout: $(head -c 400 "$OUT")"
  echo "  stderr: $(head -c 400 "$ERR")"
  failures=$((failures + 1))
}

# expect <exit status> <text expected in stdout+stderr> -- <kvrm_cli args...>
expect() {
  local want_rc="$1" want_text="$2"
  shift 3
  "$CLI" "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  [[ $rc == "$want_rc" ]] || { fail "kvrm_cli $*: exit $rc, want $want_rc"; return; }
  grep -qF -- "$want_text" "$OUT" "$ERR" || fail "kvrm_cli $*: no '$want_text' in the output"
}

# A port nothing listens on: bound once by the kernel's choice, then closed.
CLOSED=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

expect 2 "usage: kvrm_cli <command>" --
expect 0 "generate           stream a completion" -- help
expect 0 "reset-prefix-cache empty the server's prefix cache" -- help
expect 0 "--max_new_tokens=64" -- generate --help
expect 0 "--service=" -- help health
expect 2 "unknown command 'bogus'" -- bogus
expect 2 "unknown flag --port" -- health --port=1
expect 2 "flag --prompt does not apply" -- info --prompt=x
expect 2 "give exactly one of --prompt, --token_ids and --message" -- generate
expect 2 "give exactly one of --prompt, --token_ids and --message" -- generate --prompt=a --token_ids=1
expect 2 "give exactly one of --prompt, --token_ids and --message" -- generate --prompt=a --message=user:b
expect 2 "--message: 'hello' is not role:content" -- generate --message=hello
expect 2 "'x' is not a token id" -- generate --token_ids=1,x
expect 2 "max_new_tokens" -- generate --prompt=a --max_new_tokens=abc
expect 2 "--stop: empty sequence" -- generate --prompt=a --stop=a,,b
expect 2 "needs a value" -- generate --prompt
expect 2 "tokenize needs --text" -- tokenize
expect 2 "tokenize needs --text, or --message" -- tokenize --text=a --message=user:b
expect 2 "--system needs a --message" -- tokenize --system=x
expect 2 "detokenize needs --tokens" -- detokenize
expect 2 "'x' is not a token id" -- detokenize --tokens=1,x
expect 2 "flag --text does not apply" -- detokenize --tokens=1 --text=a

for cmd in "generate --prompt=hi" "generate --token_ids=1,2 --json" "tokenize --text=hi" \
           "detokenize --tokens=1,2" "info" "info --json" "health" "health --service=kvrm.v1.Kvrm" \
           "reset-prefix-cache"; do
  # shellcheck disable=SC2086
  expect 1 "error: UNAVAILABLE: " -- $cmd --server=127.0.0.1:$CLOSED --timeout_s=10
done

# A peer that accepts TCP and never answers: the call hangs until a deadline or a signal.
PORT_FILE="${TEST_TMPDIR:-/tmp}/port"
rm -f "$PORT_FILE"
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
conns = []
while True:
    c, _ = s.accept(); conns.append(c)
' "$PORT_FILE" &
PEER=$!
for _ in $(seq 100); do [[ -s "$PORT_FILE" ]] && break; sleep 0.05; done
HANG="127.0.0.1:$(cat "$PORT_FILE")"

start=$(date +%s%N)
expect 1 "error: DEADLINE_EXCEEDED: " -- generate --prompt=hi --server="$HANG" --timeout_s=0.5
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
((elapsed_ms < 5000)) || fail "the 0.5 s deadline took ${elapsed_ms} ms"

for sig in INT TERM; do
  for cmd in "generate --prompt=hi" "health"; do
    # shellcheck disable=SC2086
    "$CLI" $cmd --server="$HANG" >"$OUT" 2>"$ERR" &
    pid=$!
    sleep 1
    kill -s "$sig" "$pid"
    wait "$pid"
    rc=$?
    [[ $rc == 130 ]] || fail "$cmd: SIG$sig gave exit $rc, want 130"
    grep -qx "interrupted" "$ERR" || fail "$cmd: SIG$sig: no 'interrupted' line"
  done
done
kill "$PEER"

if ((failures > 0)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "all kvrm_cli checks passed"
