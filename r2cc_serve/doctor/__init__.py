"""`r2cc doctor`: a preflight check of a deployment's rails (docs/doctor.md).

Modules: rails (which rails and peers, from the user's words), netinfo (what the kernel says:
interfaces, routes, ARP, /proc/sys), settings (the kernel settings r2cc relies on), wire (what
checker and responder say), responder (`--serve`), probes (the checker's probes), checks (the
verdicts and their fixes), report (the tables), cli. lab (`--lab`) belongs to the test bed.
"""
