"""How a model becomes a graph: fx symbolic tracing, or torch.export normalized to look like fx.

`sparta_explore.capture` chooses; these modules do the work: `fx_trace` (tracer with clear
errors), `export` (torch.export, guards removed, ATen rewritten by `aten_table`, leaf
modules re-lifted by `relift`) and `inputs` (how example inputs bind to placeholders).
"""
