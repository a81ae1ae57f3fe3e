"""Graph passes of the compile stage (see `sparta_explore.compile.passes.pipeline`)."""
