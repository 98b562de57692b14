#!/usr/bin/env bash
# scripts/netem: a 2-rank job on a 100 Mbit/s emulated link is limited by it, and the namespaces,
# links and bridge are gone afterwards, also when the job fails. Skips (exit 77, ctest SKIP) where
# this machine does not allow network namespaces (not root, or no netns/veth/tbf in the kernel).
#   tests/netem_test.sh SOURCE_DIR TRAINER_BINARY
set -uo pipefail
src="$1" trainer="$2"
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root for network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) not installed"
probe="nep$$"  # interface names hold at most 15 characters
ip netns add "$probe" 2>/dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
ip link add "${probe}a" type veth peer name "${probe}b" 2>/dev/null || skip "no veth pairs here"
tc qdisc add dev "${probe}a" root tbf rate 100mbit burst 64k latency 200ms 2>/dev/null ||
  { ip link del "${probe}a"; skip "no tbf qdisc in this kernel"; }
ip link del "${probe}a"

ours() { ip netns list | awk '{print $1}' | grep -E '^tn[0-9]+r[0-9]+$'; ip -o link show type bridge | grep -oE 'tnb[0-9]+'; }
before=$(ours | sort)
fail=0

# 1 MB allreduce on 2 ranks moves at least 1 MB each way per rank: at 100 Mbit/s (12.5 MB/s) that
# is at least 80 ms; unshaped it is a few ms. Require more than at 150 Mbit/s (53 ms).
out=$(OMP_NUM_THREADS=1 "$src/scripts/netem" --ranks 2 --bandwidth 100mbit -- "$trainer" bench comm --n 250000 \
  --steps 2 2>&1)
rc=$?
echo "$out" | tail -8
[[ $rc -eq 0 ]] || { echo "FAIL: netem job exited $rc"; fail=1; }
ms=$(echo "$out" | grep -o '"mpi":[0-9.]*' | cut -d: -f2)
if [[ -z "$ms" ]] || ! awk -v m="$ms" 'BEGIN { exit !(m > 53) }'; then
  echo "FAIL: 1 MB allreduce took '${ms}' ms; more than 53 ms expected at 100 Mbit/s"
  fail=1
fi

# A failing job: its exit status comes back and nothing is left behind.
"$src/scripts/netem" --ranks 2 --bandwidth 1gbit -- false >/dev/null 2>&1
rc=$?
[[ $rc -ne 0 ]] || { echo "FAIL: a failing job returned 0"; fail=1; }
# Bad arguments: one clear line, no setup.
msg=$("$src/scripts/netem" --ranks 2 --bandwidth fast -- true 2>&1)
[[ $? -eq 2 && "$msg" == *"--bandwidth"* ]] || { echo "FAIL: bad --bandwidth not reported: $msg"; fail=1; }

after=$(ours | sort)
[[ "$before" == "$after" ]] || { echo "FAIL: left behind: $(comm -13 <(echo "$before") <(echo "$after"))"; fail=1; }
[[ $fail -eq 0 ]] && echo "netem test passed (1 MB allreduce at 100 Mbit/s: $ms ms)"
exit $fail
