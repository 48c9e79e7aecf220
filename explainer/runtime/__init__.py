"""The runtime half of the engine: hooks on backward and optimizer steps, and the analysis that
turns an autograd error into a Finding."""
