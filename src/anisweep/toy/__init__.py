"""The toy models the default config trains offline: tokenizers and the training loop."""
