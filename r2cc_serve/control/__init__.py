"""Operator actions inside each rank: the control agent that drains, fails over and restores rails."""
