"""Faults of the lab, each module named by its role:

    model.py      what a fault is: kinds, text forms (h0:1:down), validation, schedules (pure)
"""
