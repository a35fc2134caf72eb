"""`r2cc bench`: r2cc vs torch gloo (one rail, a device per rail, MPTCP) vs Open MPI over the
same lab rails, fault-free and faulted.

Modules: spec (parse sizes/backends/faults), data (deterministic inputs, rank-order references),
backends (r2cc/gloo/mpi behind one interface), worker (one rank, run inside a lab host),
launch (start/kill ranks: `ip netns exec`, or mpirun + a netns wrapper), fault_handshake (inject
and clear lab faults on the workers' cue), results (percentiles, busbw, ratios, tables), expect
(T_LB and the simulator beside measured schedules), tcp_floor (a bare TCP ring for scale),
run (the driver), cli (`register(subparsers)`).
"""
