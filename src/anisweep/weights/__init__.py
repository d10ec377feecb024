"""A checkpoint's weights read tensor by tensor, without building the model: the sources (a local folder, a Hub
repository by range reads), the architecture's layout (which tensor is W_Q of layer l, the unembedding, the final
norm) and the view a weight measure gets (anisweep.weights.checkpoint)."""
