"""Small helpers shared by the runtime and the test bed; leaf modules that import nothing of ours
but errors: priority (nice / real-time for control threads), percentile, rates (tc rate text),
durations (how a time span is printed), procfs (/proc/<pid>/stat), ports (a listener in a port range)."""
