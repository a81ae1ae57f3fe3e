"""NNI: the trial command NNI runs (`trial`), our tuner (`tuner`), and experiments run and exported (`experiment`).

Nothing here is imported by the rest of the exploration package; NNI loads only here.

Example:
    >>> from sparta_explore.explore.nni.trial import merge_params
    >>> merge_params({"sparsity": 0.9}, {"objective": "flops"})
    {'objective': 'flops', 'sparsity': 0.9}
"""
