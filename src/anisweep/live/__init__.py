"""Analysis while a model trains: a Trainer callback (AnisweepCallback) or analyse_live in a hand-written
loop write a checkpoint's tables without saving weights; the workflow takes the steps they wrote.

`from anisweep.live import AnisweepCallback, ExtractSettings, GradientSettings` gives the callback and the two
settings it takes (anisweep.extract.model, anisweep.tangent.settings).
"""


def __getattr__(name: str):
    # `from anisweep.live import AnisweepCallback` without importing torch for the workflow's `take` step.
    if name in ("AnisweepCallback", "analyse_live"):
        from anisweep.live import callback

        return getattr(callback, name)
    if name == "ExtractSettings":
        from anisweep.extract.model import ExtractSettings

        return ExtractSettings
    if name == "GradientSettings":
        from anisweep.tangent.settings import GradientSettings

        return GradientSettings
    if name == "live_ident":
        from anisweep.live import take

        return take.live_ident
    raise AttributeError(f"module 'anisweep.live' has no attribute {name!r}")
