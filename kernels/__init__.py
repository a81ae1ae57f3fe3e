"""Specialized CPU kernels (installed as `sparta_explore.kernels`).

Code generation, the content-hash build cache and the block-sparse / int8 kernel
families land here with the kernels issue; the package exists now so that the
installed layout (`sparta_explore.kernels`) is fixed from the start.
"""
