"""The latency-vs-FLOPs protocol: every search, same budget and start, judged on measured fronts.

`run` (run_protocol: the trials and visits), `judge` (hypervolumes, picks, goals),
`report` (report.md and fronts.png of a protocol folder).

Example:
    >>> from sparta_explore.explore.protocol.run import ProtocolConfig
    >>> ProtocolConfig(workload="digits-mlp", budget=4, startup=2).seeds
    (0, 1, 2)
"""
