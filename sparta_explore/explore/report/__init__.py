"""What results become: Pareto fronts and hypervolumes (`pareto`), figures (`plots`), report.md (`sweep_report`).

Example:
    >>> from sparta_explore.explore.report.pareto import non_dominated
    >>> non_dominated([1, 2, 2, 3], [0.5, 0.9, 0.8, 0.9]).tolist()
    [True, True, False, False]
"""
