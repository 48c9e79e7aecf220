"""What to say about retain_graph=True, which PyTorch's message suggests and is usually wrong."""

RETAIN_GRAPH_GROWS = (
    "Don't add retain_graph=True: it would keep every earlier iteration's graph alive, so each "
    "backward goes through all of them (time and memory grow every iteration), and after "
    "optimizer.step() the old graph fails with 'modified by an inplace operation'."
)
RETAIN_GRAPH_NOT_THE_CAUSE = (
    "retain_graph has nothing to do with this error: the graph still exists, but a value it "
    "saved was overwritten."
)
RETAIN_GRAPH_AFTER_STEP = (
    "retain_graph=True is wrong here: the optimizer step between the two backward calls changed "
    "weights that the old graph saved, so reusing it raises 'modified by an inplace operation' "
    "(before PyTorch 1.5 it silently gave wrong gradients)."
)
