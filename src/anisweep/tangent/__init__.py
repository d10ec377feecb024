"""The gradient (tangent-alignment) analysis: one backward pass per analysed checkpoint (backward), the
shares of its gradients in subspaces fitted to the activations (shares, seminmf), subspaces held fixed from
an early window (fixed), the token-embedding change (embedding_change) and the per-model table (sweep).
"""
