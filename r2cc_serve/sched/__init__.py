"""Schedule planning: plans as data (ir), builders, lower bound and cost model, simulator, planner.

Pure Python and numpy; nothing here needs the C++ core. See ir.py for the executor contract.
"""
