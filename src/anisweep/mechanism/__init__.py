"""Mechanism analyses: the untrained-block experiment (Machina & Mercer) and the q/k SVD trajectories."""
