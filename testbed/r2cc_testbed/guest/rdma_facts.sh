#!/bin/bash
# Failure facts of the emulated RDMA guest's rails, measured with ibv_rc_pingpong (run inside:
# `r2cc lab guest run --rails 2 --timeout 900 -- bash testbed/r2cc_testbed/guest/rdma_facts.sh [TRIALS]`).
# Rail 0 carries an endless pingpong (server rank 0's rxe_a0, client rank 1's rxe_b0) while rail 1
# carries another; then rail 0's link goes down (each end in turn), or one peer is SIGKILLed.
# Prints per trial which side got an error and when, and whether rail 1 kept moving.
set -u
TRIALS=${1:-3}
IFS=, read -r A0 A1 <<< "$R2CC_GUEST_NETDEVS_A"; IFS=, read -r B0 B1 <<< "$R2CC_GUEST_NETDEVS_B"
IFS=, read -r IP0 IP1 <<< "$R2CC_GUEST_IPS_A"
G=$R2CC_GUEST_GID_INDEX W=/tmp/facts; mkdir -p $W
now() { date +%s.%N; }
ctr() { local v; read -r v < /sys/class/infiniband/$1/ports/1/hw_counters/$2; echo $v; }
listening() { local l a b st rest hex; hex=$(printf '%04X' $2)  # bash builtins: a fork costs ~0.2 s here
  for f in /proc/$1/net/tcp /proc/$1/net/tcp6; do
    while read -r l a b st rest; do [[ $a == *:$hex && $st == 0A ]] && return 0; done < $f 2>/dev/null; done; return 1; }
start() {  # start TAG RAIL: endless pingpong on RAIL; each side's log ends with "exit rc=N t=TIME"
  local tag=$1 r=$2 port=$((18700 + $1)) ip dev_a dev_b
  ip=$([ $r = 0 ] && echo $IP0 || echo $IP1); dev_a=rxe_a$r; dev_b=rxe_b$r
  ( exec ibv_rc_pingpong -d $dev_a -g $G -n 1000000000 -p $port > $W/s$tag 2>&1 ) & local sp=$!
  echo $sp > $W/s$tag.pid
  ( wait_exit() { while kill -0 $sp 2>/dev/null; do sleep 0.05; done; echo "exit t=$(now)" >> $W/s$tag; }; wait_exit ) &
  for i in $(seq 100); do listening $sp $port && break; sleep 0.2; done
  ( ibv_rc_pingpong -d $dev_b -g $G -n 1000000000 -p $port $ip > $W/c$tag 2>&1; echo "exit rc=$? t=$(now)" >> $W/c$tag ) &
  sleep 2
}
report() {  # report TAG T0 WHAT: each side's fate since T0
  local tag=$1 t0=$2 side line err
  for side in s c; do
    line=$(grep -h "^exit" $W/$side$tag); err=$(grep -h "Failed status" $W/$side$tag)
    if [ -n "$line" ]; then echo "    $([ $side = s ] && echo "rank 0 (server)" || echo "rank 1 (client)"): ended $(echo "${line##*t=} - $t0" | bc) s after: ${err:-no error line}"
    else echo "    $([ $side = s ] && echo "rank 0 (server)" || echo "rank 1 (client)"): no completion, no error"; fi
  done
}
stop_all() { pkill -9 ibv_rc_pingpong; sleep 0.5; }

echo "== link down on rail 0 while rails 0 and 1 carry pingpongs ($TRIALS trials per end; 15 s watch)"
n=0
for dev in $A0 $B0; do for t in $(seq $TRIALS); do
  n=$((n + 1)); start $n 0; start $((n + 50)) 1
  before=$(ctr rxe_a1 sent_pkts); ra=$(ctr rxe_a0 completer_retry_err); rb=$(ctr rxe_b0 completer_retry_err)
  t0=$(now); ip link set $dev down; sleep 15
  echo "  trial $n: $dev down"; report $n $t0
  echo "    rail 1 sent $(( $(ctr rxe_a1 sent_pkts) - before )) packets meanwhile; rail 0 retransmit timeouts" \
       "rank 0 +$(( $(ctr rxe_a0 completer_retry_err) - ra )), rank 1 +$(( $(ctr rxe_b0 completer_retry_err) - rb ))," \
       "retry_exceeded_err $(ctr rxe_a0 retry_exceeded_err)/$(ctr rxe_b0 retry_exceeded_err)"
  stop_all; ip link set $dev up
  for d in rxe_a0 rxe_b0; do for i in $(seq 100); do read -r s < /sys/class/infiniband/$d/ports/1/state; [[ $s == *ACTIVE ]] && break; sleep 0.2; done; done
done; done

echo "== SIGKILL of one peer on rail 0 (20 s watch)"
for side in s c; do
  n=$((n + 1)); start $n 0; t0=$(now)
  if [ $side = s ]; then kill -9 $(cat $W/s$n.pid); else pkill -9 -f "ibv_rc_pingpong -d rxe_b0 "; fi
  sleep 20; echo "  trial $n: $([ $side = s ] && echo "rank 0 (server)" || echo "rank 1 (client)") killed"; report $n $t0
  stop_all
done
