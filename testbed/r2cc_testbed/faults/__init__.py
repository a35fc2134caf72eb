"""Faults of the lab, each module named by its role:

    model.py               what a fault is: kinds, text forms (h0:1:down), validation, schedules (pure)
    executor.py            FaultExecutor: apply and clear (idempotent), the one map from a kind to
                           kernel actions
    lab_executor.py        the lab's: `ip`, `tc` and `nft` commands, faults recorded in its state file
    inprocess_executor.py  the load test's: no command per change (namespace sockets, libnftables,
                           tc batch processes)
    schedule.py            timed faults: steps (a flap's downs and ups) played at their moments, and
                           faults held until undone whatever happens (bench, serving runs, load test)
"""
